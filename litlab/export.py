"""``litlab export``: deploy a trained checkpoint at parameter budgets as Hugging Face-loadable models.

    litlab export --ckpt runs/salaad/<run>/checkpoints/last.ckpt --budget 0.25,0.15 --out model/

A budget is a fraction of the selected blocks' dense parameters (the q/k/v/o/gate/up/down matrices; embeddings,
norms and head are kept and not counted in it). A checkpoint trained with SALAAD is deployed by Homomorphic
Parameter Allocation on its (L, S); a dense one is compressed post hoc (truncated SVD + top entries of the
residual). Each budget goes to ``<out>/budget_<f>/`` (``config.json`` + ``model.safetensors`` for
``AutoModelForCausalLM.from_pretrained``, ``factored.safetensors``, ``deploy.json``); ``<out>/dense/`` is the
checkpoint's own model. The table printed gives each budget's peak inference memory (PyTorch allocator bytes of
one forward, the factored model run as factors) against the dense model's. See
``litlab.lit_modules.structured.export`` and ``footprint``.
"""

from __future__ import annotations

import argparse


def parse_budgets(text: str) -> list[float]:
    try:
        budgets = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"--budget {text!r}: comma-separated fractions, e.g. 0.25,0.15"
        ) from err
    if not budgets or any(not 0.0 <= b <= 1.0 for b in budgets):
        raise argparse.ArgumentTypeError(f"--budget {text!r}: every budget must lie in [0, 1]")
    return budgets


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="litlab export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", required=True, help="a DecoderLM / SALAADLM checkpoint (last.ckpt)")
    parser.add_argument(
        "--budget", required=True, type=parse_budgets, help="fractions, e.g. 1.0,0.6,0.25,0.15"
    )
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument(
        "--posthoc-density", type=float, default=0.05, help="S density of post-hoc compression"
    )
    args = parser.parse_args(argv)
    import torch

    from litlab.lit_modules.structured.export import export

    torch.set_num_threads(min(torch.get_num_threads(), 4))
    records = export(args.ckpt, args.budget, args.out, posthoc_density=args.posthoc_density)
    print(
        f"| budget | deployment | block params (fraction) | total params (dense {records[0]['dense_total_params']}) "
        "| factored bytes / dense bytes | peak inference bytes, factored / dense | folder |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r['budget']:g} | {r['source']} | {r['block_params']} ({r['block_fraction']:.4f}) | {r['total_params']} "
            f"| {r['factored_bytes']} / {r['dense_bytes']} = {r['factored_bytes_ratio']:.3f} "
            f"| {r['factored_peak_bytes']} / {r['dense_peak_bytes']} = {r['peak_ratio']:.3f} "
            f"| {args.out}/budget_{r['budget']:g} |"
        )
    return 0
