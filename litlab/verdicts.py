"""What each card's recorded numbers say, one row a card: ``litlab repro --list`` and the README's table.

Every row is judged afresh from the card's recorded per-seed numbers under its current claims
(``litlab.claims.judge_recorded``), so the table cannot disagree with the cards.
"""

from __future__ import annotations

import json
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


# ---- checked against the authors' code (issue 30) -----------------------------------------------------------------
# The cards whose paper has no public code to check against (searched for each paper, issue 30).
NO_PUBLIC_CODE = frozenset(
    {
        "dare", "gap_init", "janus_lora", "litevsr", "lock_in", "lokra", "lordo", "scns", "sfda_regression",
        "spr_raft", "u3cf",
    }
)  # fmt: skip
OFFICIAL_FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "official"


@dataclass(frozen=True)
class AuthorsCheck:
    """``tests/fixtures/official/<slug>/SOURCE.json``: where the golden numbers came from and what agrees."""

    repo: str  # https://github.com/<owner>/<name>
    commit: str
    functions: tuple[str, ...]  # "<their file>:<their function>"
    ours: tuple[str, ...]
    tolerance: float
    checked: str

    @property
    def name(self) -> str:
        return self.repo.removeprefix("https://github.com/") + "@" + self.commit[:7]

    @property
    def function_names(self) -> str:
        return ", ".join(dict.fromkeys(f.rsplit(":", 1)[-1] for f in self.functions))


def authors_check(slug: str, root: Path = OFFICIAL_FIXTURES) -> AuthorsCheck | None:
    """The card's golden-number fixture, None where ``<root>/<slug>/SOURCE.json`` does not exist."""
    path = root / slug / "SOURCE.json"
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return AuthorsCheck(
            repo=str(raw["repo"]),
            commit=str(raw["commit"]),
            functions=tuple(map(str, raw["functions"])),
            ours=tuple(map(str, raw["ours"])),
            tolerance=float(raw["tolerance"]),
            checked=str(raw["checked"]),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise CardError(f"{path}: not a golden-number SOURCE.json ({type(err).__name__}: {err})") from err


def authors_check_text(slug: str, markdown: bool = False, root: Path = OFFICIAL_FIXTURES) -> str:
    """One cell: the official repository and commit, their functions and the tolerance; "no public code"; or
    "not checked yet". ``markdown``: the repository as a link to the commit (the README)."""
    check = authors_check(slug, root)
    if check is None:
        return "no public code" if slug in NO_PUBLIC_CODE else "not checked yet"
    where = f"[{check.name}]({check.repo}/tree/{check.commit})" if markdown else check.name
    tolerance = "exactly" if check.tolerance == 0 else f"to {check.tolerance:g}"
    return f"{where}: {check.function_names}; {tolerance}"


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
    "checked against the authors' code",
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
            f"{wall_time(card.recorded)} | {card.recorded.get('date', '—')} | {authors_check_text(slug, markdown=True)} |"
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
