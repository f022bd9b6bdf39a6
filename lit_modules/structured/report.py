"""The structured family's card report (``litlab repro salaad``): val loss against parameter budget per run (mean ±
std over seeds) as a figure and a table, the learned rank ratios and densities per block as a heatmap, the derived
numbers the card's mechanism claims read, and the bytes of the exported models (``export``) against the dense one.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from litlab.lit_modules.core.results import CardResult, ReportExtras

CURVES = {  # label -> the card run whose fits log val/loss@<f>
    "SALAAD (HPA)": "salaad",
    "post-hoc (dense run)": "dense",
    "low-rank only (HPA)": "lowrank",
    "sparse only": "sparse",
}


def _per_seed(result: CardResult, run: str) -> dict[int, dict[str, float]]:
    if run not in result.runs:
        return {}
    return {r.seed: r.summary_metrics() for r in result.runs[run].runs}


def _budgets(metrics: dict[str, float]) -> list[float]:
    return sorted(float(k.split("@")[1]) for k in metrics if k.startswith("val/loss@"))


def derived_numbers(result: CardResult) -> dict[str, float]:
    """``salaad_drop_25``: the largest over seeds of SALAAD's loss at 25 % minus its full surrogate's;
    ``val_ratio_salaad_dense``: the largest over seeds of SALAAD's dense-X val loss over the dense baseline's."""
    out = {}
    salaad, dense = _per_seed(result, "salaad"), _per_seed(result, "dense")
    drops = [m["val/loss@0.25"] - m["val/loss@1"] for m in salaad.values() if "val/loss@0.25" in m]
    if drops:
        out["salaad_drop_25"] = max(drops)
    ratios = [
        m["val/loss"] / dense[s]["val/loss"] for s, m in salaad.items() if s in dense and "val/loss" in m
    ]
    if ratios:
        out["val_ratio_salaad_dense"] = max(ratios)
    full = [m["capacity/full_fraction"] for m in salaad.values() if "capacity/full_fraction" in m]
    if full:
        out["salaad_full_fraction_mean"] = statistics.fmean(full)
    return out


def _curve_table(result: CardResult) -> tuple[list[str], dict[str, dict[float, list[float]]]]:
    curves: dict[str, dict[float, list[float]]] = {}
    for label, run in CURVES.items():
        for metrics in _per_seed(result, run).values():
            for f in _budgets(metrics):
                curves.setdefault(label, {}).setdefault(f, []).append(metrics[f"val/loss@{f:g}"])
    budgets = sorted({f for c in curves.values() for f in c}, reverse=True)
    rows = ["| run | " + " | ".join(f"{f:g}" for f in budgets) + " |", "|---|" + "---|" * len(budgets)]
    for label, c in curves.items():
        cells = []
        for f in budgets:
            v = c.get(f, [])
            cells.append(
                f"{statistics.fmean(v):.4f} ± {statistics.stdev(v):.4f} (n={len(v)})"
                if len(v) > 1
                else (f"{v[0]:.4f} (n=1)" if v else "—")
            )
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows, curves


def _heatmap(result: CardResult, out_dir: Path, plt) -> Path | None:
    metrics = next(iter(_per_seed(result, "salaad").values()), {})
    names = sorted(k.removeprefix("salaad/rank/") for k in metrics if k.startswith("salaad/rank/"))
    if not names:
        return None
    import numpy as np

    data = np.array(
        [[metrics[f"salaad/rank/{n}"] for n in names], [metrics[f"salaad/density/{n}"] for n in names]]
    )
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(names)), 2.4))
    im = ax.imshow(data, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
    ax.set_yticks([0, 1], ["rank ratio q/min(m,n)", "density nnz(S)/mn"], fontsize=8)
    for (i, j), v in np.ndenumerate(data):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="w")
    fig.colorbar(im, ax=ax)
    ax.set_title(f"SALAAD learned structure at the last refresh (seed {result.runs['salaad'].runs[0].seed})")
    fig.tight_layout()
    path = out_dir / "salaad_structure.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _export_bytes(result: CardResult, out_dir: Path) -> tuple[list[str], dict[str, float]]:
    """Export the first seed's SALAAD and dense checkpoints at 0.25 and 0.15 and measure the files."""
    from litlab.lit_modules.structured.export import export

    rows, numbers = [], {}
    for run in ("salaad", "dense"):
        if run not in result.runs:
            continue
        ckpt = result.runs[run].runs[0].run_dir / "checkpoints" / "last.ckpt"
        if not ckpt.is_file():
            continue
        for rec in export(ckpt, [0.25, 0.15], out_dir / "export" / run):
            tag = f"{run}_{rec['budget']:g}".replace(".", "")
            numbers[f"bytes_ratio_{tag}"] = rec["factored_bytes_ratio"]
            numbers[f"resident_ratio_{tag}"] = rec["resident_ratio"]
            numbers[f"peak_ratio_{tag}"] = rec["peak_ratio"]
            rows.append(
                f"| {run} | {rec['budget']:g} | {rec['source']} | {rec['total_params']} / {rec['dense_total_params']} "
                f"| {rec['factored_bytes']} / {rec['dense_bytes']} = {rec['factored_bytes_ratio']:.3f} "
                f"| {rec['factored_resident_bytes']} / {rec['dense_resident_bytes']} = {rec['resident_ratio']:.3f} "
                f"| {rec['factored_peak_bytes']} / {rec['dense_peak_bytes']} = {rec['peak_ratio']:.3f} |"
            )
    return rows, numbers


