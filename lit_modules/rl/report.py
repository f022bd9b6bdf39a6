"""The RL family's ``litlab repro`` report hooks (``report_hook:
litlab.lit_modules.rl.report:<slug>_report``): learning curves — an eval metric against ``env_steps`` for
every card entry, mean over seeds — and derived numbers read from each run's ``summary.json``."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from litlab.lit_modules.core.results import CardResult, ReportExtras


def read_eval_curve(run_dir: str | Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(env_steps, metric) rows of all csv attempts of a run where ``metric`` was logged (last value per
    step)."""
    points: dict[float, tuple[float, float]] = {}
    for path in sorted(Path(run_dir).glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get(metric) not in (None, "") and row.get("env_steps") not in (None, ""):
                    key = float(row["iteration"]) if row.get("iteration") else float(row["env_steps"])
                    points[key] = (float(row["env_steps"]), float(row[metric]))
    if not points:
        return np.zeros(0), np.zeros(0)
    rows = np.array([points[k] for k in sorted(points)])
    return rows[:, 0], rows[:, 1]


def plot_learning_curves(
    result: CardResult, out_dir: str | Path, metric: str, extra_numbers: tuple[str, ...] = ()
) -> ReportExtras:
    """``<slug>_curves.png`` (``metric`` against env steps, mean and min–max band over seeds, one line per
    distinct set of runs) and ``<run>:<extra>`` = the mean over seeds of each ``extra_numbers`` summary
    metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    numbers: dict[str, float] = {}
    for name, run in result.distinct_runs():
        curves = [c for c in (read_eval_curve(d, metric) for d in run.run_dirs) if len(c[0])]
        if not curves:
            continue
        n = min(len(c[0]) for c in curves)
        x = curves[0][0][:n]
        y = np.stack([c[1][:n] for c in curves])
        ax.plot(x, y.mean(0), label=name)
        ax.fill_between(x, y.min(0), y.max(0), alpha=0.15)
        for extra in extra_numbers:
            vals = [
                float(m[extra])
                for m in (seed_run.summary_metrics() for seed_run in run.runs)
                if extra in m and not isinstance(m[extra], str)
            ]
            if vals:
                numbers[f"{name}:{extra}"] = float(np.mean(vals))
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out_dir / f"{result.slug}_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    lines = [
        "## Learning curves",
        "",
        f"`{metric}` against env steps, mean over seeds (evaluation episodes are deterministic).",
        "",
        "Derived numbers above: `<run>:eval/score_offline_end` (score when the online phase starts) and "
        "`<run>:eval/score_auc` (mean score over the online evaluations), means over seeds.",
    ]
    return ReportExtras(figures=[path], markdown="\n".join(lines), numbers=numbers)


def dare_report(result: CardResult, out_dir: Path) -> ReportExtras:
    """DARE: D4RL score against env steps of every run, plus the score at the end of the offline phase and the
    mean online score."""
    return plot_learning_curves(
        result, out_dir, metric="eval/score", extra_numbers=("eval/score_offline_end", "eval/score_auc")
    )


def ngt_report(result: CardResult, out_dir: Path) -> ReportExtras:
    """NGT: normalised return against env steps of every run, plus the mean score over the evaluations."""
    return plot_learning_curves(result, out_dir, metric="eval/norm_return", extra_numbers=("eval/score_auc",))
