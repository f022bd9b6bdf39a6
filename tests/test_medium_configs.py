"""A medium config that is a quick design over more seeds: configs/<slug>/medium.yaml bakes in the card's quick
overrides, so a seed's quick and medium runs resolve to the same config, hash and run id (the NGT and
U³CF cards, issue 35: their quick design needs more seeds than the 5-min quick budget runs)."""

from pathlib import Path

import pytest
import yaml

from litlab.cards import load_card

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("slug", ["ngt", "u3cf"])
def test_card_medium_config_is_the_quick_config_with_the_cards_quick_overrides(slug):
    card = load_card(ROOT / "seeds" / f"{slug}.yaml")
    medium = yaml.safe_load((ROOT / "configs" / slug / "medium.yaml").read_text())
    checked = 0
    for name, spec in card.runs_for("medium").items():
        if spec.config_path("medium") != f"configs/{slug}/medium.yaml":
            continue
        assert spec.scale_overrides.get("medium") is None, name
        quick = yaml.safe_load((ROOT / spec.config_path("quick")).read_text())
        for dotted, value in spec.scale_overrides.get("quick", {}).items():
            *parents, leaf = dotted.split(".")
            node = quick
            for key in parents:
                node = node[key]
            node[leaf] = value
        assert quick == medium, name
        checked += 1
    assert checked >= 2
