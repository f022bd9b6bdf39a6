"""Report helpers of the domain-adaptation family's cards (``CardResult`` in, ``ReportExtras`` out).

``per_target_report`` reads every seed's ``summary.json`` of the named runs, draws one bar per (run, target) with
the mean ± std over seeds (per-target accuracy for multi-target adaptation, per-factor MAE for regression)
and writes the same numbers as a markdown table.

``feature_report`` draws source and target features before adaptation (the source-only run) and after (the
methods) at the card's first seed: each method file's ``run_features(run_dir)`` rebuilds the run's DataModule
and network from the run folder's ``checkpoints/last.ckpt`` (which ``litlab fit`` keeps) and
``feature_pca_figure`` projects each model's features on their own first two principal components (sklearn
PCA), coloured by domain, and for classification a second row by true class.

The hooks pick runs by role and claim (``feature_panels``), never by the card's run names, and per-target
metrics by the names the runs logged (``per_target_keys``). Neither derives a number a claim reads.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from litlab.lit_modules.core.results import CardResult, ReportExtras


# ---- which runs and metrics a hook shows: from the card's roles and claims ---------------------------------------
def card_design(result: CardResult) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The roles (``{run: role}``) and claims of the card ``result`` measured, as ``litlab repro`` hands them to
    every report hook (``CardResult.roles``, ``CardResult.design_claims``)."""
    return result.roles, result.design_claims


def _run(ref: str) -> str:
    return str(ref).partition(":")[0]  # a claim side is "run" or "run:metric"


def feature_panels(roles: dict[str, str], claims: list[dict[str, Any]]) -> dict[str, str]:
    """``{panel label: run}`` for the feature figure: the floor the positive control reads (the model before
    adaptation), then every run a claim compares the headline's method with, the method itself, and the ablations
    no claim reads (reported variants of the method)."""
    method = next(_run(c["method"]) for c in claims if c.get("headline"))
    floors = [_run(a) for c in claims if c.get("control") for a in c["against"] if roles[_run(a)] == "floor"]
    compared = [_run(a) for c in claims if _run(c.get("method", "")) == method for a in c["against"]]
    claimed = {
        _run(r) for c in claims for r in [c.get("method", ""), *c.get("against", []), c.get("value", "")]
    }
    unclaimed = [run for run, role in roles.items() if role == "ablation" and run not in claimed]
    before = floors[:1]
    return {
        f"{'before' if run in before else 'after'}: {run} ({roles[run]})": run
        for run in dict.fromkeys([*before, *compared, method, *unclaimed])
    }


def per_target_keys(result: CardResult, prefix: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """The per-target (or per-factor) metrics the runs logged: names under ``prefix`` that start with none of
    ``exclude`` (the card's summary metric, a secondary head's), in the order the first run logged them."""
    for run in result.runs.values():
        for seed_run in run.runs:
            names = seed_run.summary_metrics()
            return [k for k in names if k.startswith(prefix) and not k.startswith(tuple(exclude))]
    return []


def per_target_table(
    result: CardResult, runs: list[str], keys: list[str]
) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {}
    for name in runs:
        if name not in result.runs:
            continue
        per = {k: [] for k in keys}
        for seed_run in result.runs[name].runs:
            metrics = seed_run.summary_metrics()
            for k in keys:
                if k in metrics:
                    per[k].append(float(metrics[k]))
        out[name] = per
    return out


def per_target_report(
    result: CardResult, out_dir, slug: str, runs: list[str], keys: list[str], ylabel: str
) -> ReportExtras:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = per_target_table(result, runs, keys)
    if not table:
        return ReportExtras()
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(keys) * len(table) / 2, 3.2))
    width = 0.8 / len(table)
    lines = [f"| run | {' | '.join(k.split('/')[-1] for k in keys)} |", "|---|" + "---|" * len(keys)]
    for i, (name, per) in enumerate(table.items()):
        means = [statistics.fmean(per[k]) if per[k] else float("nan") for k in keys]
        stds = [statistics.stdev(per[k]) if len(per[k]) > 1 else 0.0 for k in keys]
        ax.bar([j + i * width for j in range(len(keys))], means, width, yerr=stds, label=name, capsize=2)
        lines.append(f"| {name} | " + " | ".join(f"{m:.3f} ± {s:.3f}" for m, s in zip(means, stds)) + " |")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], [k.split("/")[-1] for k in keys])
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    ax.set_title(f"{slug}: per target, mean ± std over seeds {result.seeds}", fontsize=9)
    fig.tight_layout()
    path = Path(out_dir) / f"{slug}_per_target.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return ReportExtras(figures=[path], markdown="### Per target\n\n" + "\n".join(lines) + "\n")


