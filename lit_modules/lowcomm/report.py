"""The low-communication family's report: what ``litlab repro lordo`` adds to the table of means.

For LoRDO ("LoRDO: Distributed Low-Rank Optimization with Infrequent Communication", arXiv 2602.04396) and its
baselines (DDP, GaLore-style low-rank DDP, DiLoCo): a table of val loss and communicated bytes per run, a
loss-vs-bytes plot, the subspace similarity at the projector refreshes and the derived ratios the claim is about.
A run is told apart by its strategy's mode in the config its run folder saved (``config.yaml``), never by the
card's run names: every LoRDO run (mode ``lordo``) is divided by every per-step-synchronising run (``ddp``,
``lowrank_ddp``) on bytes per step and val loss.
"""

from __future__ import annotations

import csv
from pathlib import Path

from litlab.lit_modules.core.results import CardResult, ReportExtras, RunResult

RATIO_METRICS = {"bytes_ratio": "comm/bytes_per_step", "val_loss_ratio": "val/loss"}
PER_STEP_SYNC = ("ddp", "lowrank_ddp")  # the baselines LoRDO's infrequent communication is measured against


def strategy_mode(run: RunResult) -> str:
    """The communication mode the run's first seed was fitted with (``trainer.strategy.init_args.mode``)."""
    config = run.runs[0].config()
    strategy = (config.get("trainer") or {}).get("strategy")
    return strategy["init_args"]["mode"] if isinstance(strategy, dict) else "none"


def _lowrank_setting(run: RunResult) -> tuple[int, float] | None:
    """(projector refresh period, learning rate) of a low-rank DDP run, from the config its first seed saved
    (None where that config does not say)."""
    model = ((run.runs[0].config().get("model") or {}).get("init_args")) or {}
    gap, lr = (model.get("low_rank") or {}).get("update_proj_gap"), model.get("lr")
    return None if gap is None or lr is None else (int(gap), float(lr))


def lr_sweep_table(result: CardResult) -> list[str]:
    """Low-rank DDP's val loss by (projector refresh period, learning rate), mean over seeds, the lowest per
    period marked: the sweep the baseline's learning rate was chosen by (issue 34: the baseline at its best)."""
    cells: dict[tuple[int, float], RunResult] = {}
    for _, run in result.distinct_runs():
        setting = _lowrank_setting(run) if strategy_mode(run) == "lowrank_ddp" and run.values else None
        if setting is not None:
            cells.setdefault(setting, run)
    if len({lr for _, lr in cells}) < 2:
        return []
    best = {gap: min((r.mean, lr) for (g, lr), r in cells.items() if g == gap)[1] for gap, _ in cells}
    rows = [
        f"| {gap} | {lr:g} | {run.mean:.4f} ± {run.std:.4f} | {len(run.values)} | {'best' if best[gap] == lr else ''} |"
        for (gap, lr), run in sorted(cells.items())
    ]
    return [
        "",
        "## Low-rank DDP learning-rate sweep",
        "",
        "| projector refresh (steps) | lr | val loss (mean ± sd over seeds) | seeds | |",
        "|---|---|---|---|---|",
        *rows,
    ]


def _curve(run_dir: Path) -> tuple[list[float], list[float], list[float]]:
    """(bytes so far, train loss) at each logged step, and the subspace similarity at each refresh."""
    bytes_, loss, sims = [], [], []
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("comm/bytes_total") and row.get("train/loss"):
                    bytes_.append(float(row["comm/bytes_total"]))
                    loss.append(float(row["train/loss"]))
                if row.get("lordo/subspace_similarity"):
                    sims.append(float(row["lordo/subspace_similarity"]))
    return bytes_, loss, sims


def _per_seed_ratios(result: CardResult, a: str, b: str, key: str) -> list[float]:
    """``key`` of run a over run b, seed by seed (both card entries must exist and log ``key``)."""
    if a not in result.runs or b not in result.runs:
        return []
    other = {r.seed: r for r in result.runs[b].runs}
    out = []
    for run_a in result.runs[a].runs:
        if run_a.seed not in other:
            continue
        ma, mb = run_a.summary_metrics(), other[run_a.seed].summary_metrics()
        if key in ma and mb.get(key):
            out.append(ma[key] / mb[key])
    return out


def report(result: CardResult, out_dir: Path) -> ReportExtras:
    """Card report hook: a table and a loss-vs-bytes plot of each distinct run's first seed; the ratios of every
    LoRDO run over every per-step-synchronising run (``bytes_ratio_<a>_<b>``, ``val_loss_ratio_<a>_<b>``) seed by
    seed, the largest over seeds (the byte ledger does not depend on the data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, numbers, summaries = [], {}, {}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, run in result.distinct_runs():  # entries reading another metric of the same runs are skipped
        seed_run = run.runs[0]
        summary = seed_run.summary_metrics()
        if "val/loss" not in summary or "comm/bytes_total" not in summary:
            continue
        summaries[name] = summary
        b, loss, sims = _curve(seed_run.run_dir)
        steps = summary.get("comm/num_syncs", 0)
        rows.append(
            f"| {name} | {summary['val/loss']:.4f} | {summary['comm/bytes_total']:.4g} | "
            f"{summary['comm/bytes_per_step']:.5g} | {int(steps)} | "
            f"{(f'{min(sims):.4f}–{max(sims):.4f}' if sims else '—')} |"
        )
        if b:
            k = max(1, len(loss) // 30)
            smooth = [sum(loss[i : i + k]) / len(loss[i : i + k]) for i in range(0, len(loss), k)]
            ax.plot([max(x, 1.0) for x in b[::k]], smooth, label=name)
        if sims:
            numbers[f"{name}_similarity_min"] = min(sims[1:] or sims)
            numbers[f"{name}_similarity_max"] = max(sims[1:] or sims)
    ax.set_xscale("log")
    ax.set_xlabel("communicated payload bytes per worker")
    ax.set_ylabel("train loss (smoothed)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out_dir / "lordo_loss_vs_bytes.png"
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

    modes = {name: strategy_mode(run) for name, run in result.distinct_runs()}
    for a in (n for n, mode in modes.items() if mode == "lordo"):
        for base in (n for n, mode in modes.items() if mode in PER_STEP_SYNC):
            for prefix, key in RATIO_METRICS.items():
                ratios = _per_seed_ratios(result, a, base, key)
                if ratios:
                    numbers[f"{prefix}_{a}_{base}"] = max(ratios)
    markdown = "\n".join(
        [
            "## Loss and communication",
            "",
            "| run | val loss | bytes total | bytes/step | syncs | subspace similarity (min–max) |",
            "|---|---|---|---|---|---|",
            *rows,
            *lr_sweep_table(result),
        ]
    )
    return ReportExtras(figures=[path], markdown=markdown, numbers=numbers)
