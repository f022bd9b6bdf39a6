"""The "checked against the authors' code" column (issue 30): every card either has golden numbers from its
authors' repository (``tests/fixtures/official/<slug>/SOURCE.json``, tested by ``tests/test_official_<slug>.py``)
or is listed in ``litlab.verdicts.NO_PUBLIC_CODE``; the README table and the report site read the same file."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest

from litlab.lit_modules.core.errors import CardError
from litlab.site_data import authors_check
from litlab.verdicts import NO_PUBLIC_CODE, OFFICIAL_FIXTURES, authors_check_text, cards_markdown

ROOT = Path(__file__).resolve().parents[1]
SLUGS = sorted(p.stem for p in (ROOT / "seeds").glob("*.yaml"))
CHECKED = sorted(p.parent.name for p in OFFICIAL_FIXTURES.glob("*/SOURCE.json"))


def test_every_card_is_checked_or_has_no_public_code():
    assert set(NO_PUBLIC_CODE) <= set(SLUGS), sorted(set(NO_PUBLIC_CODE) - set(SLUGS))
    assert set(CHECKED) <= set(SLUGS), sorted(set(CHECKED) - set(SLUGS))
    assert not set(CHECKED) & NO_PUBLIC_CODE, sorted(set(CHECKED) & NO_PUBLIC_CODE)
    unchecked = [s for s in SLUGS if authors_check_text(s) == "not checked yet"]
    assert not unchecked, f"cards with public code but no golden numbers: {unchecked}"


@pytest.mark.parametrize("slug", CHECKED)
def test_source_json_names_a_commit_and_our_functions_exist(slug):
    raw = json.loads((OFFICIAL_FIXTURES / slug / "SOURCE.json").read_text())
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", raw["repo"]), raw["repo"]
    assert re.fullmatch(r"[0-9a-f]{40}", raw["commit"]), raw["commit"]
    assert raw["functions"] and all(":" in f for f in raw["functions"])
    assert raw["tolerance"] >= 0 and raw["checked"].strip()
    assert (ROOT / "tests" / f"test_official_{slug}.py").is_file()
    for ref in raw["ours"]:
        module, _, qualname = ref.partition(":")
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)  # AttributeError names the missing function


def test_the_readme_column_and_the_site_read_source_json(tmp_path):
    table = cards_markdown()
    assert "| checked against the authors' code |" in table.splitlines()[0]
    rows = {line.split("`")[1]: line for line in table.splitlines()[2:]}
    assert rows["lokra"].endswith("| no public code |")
    folder = tmp_path / "demo"
    folder.mkdir()
    source = {
        "repo": "https://github.com/owner/name", "commit": "a" * 40, "functions": ["pkg/mod.py:f", "pkg/mod.py:g"],
        "ours": ["litlab.verdicts:authors_check"], "tolerance": 1e-6, "checked": "f and g to 1e-7",
    }  # fmt: skip
    (folder / "SOURCE.json").write_text(json.dumps(source))
    text = authors_check_text("demo", markdown=True, root=tmp_path)
    assert text == f"[owner/name@aaaaaaa](https://github.com/owner/name/tree/{'a' * 40}): f, g; to 1e-06"
    assert authors_check_text("demo", root=tmp_path).startswith("owner/name@aaaaaaa: f, g")
    for slug in CHECKED:
        assert authors_check(slug).endswith(")") and "@" in authors_check(slug)
    (folder / "SOURCE.json").write_text("{}")
    with pytest.raises(CardError, match="demo/SOURCE.json"):
        authors_check_text("demo", root=tmp_path)
