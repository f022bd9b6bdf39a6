"""SCNS §7.8 effect checks (slow): the card's claims on a fresh run of every method at the quick scale's seeds, from an empty run
folder (``litlab repro scns --all``). Each claim is a test; the ones the recorded card reports as not reproduced
are strict xfails, so a change that makes them pass (or breaks a passing one) shows up here."""

from __future__ import annotations

import json

import pytest

from litlab.repro import main as repro_main

CLAIMS = [
    "forgets_less_than_topk",
    "all_rows_learn_more_than_no_update",
    "topk_forgets_more_than_frozen",
    "keeps_topk_plasticity",
    "forgets_less_than_full_kv",
    "keeps_half_full_kv_plasticity",
    "learns_more_than_random",
    "risk_falls_lambda_0_to_10",
    "risk_falls_lambda_10_to_1000",
    "forgetting_falls_lambda_0_to_10",
    "forgetting_falls_lambda_10_to_1000",
]
# as judged at the quick scale (seeds 0-4, paired intervals; the issue-35 stream; the same numbers as the first 5 seeds
# of the card's medium recording): both controls, top-k parity of plasticity and the lambda 10 -> 1000 drops of risk
# and forgetting (below random rows' too) pass; the rest fail at n = 5. At the card's medium scale (18 seeds, judged by
# tests/test_cards_slow.py) the forgetting drop no longer clears random rows' (the card's status_note).
PASSING = {
    "all_rows_learn_more_than_no_update",
    "topk_forgets_more_than_frozen",
    "keeps_topk_plasticity",
    "risk_falls_lambda_10_to_1000",
    "forgetting_falls_lambda_10_to_1000",
}
NOT_REPRODUCED = set(CLAIMS) - PASSING


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    out = tmp_path_factory.mktemp("scns_repro")
    repro_main(["scns", "--jobs", "2", "--all", "--out", str(out)])
    result = json.loads((out / "scns" / "results.json").read_text())
    return {c["id"]: c for c in result["claims"]}, result


@pytest.mark.slow
@pytest.mark.parametrize(
    "claim",
    [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="not reproduced on the recording"))
        if c in NOT_REPRODUCED
        else c
        for c in CLAIMS
    ],
)
def test_effect_claim(fresh, claim):
    claims, result = fresh
    assert not result["refutations"], result["refutations"]
    assert claims[claim]["verdict"] == "pass", claims[claim].get("reason")
