"""A reproduction's report: the terminal tables, ``report.md`` and the plot of every run's numbers."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from litlab.cards import Card
from litlab.claims import ClaimResult, recorded_values, seed_std
from litlab.lit_modules.core.io import atomic_path
from litlab.lit_modules.core.results import CardResult


def fmt(x: float | None) -> str:
    if x is None:
        return "—"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return "nan" if math.isnan(x) else (f"{x:.4g}" if abs(x) < 1e4 else f"{x:.3e}")


def claim_label(claim: ClaimResult) -> str:
    return claim.id + (" (headline)" if claim.headline else " (control)" if claim.control else "")


def claim_rows(claim: ClaimResult) -> list[tuple[str, ...]]:
    """(claim, kind, comparison, n, means ± std, d [95% CI], margin, verdict) per compared run."""
    verdict = claim.verdict.upper() + (f": {claim.sensitivity}" if claim.sensitivity else "")
    if claim.kind == "mechanism":
        value = claim.value
        shown = (
            "—" if value is None else (", ".join(map(fmt, value)) if isinstance(value, list) else fmt(value))
        )
        return [(claim_label(claim), claim.kind, shown, "", "", "", "", verdict)]
    if not claim.comparisons:
        return [(claim_label(claim), claim.kind, "", "", "", "", "", f"{verdict} {claim.reason}".strip())]
    return [
        (
            claim_label(claim),
            claim.kind,
            f"vs {c.against}",
            f"{c.n} paired" if c.paired else f"{c.n_method}/{c.n_against}",
            f"{fmt(c.method_mean)} ± {fmt(c.method_std)} vs {fmt(c.against_mean)} ± {fmt(c.against_std)}",
            f"{fmt(c.diff)} [{fmt(c.ci_low)}, {fmt(c.ci_high)}]",
            fmt(c.margin if claim.kind == "better" else -c.margin),
            verdict,
        )
        for c in claim.comparisons
    ]


def render_markdown(card: Card, res: CardResult, command: str) -> str:
    interval = (
        "paired t interval over per-seed differences" if card.pairing == "seed" else "Welch 95 % interval"
    )
    lines = [
        f"# {card.title} — reproduction ({res.scale})",
        "",
        f"**Claim.** {card.claim}",
        "",
        f"Command: `{command}`  ",
        f"Date: {res.date}, seeds {res.seeds}, wall time {res.wall_time_s} s "
        f"({res.reused_runs} of {res.total_runs} runs reused from earlier invocations)",
        "",
        f"**Status: {res.status}** ({res.status_reason}). {card.status_note.strip()}",
        "",
        "## Claims",
        "",
        f"d is the method's improvement over the compared run (positive = better), with a 95 % {interval} "
        "(pairing: "
        + card.pairing
        + "); a `better` claim passes when the interval's low end clears the margin, "
        "a `parity` claim when it clears minus the margin. The headline claims decide the status; the positive "
        "controls show the experiment can see an effect; a headline's minimal detectable effect (half-width + "
        "margin) must not exceed the paper's effect.",
        "",
        "| claim | kind | compared | n | means ± std | d [95 % CI] | needs low end > | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for claim in res.claims:
        lines += ["| " + " | ".join(row) + " |" for row in claim_rows(claim)]
    lines.append("")
    for claim in res.claims:
        text = f"- `{claim.id}`: {claim.paper}" if claim.paper else f"- `{claim.id}`"
        if claim.headline:
            text += f" — paper effect {fmt(claim.paper_effect)}, MDE {fmt(claim.mde)}"
        lines.append(text + (f" — *{claim.note.strip()}*" if claim.note else ""))
    if card.amendments:
        lines += ["", "## Amendments (changed after a recording)", ""]
        lines += [f"- {a.date}: {a.changed} — why: {a.why} — before: {a.old}" for a in card.amendments]
    for title, items in (
        ("Regressions (recorded as passing, failing now)", res.regressions),
        ("Refused claims", res.refutations),
        ("Numbers that moved from the recorded ones", res.mismatches),
    ):
        if items:
            lines += ["", f"## {title}", ""] + [f"- {x}" for x in items]
    lines += [
        "",
        "## Runs",
        "",
        "| run | role | metric | mean ± std | per seed | recorded |",
        "|---|---|---|---|---|---|",
    ]
    recorded = recorded_values(card, res.scale)
    for name, r in res.runs.items():
        for metric, xs in r.metrics.items():
            rec = (recorded.get(name) or {}).get(metric) or {}
            rec_text = ", ".join(fmt(v) for v in rec.values()) or "—"
            lines.append(
                f"| {name} | {card.runs[name].role} | {metric} | {fmt(statistics.fmean(xs))} ± "
                f"{fmt(seed_std(xs))} | {', '.join(fmt(v) for v in xs)} | {rec_text} |"
            )
    lines.append("")
    if res.extras.numbers:
        lines += ["## Derived numbers", "", "| name | value |", "|---|---|"]
        lines += [f"| {k} | {fmt(v)} |" for k, v in res.extras.numbers.items()] + [""]
    if res.extras.markdown:
        lines += [res.extras.markdown.strip(), ""]
    for fig in res.extras.figures:
        lines += [f"![{Path(fig).stem}]({Path(fig).name})", ""]
    if card.paper_numbers:
        lines += ["## Paper's numbers", "", card.paper_numbers.strip(), ""]
    return "\n".join(lines)


def print_table(card: Card, res: CardResult) -> None:
    # rich and matplotlib (plot) load only when a card has run: `litlab repro --list` reads this module too
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 140)  # a log file still gets readable rows
    runs = Table(title=f"{card.slug}: {card.title} ({res.scale}, seeds {res.seeds})")
    for col in ("run", "role", "metric", "mean ± std", "per seed"):
        runs.add_column(col)
    for name, r in res.runs.items():
        for metric, xs in r.metrics.items():
            std = seed_std(xs)
            runs.add_row(
                name,
                card.runs[name].role,
                metric,
                f"{fmt(statistics.fmean(xs))} ± {fmt(std)}",
                ", ".join(fmt(v) for v in xs),
            )
    console.print(runs)
    interval = "paired t" if card.pairing == "seed" else "Welch"
    claims = Table(title=f"claims (d: improvement, {interval} 95 % CI over seeds)")
    for col in ("claim", "kind", "compared", "n", "means ± std", "d [95% CI]", "needs low end >", "verdict"):
        claims.add_column(col)
    for claim in res.claims:
        for row in claim_rows(claim):
            claims.add_row(*row)
    console.print(claims)
    for k, v in res.extras.numbers.items():
        console.print(f"  {k} = {fmt(v)}")
    for label, items in (
        ("REGRESSION", res.regressions),
        ("REFUSED", res.refutations),
        ("MOVED", res.mismatches),
    ):
        for item in items:
            console.print(f"  [bold]{label}[/bold] {item}")
    console.print(
        f"[bold]status: {res.status}[/bold] ({res.status_reason}; {res.wall_time_s} s; "
        f"{res.reused_runs} of {res.total_runs} runs reused)"
    )


def plot(res: CardResult, path: Path) -> None:
    import matplotlib  # see print_table

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[str]] = {}
    for name, r in res.runs.items():
        groups.setdefault(r.metric, []).append(name)
    width = 4 + 1.2 * max(len(v) for v in groups.values()) * len(groups)
    fig, axes = plt.subplots(1, len(groups), figsize=(width, 3.6), squeeze=False)
    for ax, (metric, names) in zip(axes[0], groups.items()):
        runs = [res.runs[n] for n in names]
        # points, not bars from zero: the differences that matter are often small against the values
        for i, r in enumerate(runs):
            ax.scatter([i] * len(r.values), r.values, color="0.6", s=10, zorder=2)
        ax.errorbar(
            range(len(names)),
            [r.mean for r in runs],
            yerr=[r.std for r in runs],
            fmt="o",
            color="tab:blue",
            capsize=4,
            zorder=3,
        )
        ax.set_xlim(-0.5, len(names) - 0.5)
        ax.grid(axis="y", alpha=0.3)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.set_ylabel(metric)
    fig.suptitle(f"{res.slug} ({res.scale}): {res.status}")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
