"""The figures of ``litlab report``: one forest plot per claim, drawn from the card's recorded numbers as SVG.

A comparative claim is one row per compared run: the difference d (the method's improvement, > 0 = better) with
its 95 % interval, the margin its low end must clear, the paper's effect, and the per-seed differences behind
the interval. A mechanism claim is its observed value(s) against the target it must meet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from litlab.cards import Card, Ref
from litlab.claims import ClaimResult, Comparison
from litlab.lit_modules.core.io import atomic_path

Values = Mapping[str, Mapping[str, Mapping[int, float]]]

PASS_COLOR, FAIL_COLOR, NEUTRAL = "#1a7f37", "#cf222e", "#57606a"


def _pyplot() -> Any:
    import matplotlib  # deferred: `litlab report --help` and the index need no plotting

    matplotlib.use("Agg")
    # text stays text (smaller files, searchable); no random ids, so a rebuild writes the same bytes
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "litlab", "font.size": 9})
    import matplotlib.pyplot as plt

    return plt


def seed_differences(
    card: Card, method: Ref, comparison: Comparison, values: Values
) -> tuple[list[float], str]:
    """The per-seed points behind a comparison's interval: paired differences where the card pairs seeds,
    otherwise each method seed against the compared run's mean (what the Welch interval compares)."""
    run, _, metric = comparison.against.partition(":")
    ours = (values.get(method.run) or {}).get(method.metric) or {}
    theirs = (values.get(run) or {}).get(metric) or {}
    if not ours or not theirs:
        return [], ""
    sign = 1.0 if card.mode(method.metric) == "max" else -1.0
    if comparison.paired:
        return [sign * (ours[s] - theirs[s]) for s in ours if s in theirs], "per-seed difference"
    mean = sum(theirs.values()) / len(theirs)
    return [sign * (v - mean) for v in ours.values()], "seed − compared mean"


def _finite_span(points: list[float]) -> tuple[float, float]:
    finite = [p for p in points if math.isfinite(p)] or [0.0]
    low, high = min(finite), max(finite)
    pad = 0.08 * (high - low) if high > low else max(abs(high), 1e-6) * 0.5
    return low - pad, high + pad


def forest_plot(card: Card, result: ClaimResult, values: Values, path: Path) -> None:
    """A comparative claim's forest plot (one row per compared run) as SVG at ``path``."""
    plt = _pyplot()
    claim = next(c for c in card.claims if c.id == result.id)
    assert claim.method is not None, f"{card.slug}: claim {claim.id!r} is not comparative"
    rows = list(result.comparisons)
    # the needed low end: the margin for `better`, minus the margin (the equivalence bound) for `parity`
    needs = [c.margin if result.kind == "better" else -c.margin for c in rows]
    seeds = [seed_differences(card, claim.method, c, values) for c in rows]
    span = [x for c in rows for x in (c.diff, c.ci_low, c.ci_high)] + needs + [0.0]
    span += [x for xs, _ in seeds for x in xs]
    if result.paper_effect is not None:
        span.append(result.paper_effect)
    x_low, x_high = _finite_span(span)
    fig, ax = plt.subplots(figsize=(6.6, 0.75 + 0.42 * len(rows)))
    ax.axvline(0.0, color="0.75", lw=0.8, zorder=1)
    for i, (c, need, (points, seed_label)) in enumerate(zip(rows, needs, seeds)):
        y = len(rows) - 1 - i
        holds = c.ci_low > need
        color = PASS_COLOR if holds else FAIL_COLOR
        low, high = max(c.ci_low, x_low), min(c.ci_high, x_high)  # an infinite interval runs off the axes
        ax.plot([low, high], [y, y], color=color, lw=2.2, solid_capstyle="butt", zorder=3)
        ax.plot([c.diff], [y], "o", color=color, ms=6, zorder=4, label="d, 95 % CI" if i == 0 else None)
        ax.plot(
            [need, need],
            [y - 0.3, y + 0.3],
            color="black",
            lw=1.4,
            zorder=3,
            label=("margin" if result.kind == "better" else "−margin") if i == 0 else None,
        )
        if points:
            ax.scatter(
                points,
                [y + 0.18] * len(points),
                s=9,
                color=NEUTRAL,
                alpha=0.7,
                zorder=2,
                label=seed_label if i == 0 else None,
            )
    if result.paper_effect is not None:
        ax.axvline(result.paper_effect, color="#8250df", ls=":", lw=1.4, label="paper's effect")
    labels = [
        f"vs {c.against.split(':')[0]}"
        + ("" if c.against.endswith(":" + claim.method.metric) else f"\n({c.against.split(':', 1)[1]})")
        for c in rows
    ]
    ax.set_yticks(range(len(rows)), labels[::-1])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(x_low, x_high)
    ax.set_xlabel(f"d: improvement in {claim.method.metric} (> 0 = method better)")
    ax.set_title(f"{result.id} ({result.kind}): {result.verdict}", fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.25)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    _save(fig, path, plt)


def mechanism_plot(card: Card, result: ClaimResult, path: Path) -> None:
    """A mechanism claim's observed value(s) against its target as SVG at ``path``."""
    plt = _pyplot()
    claim = next(c for c in card.claims if c.id == result.id)
    observed = (
        result.value if isinstance(result.value, list) else [result.value] if result.value is not None else []
    )
    fig, ax = plt.subplots(figsize=(6.6, 1.15))
    color = PASS_COLOR if result.verdict == "pass" else FAIL_COLOR
    ax.scatter(observed, [0.0] * len(observed), color=color, s=22, zorder=3, label="observed (per seed)")
    ax.axvline(claim.target, color="black", lw=1.4, label=f"target: value {claim.op} {claim.target:g}")
    x_low, x_high = _finite_span([*observed, claim.target])
    ax.set_xlim(x_low, x_high)
    ax.set_yticks([])
    ax.set_xlabel(claim.value)
    ax.set_title(f"{result.id} (mechanism): {result.verdict}", fontsize=9, loc="left")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    _save(fig, path, plt)


def _save(fig: Any, path: Path, plt: Any) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="svg")
    plt.close(fig)
