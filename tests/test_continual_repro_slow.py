"""`litlab repro janus_lora` and `litlab repro loda` end to end (a few minutes each on 2 cores): the methods'
effects on the CPU toy as the cards' expectations, and the numbers recorded in the cards."""

from pathlib import Path

import pytest

from litlab.cards import load_card
from litlab.repro import call_report_hook, reproduce

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.parametrize("slug", ["janus_lora", "loda"])
def test_reproduction_matches_recorded_numbers(slug, tmp_path):
    card = load_card(ROOT / "seeds" / f"{slug}.yaml")
    result = reproduce(card, out_root=tmp_path)
    assert result.passed is card.recorded["passed"], result.clauses
    for name, recorded in card.recorded["results"].items():
        measured = result.runs[name]
        # CPU kernels differ slightly between machines: allow a few recorded standard deviations
        assert measured.mean == pytest.approx(recorded["mean"], abs=max(0.02, 3 * recorded["std"])), name
    call_report_hook(card, result, tmp_path / slug)
    assert result.extras.figures[0].stat().st_size > 1000  # the accuracy-matrix heatmaps
    assert result.extras.numbers == {}  # step times: litlab bench continual_steps, not the report
