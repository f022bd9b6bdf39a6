"""``litlab report``: the static site is built for every card with every figure it links, and works in a real
browser (Debian's headless Chromium): the index's script runs (filter, sort), a click from the index reaches a
card page whose rendered DOM shows the card's verdict and all its claims. The screenshots of the index and of
that card page are saved to runs/site/ (git-ignored) for a person to look at."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from litlab.site import build_site
from litlab.site import main as report_main
from litlab.verdicts import card_paths

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "runs" / "site"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    return out, {p.slug: p for p in build_site(out)}


def test_every_card_has_a_page_and_every_figure_it_links_exists(site):
    out, pages = site
    slugs = [path.stem for path in card_paths()]
    assert sorted(pages) == slugs
    index = (out / "index.html").read_text()
    missing = [s for s in slugs if not (out / f"{s}.html").is_file() or f'href="{s}.html"' not in index]
    assert not missing, f"cards in seeds/ without a page linked from the index: {missing}"
    for slug, page in pages.items():
        html = (out / f"{slug}.html").read_text()
        linked = re.findall(r'<img[^>]* src="([^"]+)"', html)
        absent = [src for src in linked if not (out / src).is_file()]
        assert not absent, f"{slug}.html links figures that were not written: {absent}"
        assert not re.search(r'(src|href)="(https?:)?//', html), (
            f"{slug}.html loads something from the network"
        )
        # every judged claim with numbers is drawn (comparisons: a forest plot; mechanism: value vs target)
        undrawn = [
            r.id for r in page.results if (r.comparisons or r.value is not None) and r.id not in page.figures
        ]
        assert not undrawn, f"{slug}: judged claims without a figure: {undrawn}"
        assert all(f"{slug}/{r}.svg" in linked for r in page.figures), (
            f"{slug}: a drawn figure is not on its page"
        )
        if page.rerun:
            assert all(f"{slug}/rerun/{f.name}" in linked for f in page.rerun.figures)


def test_report_refuses_an_unknown_card(tmp_path, capsys):
    assert report_main(["--out", str(tmp_path), "--cards", "no_such_card"]) == 2
    assert "no_such_card" in capsys.readouterr().err


def browser() -> str | None:
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def chromium(args: list[str], url: str, profile: Path) -> str:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ]
    done = subprocess.run(
        [browser() or "chromium", *flags, *args, url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"chromium {args} {url}: exit {done.returncode}\n{done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.skipif(
    browser() is None,
    reason=f"no headless browser ({', '.join(BROWSERS)}) on PATH: `apt-get install chromium` (.ci/run does)",
)
def test_the_site_in_headless_chromium(site, tmp_path):
    out, pages = site
    profile = tmp_path / "profile"
    dom = chromium(["--dump-dom"], (out / "index.html").as_uri(), profile)
    rows = re.findall(r'<tr data-family="[^"]*" data-status="([^"]*)"( hidden="")?>', dom)
    assert len(rows) == len(pages) and not any(hidden for _, hidden in rows)
    assert f'<span id="shown">{len(pages)} of {len(pages)} cards shown</span>' in dom, (
        "the index's script did not run"
    )

    # filtered and sorted from the address: the script hides the other statuses' rows and marks the sorted column
    wanted = "inconclusive"
    dom = chromium(["--dump-dom"], (out / "index.html").as_uri() + f"#status={wanted}&sort=wall", profile)
    rows = re.findall(r'<tr data-family="[^"]*" data-status="([^"]*)"( hidden="")?>', dom)
    shown = [status for status, hidden in rows if not hidden]
    expected = sum(p.verdict is not None and p.verdict.status == wanted for p in pages.values())
    assert shown == [wanted] * expected, f"the status filter showed {shown}"
    assert '<th data-key="wall" data-dir="asc">' in dom

    # the click: follow the first shown card's link as the index renders it, and read that page's rendered DOM
    href = re.search(r'<tr data-family="[^"]*" data-status="[^"]*">\s*<td[^>]*><a href="([^"]+)"', dom)
    assert href, "no card link in the index"
    slug = Path(href.group(1)).stem
    card_dom = chromium(["--dump-dom"], (out / href.group(1)).as_uri(), profile)
    page = pages[slug]
    assert page.card is not None and page.verdict is not None
    status = re.search(r'<span id="status"[^>]*>([^<]+)</span>', card_dom)
    assert status and status.group(1) == page.verdict.status
    count = re.search(r'<span id="claim-count">(\d+)</span>', card_dom)
    sections = re.findall(r'<section class="claim" id="claim-([^"]+)"', card_dom)
    assert count and int(count.group(1)) == len(sections) == len(page.card.claims)
    assert sections == [c.id for c in page.card.claims]

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for name, url in (("index", out / "index.html"), (f"card-{slug}", out / href.group(1))):
        shot = SCREENSHOTS / f"{name}.png"
        chromium([f"--screenshot={shot}"], url.as_uri(), profile)
        assert shot.stat().st_size > 10_000, f"{shot}: a blank screenshot"
