"""The long-context family's report helpers: what the ``xkv`` and ``sale`` cards add to their reports.

A card's hook (``litlab.lit_modules.longctx.xkv:report``, ``...sale:report``) is called by ``litlab repro`` as
``hook(result: CardResult, out_dir: Path) -> ReportExtras`` and delegates here. Every helper reads each run's final
logged metrics through ``SeedRun.summary_metrics()``, averaged over the card's seeds (one model per seed), and what a
run is (its model, method and group size) from the config its run folder saved (``config.yaml``), never from the
card's run names.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from litlab.lit_modules.core.results import CardResult, ReportExtras, RunResult

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


def model_args(run: RunResult) -> dict[str, Any]:
    """The module's ``init_args`` the run's first seed was fitted with (its run folder's ``config.yaml``)."""
    config = run.runs[0].config()
    return config["model"]["init_args"]


def compression_kind(args: dict[str, Any]) -> str | None:
    """``dense``, ``svd`` (per-layer SVD: xKV with group size 1), ``xkv`` (group size > 1), or None (the other
    methods: SR variants, MiniCache)."""
    if args.get("method") == "dense":
        return "dense"
    if args.get("method") == "xkv":
        return "xkv" if (args.get("plan") or {}).get("group_size", 1) > 1 else "svd"
    return None


def acc_vs_cr_report(result: CardResult, out_dir: Path) -> ReportExtras:
    """xKV: accuracy vs compression ratio per run (a scatter plot, log x, and a table), and per model the highest
    CR that per-layer SVD (group size 1) and xKV (group size > 1) reach within one point of that model's dense
    accuracy (``best_cr_within_1pt_<svd|xkv>_<model>``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = run_metrics(result)
    curve = {n: m for n, m in rows.items() if "val/acc_dense" in m}  # the runs of xkv_curve (medium scale)
    rows = {n: m for n, m in rows.items() if n not in curve}
    kinds: dict[str, dict[str, str | None]] = {}  # model -> {run: kind}
    for name, run in result.runs.items():
        if name in curve:
            continue
        args = model_args(run)
        kinds.setdefault((args.get("lm") or {}).get("name", "tiny_passkey_llama"), {})[name] = (
            compression_kind(args)
        )
    numbers: dict[str, float] = {}
    lines = [
        "| run | model | acc | CR | CR_inf | recon err K/V | tokens reconstructed |",
        "|---|---|---|---|---|---|---|",
    ]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for (model, runs), marker in zip(sorted(kinds.items()), "osD^v"):
        dense = [rows[n]["val/acc"] for n, kind in runs.items() if kind == "dense" and "val/acc" in rows[n]]
        best = {"svd": 0.0, "xkv": 0.0}
        for n, kind in runs.items():
            m = rows[n]
            acc, cr = m.get("val/acc", NAN), m.get("val/compression_ratio", NAN)
            numbers[f"{n}_acc"], numbers[f"{n}_cr"] = acc, cr
            if "val/tokens_reconstructed_frac" in m:
                numbers[f"{n}_tokens_reconstructed_frac"] = m["val/tokens_reconstructed_frac"]
            ax.scatter(cr, acc, marker=marker, label=model if n == next(iter(runs)) else None)
            ax.annotate(n, (cr, acc), fontsize=6)
            lines.append(
                f"| {n} | {model} | {acc:.3f} | {cr:.2f} | {m.get('val/cr_inf', NAN):.1f} | "
                f"{m.get('val/recon_rel_err_k', NAN):.3f}/{m.get('val/recon_rel_err_v', NAN):.3f}"
                f" | {m.get('val/tokens_reconstructed_frac', NAN):.3f} |"
            )
            if kind in best and dense and acc >= dense[0] - 0.01:
                best[kind] = max(best[kind], cr)
        if dense:
            for kind, cr in best.items():
                numbers[f"best_cr_within_1pt_{kind}_{model}"] = cr
    if curve:
        lines.append("")
        lines += curve_table(curve, ax, numbers)
    ax.set_xscale("log")
    ax.set_xlabel("compression ratio (dense K+V / stored elements, log scale)")
    ax.set_ylabel("passkey accuracy")
    ax.set_title("xKV: accuracy vs compression" + ("" if curve else ", per model"))
    ax.legend(fontsize=6)
    fig.tight_layout()
    path = out_dir / "xkv_acc_vs_cr.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return ReportExtras(figures=[path], markdown="\n".join(lines), numbers=numbers)


CURVE_POINT = re.compile(r"^val/(svd|xkv|minicache)(?:_cr([0-9.]+))?_acc$")


def curve_table(curve: dict[str, dict[str, float]], ax, numbers: dict[str, float]) -> list[str]:
    """The xkv_curve runs (several card entries may read one fit): each family's accuracy against its measured
    CR as a line from the dense point (CR 1), a table, and the derived numbers ``<point>_acc``, ``<point>_cr``,
    ``<family>_cr_near_dense`` and ``acc_dense`` (means over seeds)."""
    families: dict[str, list[tuple[float, float, str]]] = {}
    for m in curve.values():
        numbers.setdefault("acc_dense", m["val/acc_dense"])
        for key, acc in m.items():
            found = CURVE_POINT.match(key)
            if not found or key.removeprefix("val/") in numbers:  # a fit read by several entries: once
                continue
            cr = m[key.removesuffix("_acc") + "_cr"]
            families.setdefault(found.group(1), []).append((cr, acc, key))
            numbers[key.removeprefix("val/")] = acc
            numbers[key.removeprefix("val/").removesuffix("_acc") + "_cr"] = cr
            near = m.get(f"val/{found.group(1)}_cr_near_dense")
            if near is not None:
                numbers[f"{found.group(1)}_cr_near_dense"] = near
    dense = numbers["acc_dense"]
    lines = [
        f"Curves, one exact prefill per prompt (dense accuracy {dense:.3f}): accuracy at each measured compression "
        "ratio; CR near dense = the highest CR within one point of dense (1: none), means over seeds.",
        "",
        "| family | point | acc | CR | CR near dense |",
        "|---|---|---|---|---|",
    ]
    for family, points in sorted(families.items()):
        points.sort()
        ax.plot([1.0, *(p[0] for p in points)], [dense, *(p[1] for p in points)], marker="o", label=family)
        for cr, acc, key in points:
            near = numbers.get(f"{family}_cr_near_dense", NAN)
            lines.append(f"| {family} | {key.removeprefix('val/')} | {acc:.3f} | {cr:.2f} | {near:.2f} |")
    return lines


def density_report(result: CardResult, out_dir: Path | None = None) -> ReportExtras:
    """SALE: accuracy, block density and attention output error of every run (dense runs log no density: 1.0,
    error 0.0; a sparse run with ``measure_error`` off logs no error and gets none), and with ``out_dir`` the figure
    accuracy against density (``sale_acc_vs_density.png``: one point per run, mean over seeds). CPU timing is a
    benchmark, not part of the card: ``litlab bench sale_prefill``."""
    numbers: dict[str, float] = {}
    lines = ["| run | acc | density | attn out rel err |", "|---|---|---|---|"]
    for name, m in run_metrics(result).items():
        numbers[f"{name}_acc"] = m.get("val/acc", NAN)
        numbers[f"{name}_density"] = m.get("val/density", 1.0)
        if "val/attn_out_rel_err" in m or "val/density" not in m:
            numbers[f"{name}_out_err"] = m.get("val/attn_out_rel_err", 0.0)
        err = numbers.get(f"{name}_out_err")
        lines.append(
            f"| {name} | {numbers[f'{name}_acc']:.3f} | {numbers[f'{name}_density']:.3f} | "
            f"{'not measured' if err is None else f'{err:.4f}'} |"
        )
    figures = [] if out_dir is None else [acc_vs_density_figure(numbers, out_dir)]
    return ReportExtras(markdown="\n".join(lines), figures=figures, numbers=numbers)


def acc_vs_density_figure(numbers: dict[str, float], out_dir: Path) -> Path:
    """Every run's accuracy against the fraction of attention blocks it computed (dense: 1), labelled by run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for key, acc in numbers.items():
        if not key.endswith("_acc") or acc != acc:  # NaN: the run logged no accuracy (a timing-only run)
            continue
        name = key.removesuffix("_acc")
        density = numbers[f"{name}_density"]
        ax.scatter(density, acc, s=14)
        ax.annotate(name, (density, acc), fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.set_xlabel("block density (fraction of attention blocks computed)")
    ax.set_ylabel("accuracy")
    ax.set_title("SALE: accuracy vs density")
    fig.tight_layout()
    path = out_dir / "sale_acc_vs_density.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
