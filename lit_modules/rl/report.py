"""Learning curves for ``litlab repro`` report hooks: eval metric against ``env_steps`` per run, mean over seeds."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def read_eval_curve(run_dir: str | Path, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(env_steps, metric) rows of all csv attempts of a run where ``metric`` was logged (last value per step)."""
    points: dict[float, float] = {}
    for path in sorted(Path(run_dir).glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get(metric) not in (None, "") and row.get("env_steps") not in (None, ""):
                    points[float(row["iteration"]) if row.get("iteration") else float(row["env_steps"])] = (
                        float(row["env_steps"]),
                        float(row[metric]),
                    )
    if not points:
        return np.zeros(0), np.zeros(0)
    rows = np.array([points[k] for k in sorted(points)])
    return rows[:, 0], rows[:, 1]


def plot_learning_curves(
    res: dict, out_dir: str | Path, slug: str, metric: str, extra_numbers: tuple[str, ...] = ()
) -> dict:
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    numbers: dict[str, float] = {}
    lines = [
        "## Learning curves",
        "",
        f"`{metric}` against env steps, mean over seeds (evaluation episodes are deterministic).",
        "",
    ]
    seen = set()
    for name, run in res["runs"].items():
        dirs = [r["run_dir"] for r in run["runs"]]
        key = tuple(sorted(dirs))
        if key in seen:  # two card entries reading other metrics of the same runs
            continue
        seen.add(key)
        curves = [read_eval_curve(d, metric) for d in dirs]
        curves = [c for c in curves if len(c[0])]
        if not curves:
            continue
        n = min(len(c[0]) for c in curves)
        x = curves[0][0][:n]
        y = np.stack([c[1][:n] for c in curves])
        ax.plot(x, y.mean(0), label=name)
        ax.fill_between(x, y.min(0), y.max(0), alpha=0.15)
        for extra in extra_numbers:
            vals = []
            for d in dirs:
                summary = json.loads((Path(d) / "summary.json").read_text())["metrics"]
                if extra in summary and not isinstance(summary[extra], str):
                    vals.append(float(summary[extra]))
            if vals:
                numbers[f"{name}:{extra}"] = float(np.mean(vals))
    ax.set_xlabel("env steps")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out_dir / f"{slug}_curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    lines.append(
        "Derived numbers above: `<run>:eval/score_offline_end` (score when the online phase starts) and "
        "`<run>:eval/score_auc` (mean score over the online evaluations), means over seeds."
    )
    return {"figures": [path], "markdown": "\n".join(lines), "numbers": numbers}
