"""The long-context family's report helpers: what the ``xkv`` and ``sale`` cards add to their reports.

A card's hook (``litlab.lit_modules.longctx.xkv:report``, ``...sale:report``) is called by ``litlab repro`` as
``hook(result: CardResult, out_dir: Path) -> ReportExtras`` and delegates here. Every helper reads each run's final
logged metrics through ``SeedRun.summary_metrics()``, averaged over the card's seeds (one model per seed).
"""

from __future__ import annotations

from pathlib import Path

from litlab.lit_modules.core.results import CardResult, ReportExtras

NAN = float("nan")


def run_metrics(result: CardResult) -> dict[str, dict[str, float]]:
    """``{card entry: {metric: mean over seeds}}`` (entries sharing runs are all listed; a metric missing from a
    seed is averaged over the seeds that logged it)."""
    out = {}
    for name, run in result.runs.items():
        per_seed = [
            {k: float(v) for k, v in r.summary_metrics().items()} for r in run.runs
        ]  # non-finite values are strings
        keys = {k for m in per_seed for k in m}
        out[name] = {k: sum(m[k] for m in per_seed if k in m) / sum(k in m for m in per_seed) for k in keys}
    return out


def acc_vs_cr_report(result: CardResult, out_dir: Path) -> ReportExtras:
    """xKV: accuracy vs compression ratio per run (a scatter plot, log x, and a table), and per model (tiny: runs
    without a prefix, SmolLM2: ``smol_``) the highest CR that single-layer SVD (runs named ``svd``) and xKV (``xkv``
    without ``sr``) reach within one point of that model's dense accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = run_metrics(result)
    numbers: dict[str, float] = {}
    lines = [
        "| run | acc | CR | CR_inf | recon err K/V | tokens reconstructed |",
        "|---|---|---|---|---|---|",
    ]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for prefix, marker in (("", "o"), ("smol_", "s")):
        names = [n for n in rows if n.startswith("smol_") == bool(prefix)]
        dense = rows.get(f"{prefix}dense", {}).get("val/acc")
        best = {"svd": 0.0, "xkv": 0.0}
        for n in names:
            m = rows[n]
            acc, cr = m.get("val/acc", NAN), m.get("val/compression_ratio", NAN)
            numbers[f"{n}_acc"], numbers[f"{n}_cr"] = acc, cr
            if "val/tokens_reconstructed_frac" in m:
                numbers[f"{n}_tokens_reconstructed_frac"] = m["val/tokens_reconstructed_frac"]
            ax.scatter(cr, acc, marker=marker)
            ax.annotate(n, (cr, acc), fontsize=6)
            lines.append(
                f"| {n} | {acc:.3f} | {cr:.2f} | {m.get('val/cr_inf', NAN):.1f} | "
                f"{m.get('val/recon_rel_err_k', NAN):.3f}/{m.get('val/recon_rel_err_v', NAN):.3f}"
                f" | {m.get('val/tokens_reconstructed_frac', NAN):.3f} |"
            )
            kind = "svd" if "svd" in n else ("xkv" if "xkv" in n and "sr" not in n else None)
            if kind and dense is not None and acc >= dense - 0.01:
                best[kind] = max(best[kind], cr)
        if dense is not None:
            numbers[f"{prefix}best_cr_within_1pt_svd"] = best["svd"]
            numbers[f"{prefix}best_cr_within_1pt_xkv"] = best["xkv"]
    ax.set_xscale("log")
    ax.set_xlabel("compression ratio (dense K+V / stored elements, log scale)")
    ax.set_ylabel("passkey accuracy")
    ax.set_title("xKV: accuracy vs compression (o tiny, s SmolLM2)")
    fig.tight_layout()
    path = out_dir / "xkv_acc_vs_cr.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return ReportExtras(figures=[path], markdown="\n".join(lines), numbers=numbers)


def density_report(result: CardResult) -> ReportExtras:
    """SALE: accuracy, block density and attention output error of every run (dense runs log no density: 1.0,
    error 0.0). CPU timing is a benchmark, not part of the card: ``litlab bench sale_prefill``."""
    numbers: dict[str, float] = {}
    lines = ["| run | acc | density | attn out rel err |", "|---|---|---|---|"]
    for name, m in run_metrics(result).items():
        numbers[f"{name}_acc"] = m.get("val/acc", NAN)
        numbers[f"{name}_density"] = m.get("val/density", 1.0)
        numbers[f"{name}_out_err"] = m.get("val/attn_out_rel_err", 0.0)
        lines.append(
            f"| {name} | {numbers[f'{name}_acc']:.3f} | {numbers[f'{name}_density']:.3f} | "
            f"{numbers[f'{name}_out_err']:.4f} |"
        )
    return ReportExtras(markdown="\n".join(lines), numbers=numbers)
