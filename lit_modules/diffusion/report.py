"""Report helpers of the diffusion family's cards (``CardResult`` in, ``ReportExtras`` out).

Every helper reads the runs the reproduction holds (``CardResult.runs``, in the card's order, labelled by their
card names), never a list of run names written here: which runs a card has is the card's to say, and so is which
of them save samples (``sampling.per_concept`` > 0), the runs a sample grid shows.

``frontier_report`` (SCNS) reads every seed's ``summary.json`` of every run and draws the stability-plasticity
plane (forgetting against plasticity, mean ± std over seeds), joining the runs that no other run beats on both
axes (the frontier) by a line, with the same numbers as a markdown table. It derives no number a claim reads.
``concept_samples_report`` (SCNS) draws, for the first seed, each concept's held-out renders, the base model's
samples and, for each run that saved samples, its samples after that concept's task and after the last task.
``vsr_report`` (LiteVSR) tabulates PSNR / SSIM / temporal-difference error per run and step count and draws
the LQ / SR / HQ frame grid from the samples each fit saved (``vsr_samples.safetensors`` in its run folder).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from litlab.lit_modules.core.results import CardResult, ReportExtras


def _per_run(result: CardResult, name: str, keys: list[str]) -> dict[str, list[float]]:
    out = {k: [] for k in keys}
    for seed_run in result.runs[name].runs:
        metrics = seed_run.summary_metrics()
        for k in keys:
            if k in metrics:
                out[k].append(float(metrics[k]))
    return out


def _ms(v: list[float]) -> tuple[float, float]:
    if not v:
        return float("nan"), 0.0
    return statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0


def frontier(points: dict[str, tuple[float, float]]) -> list[str]:
    """The runs no other run beats on both axes, by plasticity: ``points`` run -> (PL, FG), higher PL and lower
    FG better; a run is beaten by one at least as good on both and better on one."""
    kept = [
        n
        for n, (x, y) in points.items()
        if not any(x2 >= x and y2 <= y and (x2, y2) != (x, y) for m, (x2, y2) in points.items() if m != n)
    ]
    return sorted(kept, key=lambda n: points[n][0])


def frontier_report(
    result: CardResult,
    out_dir,
    slug: str,
    fg: str = "val/forgetting",
    pl: str = "val/plasticity",
    extra: tuple[str, ...] = ("val/neurons", "val/changed_frac", "val/risk_sum", "val/base_drift"),
) -> ReportExtras:
    """Every run on the stability-plasticity plane (mean ± std over seeds), the frontier joined by a line, and a
    table of ``fg``, ``pl`` and ``extra`` per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [fg, pl, *extra]
    table = {n: _per_run(result, n, keys) for n in result.runs}
    present = [n for n in table if table[n][fg] and table[n][pl]]
    if not present:
        return ReportExtras()
    means = {n: (_ms(table[n][pl])[0], _ms(table[n][fg])[0]) for n in present}
    fig, ax = plt.subplots(figsize=(4.6, 3.4))
    for n in present:
        (fx, sx), (fy, sy) = _ms(table[n][pl]), _ms(table[n][fg])
        ax.errorbar(fx, fy, xerr=sx, yerr=sy, fmt="o", capsize=2, label=n)
    line = frontier(means)
    if len(line) > 1:
        ax.plot([means[n][0] for n in line], [means[n][1] for n in line], "k--", lw=0.8, label="frontier")
    ax.set_xlabel("plasticity PL (higher = learns more)")
    ax.set_ylabel("forgetting FG (lower = better)")
    ax.legend(fontsize=6)
    ax.set_title(f"{slug}: stability-plasticity, mean ± std over seeds {result.seeds}", fontsize=8)
    fig.tight_layout()
    path = Path(out_dir) / f"{slug}_frontier.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    short = [k.split("/")[-1] for k in keys]
    lines = [f"| run | {' | '.join(short)} |", "|---|" + "---|" * len(keys)]
    for n in present:
        cells = [f"{m:.4g} ± {s:.2g}" for m, s in (_ms(table[n][k]) for k in keys)]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    note = f"\nOn the frontier (no run has both higher PL and lower FG): {', '.join(line)}.\n"
    return ReportExtras(
        figures=[path], markdown="### Stability-plasticity\n\n" + "\n".join(lines) + "\n" + note
    )


CONCEPT_SAMPLES_FILE = "concept_samples.safetensors"


def _strip(images, pad: int = 1):
    """(n, 3, H, W) in [-1, 1] -> one (H, n·(W+pad)−pad, 3) array in [0, 1], white between images."""
    import torch

    x = ((images.clamp(-1, 1) + 1) / 2).permute(0, 2, 3, 1)  # (n, H, W, 3)
    n, h, _, _ = x.shape
    sep = torch.ones(h, pad, 3)
    parts = []
    for i in range(n):
        parts += [x[i]] + ([sep] if i < n - 1 else [])
    return torch.cat(parts, dim=1).numpy()


