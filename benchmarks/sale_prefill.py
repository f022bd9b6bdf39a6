"""``litlab bench sale_prefill``: SALE's prefill attention against dense SDPA on the CPU, one layer.

SALE (low-bit estimation for sparse attention in long-context prefilling, arXiv 2505.24179): quantise + select
blocks, then the block-skipping gathered attention (the reference path; the Triton kernel needs a GPU), against
``dense_causal_attention`` on the same ``sink_needle_inputs``. Prints a markdown table; the ratios come from one
run on one machine and are not a claim of the card.

    litlab bench sale_prefill [--lengths 4096 8192 16384] [--tau 0.01]
"""

from __future__ import annotations

import argparse
import time

from litlab.kernels.block_sparse_attention import block_sparse_attention_gathered, dense_causal_attention
from litlab.lit_modules.longctx.sale import SALEConfig, block_density, sale_block_mask, sink_needle_inputs


def cpu_prefill_timing(
    lengths=(4096, 8192, 16384), H: int = 2, d: int = 64, tau: float = 0.01, seed: int = 1
):
    """Attention-level CPU timing (one layer, ``sink_needle_inputs``): dense SDPA vs SALE's reference path
    (quantise + select, then the block-skipping gathered attention). Ratios come from one run on one machine."""
    cfg = SALEConfig(impl="reference")
    out = {}
    for n in lengths:
        q, k, v = (t[None] for t in sink_needle_inputs(H, n, d, n_needles=n // 16, seed=seed))
        t0 = time.perf_counter()
        ref = dense_causal_attention(q, k, v)
        t1 = time.perf_counter()
        mask, k_s = sale_block_mask(q, k, tau, cfg)
        t2 = time.perf_counter()
        o = block_sparse_attention_gathered(q, k_s, v, mask, cfg.block_q, cfg.block_k)
        t3 = time.perf_counter()
        dense_s, select_s, sparse_s = t1 - t0, t2 - t1, t3 - t2
        out[n] = {
            "dense_s": dense_s,
            "select_s": select_s,
            "sparse_s": sparse_s,
            "density": block_density(mask, n, cfg.block_q, cfg.block_k),
            "sale_over_dense": (select_s + sparse_s) / dense_s,
            "overhead_frac": select_s / dense_s,
            "rel_err": float((o - ref).norm() / ref.norm()),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="litlab bench sale_prefill", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--tau", type=float, default=0.01)
    args = p.parse_args(argv)
    print("| N | dense s | select s | sparse s | density | (select+sparse)/dense | select/dense | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    for n, r in cpu_prefill_timing(tuple(args.lengths), tau=args.tau).items():
        print(
            f"| {n} | {r['dense_s']:.2f} | {r['select_s']:.2f} | {r['sparse_s']:.2f} | {r['density']:.3f} "
            f"| {r['sale_over_dense']:.2f} | {r['overhead_frac']:.2f} | {r['rel_err']:.2e} |"
        )
    return 0