def report(result: CardResult, out_dir: Path) -> ReportExtras:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    numbers = derived_numbers(result)
    rows, curves = _curve_table(result)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for label, c in curves.items():
        fs = sorted(c)
        means = [statistics.fmean(c[f]) for f in fs]
        stds = [statistics.stdev(c[f]) if len(c[f]) > 1 else 0.0 for f in fs]
        ax.errorbar(fs, means, yerr=stds, marker="o", capsize=3, label=label)
    dense = [m["val/loss"] for m in _per_seed(result, "dense").values() if "val/loss" in m]
    if dense:
        ax.axhline(statistics.fmean(dense), color="k", ls="--", lw=1, label="dense model (uncompressed)")
    ax.set_xlabel("budget (fraction of the blocks' dense parameters)")
    ax.set_ylabel("val loss (nats/char)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    curve_path = out_dir / "salaad_loss_vs_budget.png"
    fig.savefig(curve_path, dpi=110)
    plt.close(fig)
    figures = [curve_path]
    heat = _heatmap(result, out_dir, plt)
    if heat is not None:
        figures.append(heat)
    try:
        byte_rows, byte_numbers = _export_bytes(result, out_dir)
    except Exception as err:  # the report still shows the curves
        byte_rows, byte_numbers = [f"| export failed: {type(err).__name__}: {err} | | | | | | |"], {}
    numbers.update(byte_numbers)
    numbers = {k: v for k, v in numbers.items() if not math.isnan(v)}
    markdown = "\n".join(
        [
            "## Val loss against parameter budget (mean ± std over seeds)",
            "",
            *rows,
            "",
            "## Exported models (first seed): counted parameters, bytes of factored.safetensors, and measured",
            "## inference memory of the factored model (run as factors) vs the dense model",
            "",
            "Memory: PyTorch allocator bytes (profiler, `profile_memory=True`) held after loading (resident) and at",
            "the peak of one no-grad forward of a 1 x context-length prompt (weights + activations).",
            "",
            "| run | budget | deployment | parameters (deployed / dense) | file bytes (factored / dense) "
            "| resident bytes | peak inference bytes |",
            "|---|---|---|---|---|---|---|",
            *byte_rows,
        ]
    )
    return ReportExtras(figures=figures, markdown=markdown, numbers=numbers)
