"""The structured family's card report (``litlab repro salaad``): val loss against parameter budget per run (mean ±
std over seeds) as a figure and a table, the learned rank ratios and densities per block as a heatmap, the derived
numbers of SALAAD's runs, and the bytes of the exported models (``export``) against the dense one.

A run is told apart by the structure its run folder's ``config.yaml`` says it trained (``model.init_args.admm``:
``null`` for the dense model, else its ``components``; ``model.init_args.adhoc`` set: an ad-hoc model trained for
one budget), never by the card's run names.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from litlab.lit_modules.core.results import CardResult, ReportExtras, RunResult

DEPLOYMENT = {  # structure -> how CapacitySweep deploys it at a budget
    "dense": "post-hoc compression",
    "both": "SALAAD, HPA",
    "low_rank": "low-rank only, HPA",
    "sparse": "sparse only",
    "adhoc low_rank": "ad-hoc low-rank, trained for one budget",
    "adhoc sparse": "ad-hoc sparse, trained for one budget",
}


def structure(run: RunResult) -> str:
    """``dense`` (no ADMM), the ADMM's ``components`` (``both``, ``low_rank``, ``sparse``) or ``adhoc <components>``
    (an ad-hoc model trained for one budget), from the run's first seed's saved config."""
    init_args = run.runs[0].config()["model"]["init_args"]
    admm, adhoc = init_args.get("admm"), init_args.get("adhoc")
    if adhoc is not None:
        return f"adhoc {adhoc.get('components', 'low_rank')}"
    return "dense" if admm is None else admm.get("components", "both")


def runs_by_structure(result: CardResult) -> dict[str, list[str]]:
    """``{structure: [card entries]}`` over the distinct runs (entries reading another metric of one fit once)."""
    out: dict[str, list[str]] = {}
    for name, run in result.distinct_runs():
        out.setdefault(structure(run), []).append(name)
    return out


def _per_seed(result: CardResult, run: str) -> dict[int, dict[str, float]]:
    return {r.seed: r.summary_metrics() for r in result.runs[run].runs}


def _budgets(metrics: dict[str, float]) -> list[float]:
    return sorted(float(k.split("@")[1]) for k in metrics if k.startswith("val/loss@"))


def derived_numbers(result: CardResult) -> dict[str, float]:
    """For each SALAAD run (``both`` components) ``<run>``: ``<run>_drop_25``, the largest over seeds of its loss at
    25 % minus its full surrogate's; ``val_ratio_<run>_<dense>``, the largest over seeds of its dense-X val loss over
    each dense run's; ``<run>_full_fraction_mean``, HPA's full surrogate as a fraction of the dense blocks."""
    out = {}
    by_structure = runs_by_structure(result)
    for name in by_structure.get("both", []):
        salaad = _per_seed(result, name)
        drops = [m["val/loss@0.25"] - m["val/loss@1"] for m in salaad.values() if "val/loss@0.25" in m]
        if drops:
            out[f"{name}_drop_25"] = max(drops)
        for dense_name in by_structure.get("dense", []):
            dense = _per_seed(result, dense_name)
            ratios = [
                m["val/loss"] / dense[s]["val/loss"]
                for s, m in salaad.items()
                if s in dense and "val/loss" in m
            ]
            if ratios:
                out[f"val_ratio_{name}_{dense_name}"] = max(ratios)
        full = [m["capacity/full_fraction"] for m in salaad.values() if "capacity/full_fraction" in m]
        if full:
            out[f"{name}_full_fraction_mean"] = statistics.fmean(full)
    return out


def _curve_table(result: CardResult) -> tuple[list[str], dict[str, dict[float, list[float]]]]:
    curves: dict[str, dict[float, list[float]]] = {}
    for kind, names in runs_by_structure(result).items():
        for run in names:
            label = f"{run} ({DEPLOYMENT[kind]})"
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
    salaad = runs_by_structure(result).get("both", [])
    if not salaad:
        return None
    first = result.runs[salaad[0]].runs[0]
    metrics = first.summary_metrics()
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
    ax.set_title(f"{salaad[0]}: learned structure at the last refresh (seed {first.seed})")
    fig.tight_layout()
    path = out_dir / "salaad_structure.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _export_bytes(result: CardResult, out_dir: Path) -> tuple[list[str], dict[str, float]]:
    """Export the first seed's SALAAD and dense checkpoints at 0.25 and 0.15 and measure the files."""
    from litlab.lit_modules.structured.export import export

    rows, numbers = [], {}
    by_structure = runs_by_structure(result)
    for run in [*by_structure.get("both", []), *by_structure.get("dense", [])]:
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
    dense = [
        m["val/loss"]
        for name in runs_by_structure(result).get("dense", [])
        for m in _per_seed(result, name).values()
        if "val/loss" in m
    ]
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
