"""Every card re-run at its recorded scale (quick, or medium where the card records one) from an empty run folder (``tmp_path``), as ``make test-slow`` does.

Per card: each seed's number matches the recorded one within the card's ``determinism`` tolerance (runs are
bit-identical on one CPU thread; the default tolerance is the recording's 6-decimal rounding), no claim
recorded as passing fails, and no comparative claim is refuted by a baseline's numbers. The verdicts come
from the fresh numbers; nothing here reads ``runs/`` or a card's recorded verdict as evidence.
"""

import json
from pathlib import Path

import pytest

from litlab.cards import load_card
from litlab.repro import main as repro_main

ROOT = Path(__file__).resolve().parent.parent
CARDS = sorted(p.stem for p in (ROOT / "seeds").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("slug", CARDS)
def test_card_reruns_from_nothing_and_matches_its_recorded_numbers(slug, tmp_path):
    # at the scale the card recorded: a card whose quick scale cannot see the paper's effect records its medium one
    scale = str(load_card(ROOT / "seeds" / f"{slug}.yaml").recorded.get("scale", "quick"))
    code = repro_main([slug, "--scale", scale, "--jobs", "2", "--out", str(tmp_path), "--check-recorded"])
    result = json.loads((tmp_path / slug / "results.json").read_text())
    assert not result["refutations"], result["refutations"]
    assert not result["regressions"], result["regressions"]
    assert not result["mismatches"], result["mismatches"]
    assert code == 0
