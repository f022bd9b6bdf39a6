"""Report helpers of the domain-adaptation family's cards (``CardResult`` in, ``ReportExtras`` out).

``per_target_report`` reads every seed's ``summary.json`` of the named runs, draws one bar per (run, target) with
the mean ± std over seeds (per-target accuracy for multi-target adaptation, per-factor MAE for regression)
and writes the same numbers as a markdown table. It derives no number a claim reads.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from litlab.lit_modules.core.results import CardResult, ReportExtras


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
