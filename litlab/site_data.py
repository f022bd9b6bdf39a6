"""What ``litlab report`` shows of one card (``litlab.site`` builds the pages, ``litlab.site_html`` renders them):
its verdict and every claim judged on the recorded numbers, its family and arXiv id, a re-run on this machine
(``runs/repro/<slug>/results.json``) against the recorded numbers, and the plan of each scale."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from litlab.cards import PROJECT_ROOT, Card
from litlab.claims import ClaimResult, drift, judge_recorded, recorded_values
from litlab.lit_modules.core.errors import CardError
from litlab.verdicts import Verdict, authors_check_text, verdict
from litlab.verdicts import authors_check as read_authors_check

ARXIV_ID = re.compile(r"arXiv[: ]\s*(\d{4}\.\d{4,5})")


@dataclass
class Rerun:
    """A reproduction of the card run on this machine (``runs/repro/<slug>/results.json``)."""

    date: str
    scale: str
    status: str
    matched: bool | None  # None: nothing to compare (another scale than the recorded one, or no common run)
    detail: str
    figures: list[Path] = field(default_factory=list)


@dataclass
class CardPage:
    """Everything one card's page and index row show."""

    slug: str
    card: Card | None  # None: the card does not load (``error`` says why); it still gets a page
    error: str = ""
    verdict: Verdict | None = None
    results: list[ClaimResult] = field(default_factory=list)  # every claim judged at the recorded scale
    values: dict = field(default_factory=dict)  # run -> metric -> {seed: value}, recorded
    family: str = "—"
    arxiv: str = ""
    authors_check: str = "—"
    rerun: Rerun | None = None
    plans: dict[str, str] = field(default_factory=dict)  # scale -> `litlab repro <slug> --scale <s> --plan`
    figures: dict[str, str] = field(default_factory=dict)  # claim id -> figure path relative to the site


def family(card: Card) -> str:
    """The lit_modules family (peft, continual, rl, ...) of the card's report hook or of its first run's model."""
    found = re.search(r"lit_modules\.(\w+)\.", card.report_hook)
    if found:
        return found.group(1)
    for spec in card.runs.values():
        config = PROJECT_ROOT / spec.config_path(str(card.recorded.get("scale", "quick")))
        with contextlib.suppress(OSError):
            found = re.search(r"class_path:\s*litlab\.lit_modules\.(\w+)\.", config.read_text())
            if found:
                return found.group(1)
    return "—"


def arxiv_id(card: Card) -> str:
    """The paper's arXiv id, where the card cites one: in its venue, else in a headline claim's wording (the
    first one there; a card may cite other papers' ids further on)."""
    for text in (card.venue, *(c.paper for c in card.headlines)):
        found = ARXIV_ID.search(text)
        if found:
            return found.group(1)
    return ""


def authors_check(slug: str) -> str:
    """Whether golden numbers from the authors' code test the method (``tests/fixtures/official/<slug>/SOURCE.json``,
    ``litlab.verdicts.authors_check``): their repository and commit, the functions, the tolerance and what agrees;
    else "no public code" or "not checked yet"."""
    check = read_authors_check(slug)
    if check is None:
        return authors_check_text(slug)
    return f"{authors_check_text(slug)} ({check.checked})"


def plan_text(card: Card, scale: str) -> str:
    """``litlab repro <slug> --scale <scale> --plan``'s lines (what would run; nothing is built)."""
    from litlab.repro import print_plan  # deferred: repro imports Lightning's helpers

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_plan(card, scale, None, None, False)
    return out.getvalue()


def read_rerun(card: Card, repro_dir: Path) -> Rerun | None:
    """The card's re-run in ``repro_dir`` (``litlab repro`` writes results.json there), against the recorded
    numbers under the card's determinism tolerance (``litlab.claims.drift``, as ``--check-recorded`` reads)."""
    path = repro_dir / "results.json"
    if not path.is_file():
        return None
    try:
        res = json.loads(path.read_text())
        scale = str(res["scale"])
        measured = {
            name: {metric: dict(zip(run["seeds"], xs)) for metric, xs in run["metrics"].items()}
            for name, run in res["runs"].items()
        }
    except (ValueError, KeyError, TypeError) as err:
        raise CardError(f"{path}: not a litlab repro results.json ({type(err).__name__}: {err})") from err
    drifts = drift(card, scale, measured)
    tol = card.determinism
    if not drifts:
        recorded = card.recorded.get("scale", "none")
        matched, detail = None, f"nothing to compare: re-run at scale {scale}, recorded at {recorded}"
    else:
        compared, beyond = sum(d.compared for d in drifts), sum(d.beyond for d in drifts)
        worst = max(d.max_abs for d in drifts)
        matched = beyond == 0
        detail = (
            f"{compared} values compared, max |re-run − recorded| {worst:.3g}, "
            + ("all within" if matched else f"{beyond} beyond")
            + f" the card's tolerance ({tol.describe()})"
        )
    names = [Path(f).name for f in res.get("figures") or []] + [f"{card.slug}_{scale}.png"]
    figures = [repro_dir / n for n in dict.fromkeys(names) if (repro_dir / n).is_file()]
    return Rerun(str(res.get("date", "?")), scale, str(res.get("status", "?")), matched, detail, figures)


def card_page(card: Card, repro_root: Path) -> CardPage:
    scale = str(card.recorded.get("scale", "quick"))
    results = judge_recorded(card, scale)
    return CardPage(
        slug=card.slug,
        card=card,
        verdict=verdict(card, results),
        results=results,
        values=recorded_values(card, scale),
        family=family(card),
        arxiv=arxiv_id(card),
        authors_check=authors_check(card.slug),
        rerun=read_rerun(card, repro_root / card.slug),
        plans={s: plan_text(card, s) for s in card.seeds},
    )
