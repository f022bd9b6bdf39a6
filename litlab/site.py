"""``litlab report``: a static site of every card's verdict, claims, controls and figures (runs/site/index.html).

    litlab report                       # every card, into runs/site
    litlab report --cards lokra xkv     # only these cards' pages (the index lists them alone)

Built from the cards' ``recorded:`` blocks, judged afresh under their current claims (as the README's table is,
``litlab.verdicts``), and from ``runs/repro/<slug>/`` where a card was re-run on this machine (its figures,
marked "re-run here" with the date and whether the numbers matched the recorded ones). Plain HTML and CSS with
one small inline script (sorting and filtering); SVG figures drawn once per build; nothing is fetched, so the
site opens from ``file://`` offline.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from litlab.lit_modules.core.errors import CardError
from litlab.lit_modules.core.io import atomic_path, atomic_write_text
from litlab.site_data import CardPage, card_page
from litlab.verdicts import card_rows


def draw_figures(page: CardPage, out: Path) -> None:
    """One SVG per judged claim under ``out/<slug>/``, and the re-run's figures copied beside them."""
    from litlab.site_plots import forest_plot, mechanism_plot  # deferred: matplotlib

    assert page.card is not None
    folder = out / page.slug
    for r in page.results:
        target = folder / f"{r.id}.svg"
        if r.comparisons:
            forest_plot(page.card, r, page.values, target)
        elif r.kind == "mechanism" and r.value is not None:
            mechanism_plot(page.card, r, target)
        else:
            continue
        page.figures[r.id] = f"{page.slug}/{target.name}"
    if page.rerun:
        for fig in page.rerun.figures:
            with atomic_path(folder / "rerun" / fig.name) as tmp:
                shutil.copyfile(fig, tmp)


def build_site(
    out: Path, slugs: list[str] | None = None, repro_root: Path = Path("runs/repro")
) -> list[CardPage]:
    """Write ``out/index.html``, one ``out/<slug>.html`` per card and their figures; returns the pages."""
    from litlab.site_html import render_card, render_index  # deferred: only a build needs the templates

    rows = card_rows()
    if slugs:
        unknown = sorted(set(slugs) - {slug for _, slug, _ in rows})
        if unknown:
            raise CardError(f"no card {unknown} (cards: {', '.join(slug for _, slug, _ in rows)})")
        rows = [row for row in rows if row[1] in slugs]
    pages = []
    for card, slug, error in rows:
        page = CardPage(slug, None, error=error) if card is None else card_page(card, repro_root)
        if page.card is not None:
            draw_figures(page, out)
        atomic_write_text(out / f"{slug}.html", render_card(page))
        pages.append(page)
    atomic_write_text(out / "index.html", render_index(pages))
    return pages


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="litlab report", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, default=Path("runs/site"), help="the site's folder (default runs/site)"
    )
    parser.add_argument("--cards", nargs="+", metavar="SLUG", help="only these cards (default: every card)")
    parser.add_argument(
        "--repro",
        type=Path,
        default=Path("runs/repro"),
        help="where re-runs were written (`litlab repro --out`; default runs/repro)",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        pages = build_site(args.out, args.cards, args.repro)
    except CardError as err:
        print(f"litlab report: {err}", file=sys.stderr)
        return 2
    figures = sum(len(p.figures) for p in pages)
    print(
        f"litlab report: {len(pages)} cards, {figures} figures in {time.perf_counter() - started:.1f} s: "
        f"{args.out / 'index.html'}"
    )
    return 0
