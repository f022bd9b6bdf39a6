"""xKV's decode against the dense KV cache: per-token decode latency, prefill (with the compression), the cache's
compression ratio and peak memory, on a random ``LlamaForCausalLM`` with Llama-3.1-8B's layer shapes.

    litlab bench xkv_decode --device cuda --lengths 4096 16384 32768 [--layers 8] [--json out.json]
    litlab bench xkv_decode --device cpu --tiny --lengths 256        # the table code on the CPU (numbers mean little)

Each method runs ``greedy_generate`` (the harness's path: prefill, ``after_prefill`` compression, greedy decode) on
the same random prompt. ``--layers`` keeps the benchmark inside one GPU's time budget: latencies scale with the
layer count (8 of Llama-3.1-8B's 32 layers by default), ratios do not. Weights are random: the tokens mean nothing,
the timings are those of the real shapes. xKV's plan: the card's xKV-4 (group 4, rank_k 384, rank_v 576) and the
selective variant (xkv_sr, ShadowKV's budget of 2048 tokens in chunks of 8).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import transformers

from litlab.lit_modules.longctx.kv_cache import greedy_generate
from litlab.lit_modules.longctx.xkv import CompressionPlan, SelectiveReconstruction, make_method

METHODS = ("dense", "xkv", "xkv_sr")


def random_llama(layers: int, tiny: bool, device: str, dtype: torch.dtype) -> transformers.LlamaForCausalLM:
    """Llama-3.1-8B's layer (4096 wide, 32 query / 8 KV heads of 128, MLP 14336) or, ``tiny``, a 64-wide one."""
    shape = (
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
        )
        if tiny
        else dict(
            hidden_size=4096,
            intermediate_size=14336,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
        )
    )
    config = transformers.LlamaConfig(
        **shape, num_hidden_layers=layers, max_position_embeddings=131072, rope_theta=500000.0
    )
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(config).to(dtype).eval()


def run(method: str, model, length: int, new_tokens: int, tiny: bool) -> dict:
    plan = CompressionPlan(group_size=4, rank_k=8 if tiny else 384, rank_v=12 if tiny else 576)
    sr = SelectiveReconstruction(sparse_budget=64 if tiny else 2048, chunk_size=8, local_chunks=4)
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=generator).to(device)
    out = greedy_generate(model, make_method(method, plan, sr), ids, None, new_tokens)
    metrics = {k: float(v) for k, v in out["metrics"].items() if isinstance(v, (int, float))}
    return {
        "method": method,
        "length": length,
        "prefill_ms": out["prefill_ms"],
        "decode_ms_per_token": out["decode_ms_per_token"],
        "peak_mem_mb": out["peak_mem_mb"],
        "compression_ratio": metrics.get("compression_ratio", 1.0),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="litlab bench xkv_decode", description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    p.add_argument("--layers", type=int, default=8, help="decoder layers (Llama-3.1-8B has 32)")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--tiny", action="store_true", help="a 64-wide model (the CPU smoke run)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = random_llama(args.layers, args.tiny, args.device, dtype)
    rows = []
    print("| tokens | method | decode ms/token | vs dense | prefill ms | compression | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for length in args.lengths:
        dense_ms = None
        for method in METHODS:
            r = run(method, model, length, args.new_tokens, args.tiny)
            dense_ms = r["decode_ms_per_token"] if method == "dense" else dense_ms
            r["decode_vs_dense"] = r["decode_ms_per_token"] / dense_ms if dense_ms else float("nan")
            rows.append(r)
            print(
                f"| {length} | {method} | {r['decode_ms_per_token']:.2f} | {r['decode_vs_dense']:.2f} "
                f"| {r['prefill_ms']:.1f} | {r['compression_ratio']:.2f} | {r['peak_mem_mb']:.0f} |",
                flush=True,
            )
    if args.json:
        device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
        record = {
            "device": device,
            "layers": args.layers,
            "dtype": str(dtype),
            "rows": rows,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        args.json.write_text(json.dumps(record, indent=2))
    return 0
