"""What each card's recorded numbers say, one row a card: ``litlab repro --list`` and the README's table.

Every row is judged afresh from the card's recorded per-seed numbers under its current claims
(``litlab.claims.judge_recorded``), so the table cannot disagree with the cards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from litlab.card_report import fmt
from litlab.cards import PROJECT_ROOT, Card
from litlab.claims import ClaimResult, card_verdict, judge_recorded, load_checked_card
from litlab.lit_modules.core.errors import CardError


@dataclass
class Verdict:
    """One card's answer, from its recorded numbers."""

    card: Card
    status: str
    reason: str
    headlines: list[ClaimResult]
    controls: list[ClaimResult]

    @property
    def n(self) -> str:
        ns = sorted({c.n for c in self.headlines if c.n is not None})
        return ", ".join(map(str, ns)) or "—"

    def headline_text(self) -> str:
        many = len(self.headlines) > 1
        return "<br>".join(
            (f"`{h.id}` " if many else "")
            + h.verdict
            + "".join(
                f"{',' if i else ':'} d = {fmt(c.diff)} [{fmt(c.ci_low)}, {fmt(c.ci_high)}] vs {c.against.split(':')[0]}"
                for i, c in enumerate(h.comparisons)
            )
            for h in self.headlines
        )

    def control_text(self) -> str:
        return "<br>".join(f"`{c.id}` {c.verdict}" for c in self.controls) or "none at this scale"

    def mde_text(self) -> str:
        parts = [f"{fmt(h.mde)} vs {fmt(h.paper_effect)}" for h in self.headlines if h.comparisons]
        return "<br>".join(parts) or "—"


def verdict(card: Card, results: list[ClaimResult] | None = None) -> Verdict:
    """The card's verdict from ``results``, by default every claim judged on its recorded numbers."""
    results = judge_recorded(card) if results is None else results
    status, reason = card_verdict(card, results, str(card.recorded.get("scale", "quick")))
    return Verdict(
        card=card,
        status=status,
        reason=reason,
        headlines=[r for r in results if r.headline],
        controls=[r for r in results if r.control],
    )


def card_paths(cards_dir: Path | None = None) -> list[Path]:
    """The cards of ``cards_dir``; by default the working directory's ``seeds/`` and then litlab's own, a
    user's card shadowing litlab's of the same name."""
    if cards_dir is not None:
        return sorted(cards_dir.glob("*.yaml"))
    found: dict[str, Path] = {}
    for folder in (Path.cwd() / "seeds", PROJECT_ROOT / "seeds"):
        for path in sorted(folder.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return [found[k] for k in sorted(found)]


def card_rows(cards_dir: Path | None = None) -> list[tuple[Card | None, str, str]]:
    out: list[tuple[Card | None, str, str]] = []
    for path in card_paths(cards_dir):
        try:
            out.append((load_checked_card(path), path.stem, ""))
        except CardError as err:
            out.append((None, path.stem, str(err)))
    return out


def wall_time(rec: dict) -> str:
    """The recorded repro's wall time, as the table shows it: only when it timed every run."""
    seconds, reused = rec.get("wall_time_s"), rec.get("reused_runs")
    if seconds is None or reused is None:
        return "not timed"
    if reused:
        return f"{seconds:.0f} s ({reused} runs reused)"
    jobs = re.search(r"--jobs[ =](\d+)", rec.get("command", ""))
    return f"{seconds:.0f} s" + (f", --jobs {jobs.group(1)}" if jobs else "")


COLUMNS = (
    "card",
    "headline claim",
    "headline verdict: d [95 % CI]",
    "status",
    "positive control",
    "MDE vs paper effect",
    "n",
    "wall time",
    "recorded",
)


def cards_markdown(cards_dir: Path | None = None) -> str:
    """The README's methods table (``litlab repro --list --markdown``): the columns of ``litlab report``'s index,
    which adds each headline claim in the paper's words, the seeds and the authors'-code check."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for card, slug, error in card_rows(cards_dir):
        if card is None:
            lines.append(f"| `{slug}` | invalid card: {error} |" + " — |" * (len(COLUMNS) - 2))
            continue
        v = verdict(card)
        claims = "<br>".join(
            f"`{h.id}`" + (f" ({h.requires})" if h.requires and not h.comparisons else "")
            for h in v.headlines
        ) or ", ".join(f"`{c.id}` ({c.requires or 'other scale'})" for c in card.headlines)
        amended = f" ({len(card.amendments)} amendments)" if card.amendments else ""
        lines.append(
            f"| [`{slug}`](seeds/{slug}.yaml) {card.title.split(':')[0]}{amended} | {claims} | "
            f"{v.headline_text() or '—'} | **{v.status}** | {v.control_text()} | {v.mde_text()} | {v.n} | "
            f"{wall_time(card.recorded)} | {card.recorded.get('date', '—')} |"
        )
    return "\n".join(lines) + "\n"


def list_cards(markdown: bool = False) -> int:
    if markdown:
        print(cards_markdown(), end="")
        return 0
    print(
        f"{'card':16s} {'status':27s} {'headline':34s} {'control':8s} {'MDE vs paper effect':22s} n   recorded"
    )
    for card, slug, error in card_rows():
        if card is None:
            print(f"{slug:16s} REFUSED: {error}")
            continue
        v = verdict(card)
        head = ",".join(f"{h.id}:{h.verdict}" for h in v.headlines) or "-"
        control = "pass" if v.controls and all(c.verdict == "pass" for c in v.controls) else "FAIL"
        mde = "; ".join(f"{fmt(h.mde)} vs {fmt(h.paper_effect)}" for h in v.headlines if h.comparisons) or "-"
        rec = card.recorded
        print(
            f"{slug:16s} {v.status:27s} {head[:34]:34s} {control:8s} {mde[:22]:22s} {v.n:3s} "
            f"{rec.get('scale', '-')}, {rec.get('date', 'not recorded')}"
        )
    return 0