def concept_samples_report(result: CardResult, out_dir, slug: str) -> ReportExtras:
    """Per-concept sample grid of the first seed (SCNS card): one row per concept k — k's held-out renders that
    the samples start from, the base model under the class-only prompt, then for each run that saved samples its
    samples right after task k and after the last task under "a <V_k> {class}"; every cell of a row starts
    from the same renders and noise (``harness.ContinualNeuronTuning``'s samples). Reads
    ``concept_samples.safetensors`` (``harness.ContinualNeuronTuning``, ``sampling.per_concept`` > 0) from the
    run folders; runs without it are left out. It derives no number a claim reads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from safetensors.torch import load_file

    loaded: dict[str, dict] = {}
    for n, run in result.runs.items():
        path = run.runs[0].run_dir / CONCEPT_SAMPLES_FILE if run.runs else None
        if path is not None and path.exists():
            loaded[n] = load_file(str(path))
    if not loaded:
        return ReportExtras()
    first = next(iter(loaded.values()))
    concepts = sorted(int(k.split("_")[1]) for k in first if k.startswith("final_"))
    cols: list[tuple[str, str, str | None]] = [
        ("held-out renders", "ref", None),
        ("base, class prompt", "base", None),
    ]
    for label in loaded:
        cols += [
            (f"{label}\nafter its task", "after", label),
            (f"{label}\nafter the last task", "final", label),
        ]
    fig, axes = plt.subplots(
        len(concepts), len(cols), figsize=(1.9 * len(cols), 0.75 * len(concepts) + 0.6), squeeze=False
    )
    for r, k in enumerate(concepts):
        for c, (title, kind, label) in enumerate(cols):
            ax = axes[r][c]
            src = first if label is None else loaded[label]
            ax.imshow(_strip(src[f"{kind}_{k}"]), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(f"concept {k}", fontsize=6)
            if r == 0:
                ax.set_title(title, fontsize=6)
    seed = result.seeds[0] if result.seeds else "?"
    fig.suptitle(f"{slug}: samples per concept, seed {seed} (same input and noise across a row)", fontsize=7)
    fig.tight_layout()
    path = Path(out_dir) / f"{slug}_samples.png"
    fig.savefig(path, dpi=130)
    plt.close(fig)
    text = (
        "### Samples per concept\n\n"
        f"First seed ({seed}); rows: concepts in task order; columns: held-out renders of the concept, the base "
        "model under the class-only prompt, then per method its samples right after learning the concept and "
        f'after the last concept (prompt "a <V_k> {{class}}"): {", ".join(loaded)}. Each sample is DDIM (eta 0) '
        "from the render noised to the run's sampling.t_start (SDEdit-style; 0: from pure noise), with the same "
        "render and noise across a row, so the columns differ only by the model and the prompt.\n"
    )
    return ReportExtras(figures=[path], markdown=text)


SAMPLES_FILE = "vsr_samples.safetensors"


def vsr_report(
    result: CardResult,
    out_dir,
    slug: str,
    keys: tuple[str, ...] = ("psnr", "ssim", "tde"),
    steps: tuple[str, ...] = ("k1", "k4", "k8"),
) -> ReportExtras:
    """A table of ``val/{key}_{step}`` of every run (mean ± std over seeds) and the frame grid of the first
    held-out clip of the first seed: LQ (nearest ×s), the output at K = 1 of every run that saved its samples
    (bicubic: its input), HQ; one column per frame. It derives no number a claim reads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from safetensors.torch import load_file

    present = list(result.runs)
    if not present:
        return ReportExtras()
    cols = [f"val/{k}_{s}" for k in keys for s in steps]
    lines = [f"| run | {' | '.join(c.removeprefix('val/') for c in cols)} |", "|---|" + "---|" * len(cols)]
    for n in present:
        table = _per_run(result, n, cols)
        cells = [f"{m:.4g} ± {s:.2g}" for m, s in (_ms(table[c]) for c in cols)]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    markdown = "### Restoration quality (held-out clips)\n\n" + "\n".join(lines) + "\n"
    rows: list[tuple[str, object]] = []
    hq = None
    for n in present:
        path = result.runs[n].runs[0].run_dir / SAMPLES_FILE if result.runs[n].runs else None
        if path is None or not path.exists():
            continue
        s = load_file(str(path))
        if hq is None:
            hq = s["hq"][0]
            rows.append(("LQ (nearest)", s["lq_nearest"][0]))
        rows.append((n, s["sr_k1"][0]))
    figures = []
    if hq is not None:
        rows.append(("HQ", hq))
        frames = hq.shape[1]
        fig, axes = plt.subplots(len(rows), frames, figsize=(1.3 * frames, 1.3 * len(rows)), squeeze=False)
        for r, (label, clip) in enumerate(rows):
            for f in range(frames):
                ax = axes[r][f]
                ax.imshow(
                    ((clip[:, f].clamp(-1, 1) + 1) / 2).permute(1, 2, 0).numpy(), interpolation="nearest"
                )
                ax.set_xticks([])
                ax.set_yticks([])
                if f == 0:
                    ax.set_ylabel(label, fontsize=6)
                if r == 0:
                    ax.set_title(f"frame {f}", fontsize=6)
        fig.suptitle(f"{slug}: first held-out clip, seed {result.seeds[0]}, K = 1", fontsize=7)
        fig.tight_layout()
        path = Path(out_dir) / f"{slug}_frames.png"
        fig.savefig(path, dpi=130)
        plt.close(fig)
        figures.append(path)
    return ReportExtras(figures=figures, markdown=markdown)
