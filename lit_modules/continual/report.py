"""The continual family's one report place: heatmaps of accuracy matrices, for a run and for a card.

``AccuracyMatrixCallback`` (``litlab.callbacks.continual``) writes ``accuracy_matrix.json`` (``R``,
``init_acc``, ``sizes``, ``metrics``) into every run folder and draws it with ``draw_accuracy_matrix``; a
card's report hook (``janus_lora.report``, ``loda.report``) calls ``accuracy_matrix_report`` to put the
seed-mean matrix of every run into one figure and a table. Step times are a benchmark, not a report:
``litlab bench continual_steps``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from litlab.lit_modules.core.results import CardResult, ReportExtras

MATRIX_FILE = "accuracy_matrix.json"  # what AccuracyMatrixCallback writes in each run folder
TABLE_METRICS = ("cl/acc", "cl/bwt", "cl/forgetting", "cl/maa")


def draw_accuracy_matrix(R: torch.Tensor, path: Path, title: str = "", ax=None) -> None:
    """Heatmap of R (rows: after task i, columns: task j) with the values written in the cells; saved to
    ``path`` when no ``ax`` is given."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(1.0 + 0.6 * R.shape[1], 0.8 + 0.6 * R.shape[0]))
    ax.imshow(R.numpy(), vmin=0, vmax=1, cmap="viridis")
    for i in range(R.shape[0]):
        for j in range(R.shape[1]):
            ax.text(
                j,
                i,
                f"{R[i, j]:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if R[i, j] < 0.6 else "black",
            )
    ax.set_xlabel("evaluated on task j")
    ax.set_ylabel("after training task i")
    ax.set_xticks(range(R.shape[1]))
    ax.set_yticks(range(R.shape[0]))
    ax.set_title(title, fontsize=8)
    if own:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def accuracy_matrix_report(result: CardResult, out_dir: Path | str, slug: str) -> ReportExtras:
    """A card's report: the seed-mean accuracy matrix of every distinct run (one heatmap each, in one figure)
    and a table of seed-mean ACC / BWT / forgetting / MAA. Runs without ``accuracy_matrix.json`` are left
    out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    matrices, rows = {}, []
    for name, run in result.distinct_runs():
        data = [json.loads((d / MATRIX_FILE).read_text()) for d in run.run_dirs if (d / MATRIX_FILE).exists()]
        if not data:
            continue
        matrices[name] = torch.tensor([d["R"] for d in data]).mean(0)
        mean = {k: sum(d["metrics"].get(k, float("nan")) for d in data) / len(data) for k in TABLE_METRICS}
        rows.append(
            f"| {name} | {mean['cl/acc']:.3f} | {mean['cl/bwt']:.3f} | {mean['cl/forgetting']:.3f} | "
            f"{mean['cl/maa']:.3f} | {len(data)} |"
        )
    md = [
        "## Accuracy matrices (mean over seeds)",
        "",
        "| run | ACC | BWT | forgetting | MAA | seeds |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "Time per training step against plain LoRA: `litlab bench continual_steps`.",
        "",
    ]
    figures = []
    if matrices:
        n = len(matrices)
        cols = min(n, 4)
        nrows = (n + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 3.0 * nrows), squeeze=False)
        for ax, (name, R) in zip(axes.flat, matrices.items()):
            draw_accuracy_matrix(R, Path(), title=name, ax=ax)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        path = out_dir / f"{slug}_accuracy_matrices.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        figures.append(path)
    return ReportExtras(figures=figures, markdown="\n".join(md))
