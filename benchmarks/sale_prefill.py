"""``litlab bench sale_prefill``: SALE's prefill against dense SDPA and the pooled baseline, in one process, interleaved.

SALE (low-bit estimation for sparse attention in long-context prefilling, arXiv 2505.24179). Per length, on the same
``sink_needle_inputs`` (one layer, ``--heads`` heads, d = 64), each repetition times in turn: dense causal SDPA;
SALE's estimate (smoothing + 4-bit quantisation, then the block selection: on the CPU the default int8-product
form, ``kernels/block_select_cpu.py``, and the fp32 PyTorch reference, which gives the same mask up to fp32
rounding) and its sparse computation pass; the pooled baseline's selection (same reserved blocks, mean-pooled
ranking at SALE's density) and its sparse pass. Medians over ``--reps`` repetitions after one warm-up call per length (which
also compiles; its time is reported as ``first_call_s``). Sparse pass: the compiled ``flex_attention`` on the CPU,
the Triton kernels on CUDA (``--device cuda``). ``--smollm2``: also the whole-model prefill of one SmolLM2-135M
prompt (``--smollm2-len`` tokens, official 64x32 blocks, tau 0.1), interleaved: dense as the project's ``sdpa`` runs
it (Hugging Face's SDPA attention), dense through SALE's hook (torch SDPA with ``is_causal``), and SALE.

    litlab bench sale_prefill [--lengths 4096 8192 16384 32768] [--tau 0.1] [--threads 1] [--smollm2] [--json out.json]

The default tau is the card's (``seeds/sale.yaml``: SALE at tau 0.1, the method of every accuracy claim); the
timings before 2026-12-06 were at tau 0.01.

Times are process CPU seconds on the CPU (load from other processes on a shared machine does not stretch them as
it stretches wall time; run with ``--threads 1`` there), wall seconds on CUDA; the SmolLM2 part also records wall
time. The ratios come from one run on one machine: ``--json`` records the load average, threads and CPU with them. They are not a claim of the card.
"""

# ruff: noqa: B023  (each timed lambda is called at once, inside its loop iteration)
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from litlab.kernels.block_select import block_select_reference, quant_qk_block_select, smooth_quantize
from litlab.kernels.block_sparse_attention import block_sparse_attention, dense_causal_attention
from litlab.lit_modules.longctx.sale import SALEConfig, block_density, sink_needle_inputs
from litlab.lit_modules.longctx.sale_baselines import pooled_block_mask, pooled_keep_counts


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device):
    """(result, seconds): process CPU time on the CPU (a shared machine's load does not stretch it; with one torch
    thread it is the op's own time), wall-clock time on CUDA."""
    _sync(device)
    cuda = torch.device(device).type == "cuda"
    t = time.perf_counter() if cuda else time.process_time()
    out = fn()
    _sync(device)
    return out, (time.perf_counter() if cuda else time.process_time()) - t