# ---- feature plots: PCA of source and target features before and after adaptation --------------------------------
def run_checkpoint(run_dir: Path | str) -> dict:
    """The Lightning checkpoint a run folder holds (``checkpoints/last.ckpt``, which ``litlab fit`` keeps)."""
    import torch

    path = Path(run_dir) / "checkpoints" / "last.ckpt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    return torch.load(path, map_location="cpu", weights_only=False)


def run_seed_of(run_dir: Path | str) -> int:
    """The seed a run was fitted under, from its ``summary.json``'s seed ledger: the DataModule draws its data
    from it, so rebuilding the run's data needs it."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    seed = (json.loads(path.read_text()).get("seed_ledger") or {}).get("run_seed")
    if seed is None:
        raise FileNotFoundError(f"{path} has no seed_ledger.run_seed (a run from before litlab recorded one)")
    return int(seed)


@contextmanager
def fitted_under(seed: int) -> Iterator[None]:
    """The run seed ``seed`` for the block (``PL_GLOBAL_SEED``, what ``derive_seed`` reads), the caller's after."""
    before = os.environ.get("PL_GLOBAL_SEED")
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PL_GLOBAL_SEED", None)
        else:
            os.environ["PL_GLOBAL_SEED"] = before


def datamodule_from_checkpoint(ckpt: dict, default_class: type, run_dir: Path | str):
    """The run's DataModule rebuilt from the arguments the checkpoint holds and set up under the run's seed
    (``run_seed_of(run_dir)``), so it draws the run's data; its class from the ``_class_path`` LightningCLI
    stores, else ``default_class``."""
    import importlib

    args = dict(ckpt.get("datamodule_hyper_parameters") or {})
    args.pop("_instantiator", None)
    cls = default_class
    if "_class_path" in args:
        module, _, name = args.pop("_class_path").rpartition(".")
        cls = getattr(importlib.import_module(module), name)
    with fitted_under(run_seed_of(run_dir)):
        dm = cls(**args)
        dm.setup("fit")
    return dm


def sub_state(state_dict: dict, prefix: str) -> dict:
    """The entries of a module's state dict under ``prefix`` (``"net."``), with the prefix removed."""
    return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}


def pca_2d(feat) -> tuple:
    """Rows of ``feat`` (N, d) projected on their first two principal axes (sklearn PCA, exact SVD), and the two
    explained-variance ratios."""
    import numpy as np
    from sklearn.decomposition import PCA

    x = np.asarray(feat, dtype=np.float64)
    pca = PCA(n_components=2, svd_solver="full").fit(x)
    return pca.transform(x), [float(r) for r in pca.explained_variance_ratio_]