def attention_timing(
    n: int,
    H: int = 4,
    d: int = 64,
    tau: float = 0.01,
    reps: int = 3,
    device: str = "cpu",
    seed: int = 1,
    dtype: torch.dtype = torch.float32,
) -> dict:
    """One layer at ``n`` tokens: medians of each piece (seconds), ratios to dense, densities and output errors."""
    sel_impl, sparse_impl = ("triton", "triton") if device == "cuda" else ("int8", "flex")
    cfg = SALEConfig(impl=sel_impl)
    q, k, v = (t[None].to(device, dtype) for t in sink_needle_inputs(H, n, d, n_needles=n // 16, seed=seed))

    def sale_select():
        quant = smooth_quantize(q, k, cfg.bits)
        return quant_qk_block_select(q, *quant, tau, impl=sel_impl, **cfg.blocks()), quant

    def sparse(mask, k_s):
        return block_sparse_attention(q, k_s, v, mask, cfg.block_q, cfg.block_k, impl=sparse_impl)

    t0 = time.perf_counter()  # warm-up: compiles flex_attention (CPU) / the kernels (GPU) for this shape
    (mask, quant) = sale_select()
    sparse(mask, quant[0])
    cpu = device == "cpu"
    if cpu:
        block_select_reference(q, *quant, tau, **cfg.blocks())
    first_call_s = time.perf_counter() - t0
    times: dict[str, list[float]] = {}
    for _ in range(reps):
        ref, t = _timed(lambda: dense_causal_attention(q, k, v), device)
        times.setdefault("dense_s", []).append(t)
        quant, t = _timed(lambda: smooth_quantize(q, k, cfg.bits), device)
        times.setdefault("quant_s", []).append(t)
        mask, t = _timed(lambda: quant_qk_block_select(q, *quant, tau, impl=sel_impl, **cfg.blocks()), device)
        times.setdefault("select_s", []).append(t)
        o, t = _timed(lambda: sparse(mask, quant[0]), device)
        times.setdefault("sparse_s", []).append(t)
        if cpu:
            mask_ref, t = _timed(lambda: block_select_reference(q, *quant, tau, **cfg.blocks()), device)
            times.setdefault("select_reference_s", []).append(t)
        pmask, t = _timed(lambda: pooled_block_mask(q, k, pooled_keep_counts(mask, n, cfg), cfg), device)
        times.setdefault("pooled_select_s", []).append(t)
        op, t = _timed(lambda: sparse(pmask.to(device), quant[0]), device)
        times.setdefault("pooled_sparse_s", []).append(t)
    r = {key: statistics.median(val) for key, val in times.items()}
    sale_s = r["quant_s"] + r["select_s"] + r["sparse_s"]
    r.update(
        n=n,
        heads=H,
        head_dim=d,
        tau=tau,
        dtype=str(dtype).removeprefix("torch."),
        first_call_s=first_call_s,
        density=block_density(mask, n, cfg.block_q, cfg.block_k),
        pooled_density=block_density(pmask, n, cfg.block_q, cfg.block_k),
        sale_over_dense=sale_s / r["dense_s"],
        sparse_over_dense=r["sparse_s"] / r["dense_s"],
        estimate_share=(r["quant_s"] + r["select_s"]) / sale_s,  # of SALE's whole prefill attention
        pooled_over_dense=(r["pooled_select_s"] + r["pooled_sparse_s"]) / r["dense_s"],
        rel_err=float((o.float() - ref.float()).norm() / ref.float().norm()),
        pooled_rel_err=float((op.float() - ref.float()).norm() / ref.float().norm()),
    )
    if cpu:
        r["reference_mask_equal"] = bool(torch.equal(mask_ref, mask))
        r["sale_reference_select_over_dense"] = (r["quant_s"] + r["select_reference_s"] + r["sparse_s"]) / r[
            "dense_s"
        ]
    return r


def smollm2_prefill_timing(length: int = 2048, tau: float = 0.1, reps: int = 2) -> dict:
    """Whole-model prefill of one SmolLM2-135M prompt (~``length`` tokens): dense SDPA vs SALE (official blocks,
    every layer), interleaved, after one warm-up prefill each."""
    from litlab.datamodules.long_context import LongContextDataModule
    from litlab.lit_modules.longctx.harness import FrozenLM, load_frozen_lm
    from litlab.lit_modules.longctx.kv_cache import greedy_generate
    from litlab.lit_modules.longctx.sale import SALEMethod

    model, _ = load_frozen_lm(FrozenLM("smollm2"))
    dm = LongContextDataModule(vocab="smollm2", lengths=[length], num_prompts=1, needle="secret_number")
    it = dm.prompts("val")[0]  # the prompt of the run seed (PL_GLOBAL_SEED, else 0)
    ids = torch.cat([it["context_ids"], it["query_ids"]])[None]
    methods = {
        "dense": SALEMethod("sdpa"),  # the project's dense run (attn: sdpa): Hugging Face's SDPA attention
        # the same hook as SALE with every layer dense: torch SDPA with is_causal (the flash kernel, no mask tensor)
        "dense_causal": SALEMethod("sale", min_seq_len=1 << 30, measure_error=False),
        "sale": SALEMethod("sale", SALEConfig(), tau, min_seq_len=0, measure_error=False),
    }
    out: dict = {"tokens": int(ids.shape[1]), "tau": tau}
    t0 = time.perf_counter()
    for m in methods.values():
        greedy_generate(model, m, ids, None, 1)
    out["first_calls_s"] = time.perf_counter() - t0
    times: dict[str, list[float]] = {}
    with torch.no_grad():
        for _ in range(reps):
            for name, m in methods.items():
                t_cpu = time.process_time()
                res = greedy_generate(model, m, ids, None, 1)  # prefill + the first token's argmax
                times.setdefault(f"{name}_prefill_s", []).append(time.process_time() - t_cpu)
                times.setdefault(f"{name}_prefill_wall_s", []).append(res["prefill_ms"] / 1e3)
                if name == "sale":
                    met = res["metrics"]
                    out["density"] = met["density"]
                    # the module's per-layer stats are wall-clock (perf_counter) seconds
                    times.setdefault("sale_select_s", []).append(sum(s["select_s"] for s in m.stats))
                    times.setdefault("sale_attn_s", []).append(sum(s["attn_s"] for s in m.stats))
    out.update({key: statistics.median(val) for key, val in times.items()})
    out["sale_over_dense"] = out["sale_prefill_s"] / out["dense_prefill_s"]
    out["sale_over_dense_causal"] = out["sale_prefill_s"] / out["dense_causal_prefill_s"]
    return out


def machine() -> dict:
    return {
        "threads": torch.get_num_threads(),
        "loadavg_start": list(os.getloadavg()),
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="litlab bench sale_prefill", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    p.add_argument("--tau", type=float, default=0.1, help="SALE's threshold (default: the card's)")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="q, k, v dtype (the paper's GPU setting is half precision)",
    )
    p.add_argument("--smollm2", action="store_true", help="also time one SmolLM2 prompt's whole prefill")
    p.add_argument("--smollm2-len", type=int, default=2048)
    p.add_argument("--json", type=Path, default=None, help="write every number here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    record: dict = {
        "machine": machine(),
        "attention": [],
        "command": "litlab bench sale_prefill " + " ".join(argv or []),
    }
    print(
        "| N | dense s | quant+select s | sparse s | density | (select+sparse)/dense | estimate share "
        "| pooled/dense | reference select s | rel err | pooled rel err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.lengths:
        r = attention_timing(
            n, args.heads, tau=args.tau, reps=args.reps, device=args.device, dtype=getattr(torch, args.dtype)
        )
        record["attention"].append(r)
        print(
            f"| {n} | {r['dense_s']:.3f} | {r['quant_s'] + r['select_s']:.3f} | {r['sparse_s']:.3f} "
            f"| {r['density']:.3f} | {r['sale_over_dense']:.2f} | {r['estimate_share']:.2f} "
            f"| {r['pooled_over_dense']:.2f} | {r.get('select_reference_s', float('nan')):.3f} | {r['rel_err']:.2e} "
            f"| {r['pooled_rel_err']:.2e} |",
            flush=True,
        )
    if args.smollm2:
        s = smollm2_prefill_timing(args.smollm2_len, args.tau)
        record["smollm2"] = s
        print(
            f"\nSmolLM2-135M, one {s['tokens']}-token prompt, whole prefill: dense (HF sdpa) "
            f"{s['dense_prefill_s']:.2f} s, dense (SDPA is_causal) {s['dense_causal_prefill_s']:.2f} s, SALE "
            f"{s['sale_prefill_s']:.2f} s (x{s['sale_over_dense']:.2f} / x{s['sale_over_dense_causal']:.2f}; "
            f"density {s['density']:.3f}; CPU s. The module's own wall-clock stats: selection "
            f"{s['sale_select_s']:.2f} s, sparse attention {s['sale_attn_s']:.2f} s)"
        )
    record["machine"]["loadavg_end"] = list(os.getloadavg())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1))
    return 0