def feature_pca_figure(
    panels: dict,
    domain_names: list[str],
    path: Path | str,
    title: str = "",
    class_names: list[str] | None = None,
) -> dict:
    """One scatter per panel (``{label: (features (N, d), domain index (N,), class (N,) or None)}``): the panel's
    rows projected on their own first two principal axes, one colour per domain (index i names
    ``domain_names[i]``, 0 the source, drawn as crosses); with classes, a second row colours the same points by
    class. Each panel is its own PCA, so axes are not comparable across panels. Returns the explained-variance
    ratios per panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    with_classes = class_names is not None and all(p[2] is not None for p in panels.values())
    rows = 2 if with_classes else 1
    fig, axes = plt.subplots(rows, len(panels), figsize=(3.4 * len(panels), 3.3 * rows), squeeze=False)
    ratios = {}
    for j, (label, (feat, dom, cls)) in enumerate(panels.items()):
        xy, ratio = pca_2d(feat)
        ratios[label] = ratio
        dom = np.asarray(dom)
        ax = axes[0][j]
        for i, name in enumerate(domain_names):
            sel = dom == i
            if sel.any():
                ax.scatter(xy[sel, 0], xy[sel, 1], s=4, alpha=0.5, label=name, marker="x" if i == 0 else "o")
        ax.set_title(f"{label}\nPC1 {ratio[0]:.0%}, PC2 {ratio[1]:.0%} of variance", fontsize=8)
        if with_classes:
            cls = np.asarray(cls)
            ax2 = axes[1][j]
            cmap = plt.get_cmap("tab10" if len(class_names) <= 10 else "tab20")
            for c, name in enumerate(class_names):
                sel = cls == c
                if sel.any():
                    ax2.scatter(xy[sel, 0], xy[sel, 1], s=4, alpha=0.5, color=cmap(c % cmap.N), label=name)
            ax2.set_title("the same points by true class", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][0].legend(fontsize=7, markerscale=3)
    if with_classes and len(class_names) <= 20:
        axes[1][0].legend(fontsize=6, markerscale=3, ncol=2)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return ratios


def feature_report(
    result: CardResult, out_dir, slug: str, runs: dict[str, str], features, per_domain: int = 400
) -> ReportExtras:
    """PCA figure of the features of ``runs`` (``{panel label: card run}``, the source-only model first) at the
    card's first seed: ``features(run_dir) -> (feat (N, d), domain index (N,), domain names, class (N,) or None,
    class names or None)`` reads a run's checkpoint. At most ``per_domain`` rows per domain are drawn (a fixed
    random subset, the same rows in every panel). Runs this invocation did not measure, or without a
    checkpoint, are left out and named."""
    import numpy as np

    panels, missing, names, class_names = {}, [], None, None
    seed = result.seeds[0] if result.seeds else None
    for label, run in runs.items():
        seed_runs = [r for r in result.runs[run].runs if r.seed == seed] if run in result.runs else []
        if not seed_runs:
            missing.append(f"{run} (not measured)")
            continue
        try:
            feat, dom, names, cls, class_names = features(seed_runs[0].run_dir)
        except FileNotFoundError as err:
            missing.append(f"{run} ({err})")
            continue
        feat, dom = np.asarray(feat), np.asarray(dom)
        rng = np.random.default_rng(0)
        keep = np.concatenate(
            [rng.permutation(np.flatnonzero(dom == i))[:per_domain] for i in range(len(names))]
        )
        panels[label] = (feat[keep], dom[keep], None if cls is None else np.asarray(cls)[keep])
    if not panels:
        return ReportExtras(markdown="### Features\n\nNo checkpoint to draw: " + ", ".join(missing) + "\n")
    path = Path(out_dir) / f"{slug}_features_pca.png"
    ratios = feature_pca_figure(
        panels,
        names,
        path,
        f"{slug}: features of source and target images, seed {seed}, PCA per panel",
        class_names,
    )
    lines = [
        "### Features before and after adaptation",
        "",
        f"Seed {seed}, at most {per_domain} images per domain; each panel is the PCA of its own model's features "
        "(axes are not comparable across panels).",
        "",
        "| panel | run | PC1 + PC2 of variance |",
        "|---|---|---|",
        *(f"| {label} | {runs[label]} | {sum(r):.2f} |" for label, r in ratios.items()),
    ]
    if missing:
        lines += ["", "Left out: " + ", ".join(missing)]
    return ReportExtras(figures=[path], markdown="\n".join(lines) + "\n")


def merge_extras(*parts: ReportExtras) -> ReportExtras:
    out = ReportExtras()
    for p in parts:
        out.figures += p.figures
        out.markdown += ("\n" if out.markdown else "") + p.markdown
        out.numbers.update(p.numbers)
    return out
