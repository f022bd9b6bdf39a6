"""The reproduction harness on a tiny card: runs, reuse, claims and their statistics, the falsifiability
check, status, recording, and card validation."""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml

from litlab.cards import Ref, check_seed_ledgers, load_card
from litlab.claims import (
    ClaimResult,
    Comparison,
    card_status,
    drift,
    evaluate_claim,
    judge_recorded,
    load_checked_card,
    mismatches,
    paired_interval,
    refutations,
    welch_interval,
)
from litlab.lit_modules.core.errors import CardError
from litlab.lit_modules.core.results import ReportExtras
from litlab.repro import FitRequest, fit_request, override_args, reproduce
from litlab.repro import main as repro_main
from litlab.verdicts import card_rows, cards_markdown, verdict

ROOT = Path(__file__).resolve().parent.parent

TINY_CARD = """
title: Tiny matrix card
venue: test
claim: LoKRA+ fits a diagonal target that LoRA cannot.
metric: {name: val/rel_err, mode: min}
metrics: {val/delta_rank: max}
pairing: seed
scales:
  quick: {seeds: [0, 1, 2]}
runs:
  zero:
    role: floor
    config: configs/lokra/matrix.yaml
    overrides: {model.init_args.mode: lora, model.init_args.lr: 0.0, trainer.max_steps: 150,
                data.init_args.steps_per_epoch: 50}
  lora:
    role: baseline
    config: configs/lokra/matrix.yaml
    overrides: {model.init_args.mode: lora, trainer.max_steps: 150, data.init_args.steps_per_epoch: 50}
  plus:
    role: method
    config: configs/lokra/matrix.yaml
    overrides: {model.init_args.mode: lokra_plus, model.init_args.penalty.lam: 0.0, trainer.max_steps: 150,
                data.init_args.steps_per_epoch: 50}
claims:
  - id: plus_beats_lora
    kind: better
    headline: true
    paper_effect: 0.5
    method: plus
    against: [lora]
    margin: 0.1
    paper: "LoKRA+ fits a diagonal target that LoRA cannot"
  - id: lora_beats_zero
    kind: better
    control: true
    method: lora
    against: [zero]
    margin: 0.03
  - id: plus_is_full_rank
    kind: mechanism
    value: plus:val/delta_rank
    op: ">"
    target: 8
    fails_if: a Khatri-Rao update built as a plain low-rank product (rank <= 8)
"""


def write_card(tmp_path, text=TINY_CARD, name="tiny.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_harness_runs_reuses_and_reports(tmp_path, capsys):
    card = load_card(write_card(tmp_path))
    res = reproduce(card, out_root=tmp_path / "repro")
    headline, control, mechanism = res.claims
    assert headline.verdict == "pass" and headline.headline and control.verdict == "pass" and control.control
    (vs_lora,) = headline.comparisons
    assert vs_lora.paired and vs_lora.n == 3 and vs_lora.ci_low > 0.1
    assert vs_lora.diff == pytest.approx(res.runs["lora"].mean - res.runs["plus"].mean)  # min: lower wins
    assert headline.mde == pytest.approx(vs_lora.half_width + 0.1) and headline.mde <= 0.5
    assert mechanism.verdict == "pass" and mechanism.value == [64.0, 64.0, 64.0]
    assert res.status == "reproduced" and not res.refutations and not res.regressions
    # one fit serves every metric it logs: the floor's rank is read too (a stand-in for rank claims)
    assert (
        res.runs["plus"].metrics["val/delta_rank"] == [64.0] * 3
        and "val/delta_rank" in res.runs["zero"].metrics
    )
    assert res.runs["zero"].values == [1.0, 1.0, 1.0]  # lr 0: nothing adapts
    assert len(res.runs["lora"].values) == 3 and res.runs["lora"].std > 0
    assert not any(r.reused for r in res.runs["lora"].runs)
    for run in res.runs.values():  # every summary keeps its seed ledger; the run seed is the card seed
        for r in run.runs:
            assert json.loads((r.run_dir / "summary.json").read_text())["seed_ledger"]["run_seed"] == r.seed
    again = reproduce(card, out_root=tmp_path / "repro")  # an interrupted repro resumes: nothing re-runs
    assert all(r.reused for run in again.runs.values() for r in run.runs)
    assert again.runs["lora"].values == res.runs["lora"].values


def test_command_reports_claims_and_fails_only_on_a_regression(tmp_path, capsys):
    out = tmp_path / "repro"
    path = write_card(tmp_path)
    assert repro_main([str(path), "--out", str(out), "--record"]) == 0
    files = {p.name for p in (out / "tiny").iterdir()}
    assert {"report.md", "results.json", "tiny_quick.png"} <= files
    report = (out / "tiny" / "report.md").read_text()
    assert "**Status: reproduced**" in report
    assert "| plus_beats_lora (headline) | better | vs lora:val/rel_err | 3 paired |" in report
    assert "| zero | floor | val/rel_err | 1 ± 0 |" in report
    saved = json.loads((out / "tiny" / "results.json").read_text())
    assert saved["status"] == "reproduced" and saved["claims"][0]["comparisons"][0]["ci_low"] > 0.1
    assert "status: reproduced" in capsys.readouterr().out
    # the same claim id, now asking for more than the runs show: it was recorded as passing, so exit 1; the
    # changed margin also needs an amendment (pre-registration), so the check is switched off here
    raised = path.read_text().replace("margin: 0.1\n", "margin: 0.7\n")
    path.write_text(raised)
    with pytest.raises(CardError, match="no amendment says so"):
        load_card(path)
    sha = load_card(path, check_preregistration=False).claims_sha256()
    amendment = f"amendments:\n  - {{date: '2026-12-06', changed: margin 0.7, why: test, old: 0.1, claims_sha256: {sha}}}\n"
    path.write_text(raised.replace("recorded:", amendment + "recorded:", 1))
    assert repro_main([str(path), "--out", str(out)]) == 1  # same runs, reused
    assert "2026-12-06: margin 0.7 — why: test — before: 0.1" in (out / "tiny" / "report.md").read_text()


def test_a_sensitive_failing_headline_is_not_reproduced_and_a_blind_one_inconclusive(tmp_path):
    out = tmp_path / "repro"
    # the baseline as the "method": it fails, and the interval + margin is below the paper's effect
    flipped = TINY_CARD.replace(
        "    method: plus\n    against: [lora]", "    method: lora\n    against: [plus]"
    )
    assert repro_main([str(write_card(tmp_path, flipped, "flipped.yaml")), "--out", str(out)]) == 0
    res = json.loads((out / "flipped" / "results.json").read_text())
    assert res["status"] == "not reproduced" and res["claims"][0]["verdict"] == "fail"
    assert "does not clear margin 0.1" in res["status_reason"]
    # a margin above the paper's effect: the experiment could not see an effect of the paper's size
    blind = TINY_CARD.replace("margin: 0.1\n", "margin: 5.0\n")
    assert repro_main([str(write_card(tmp_path, blind, "blind.yaml")), "--out", str(out)]) == 0
    res = json.loads((out / "blind" / "results.json").read_text())
    assert res["status"] == "inconclusive" and "minimal detectable effect" in res["status_reason"]
    # a positive control that fails: inconclusive whatever the method did
    deaf = TINY_CARD.replace("margin: 0.03\n", "margin: 3.0\n")
    assert repro_main([str(write_card(tmp_path, deaf, "deaf.yaml")), "--out", str(out)]) == 0
    res = json.loads((out / "deaf" / "results.json").read_text())
    assert res["status"] == "inconclusive" and "positive control lora_beats_zero fail" in res["status_reason"]


def ratio_hook(res, out_dir):
    """A report hook as a card names it: reads each seed's run folder, writes a figure, derives a number."""
    lora = [r.summary_metrics()["val/rel_err"] for r in res.runs["lora"].runs]
    figure = out_dir / "extra.png"
    figure.write_bytes(b"png")
    return ReportExtras(
        figures=[figure],
        markdown="## Extra section",
        numbers={"plus_over_lora": res.runs["plus"].mean / lora[0]},
    )


HOOK_CLAIM = """  - id: ratio_small
    kind: mechanism
    value: derived.plus_over_lora
    op: "<"
    target: 0.5
    fails_if: test
report_hook: tests.test_repro:ratio_hook
"""


def test_report_hook_adds_figures_sections_and_derived_claims(tmp_path, monkeypatch):
    # importing litlab takes the checkout root off sys.path (its kernels/ would shadow Hugging Face's kernels),
    # so `tests.test_repro` is not importable by name: the hook lives in a module of its own in tmp_path
    import inspect

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    source = "from litlab.lit_modules.core.results import ReportExtras\n\n\n" + inspect.getsource(ratio_hook)
    (hooks / "tiny_card_hooks.py").write_text(source)
    monkeypatch.syspath_prepend(str(hooks))
    claim = HOOK_CLAIM.replace("tests.test_repro:ratio_hook", "tiny_card_hooks:ratio_hook")
    path = write_card(tmp_path, TINY_CARD + claim)
    out = tmp_path / "repro"
    # a hook outside litlab runs code: refused before any run unless the user names its module
    assert repro_main([str(path), "--out", str(out), "--only", "lora,plus"]) == 2
    assert not (out / "tiny").exists()
    args = [
        str(path),
        "--out",
        str(out),
        "--only",
        "lora,plus",
        "--record",
        "--trust-hooks",
        "tiny_card_hooks",
    ]
    assert repro_main(args) == 0
    report = (out / "tiny" / "report.md").read_text()
    assert "## Extra section" in report and "![extra](extra.png)" in report and "plus_over_lora" in report
    card = load_card(path)
    ratio = card.recorded["derived"]["plus_over_lora"]
    assert 0 < ratio < 0.5 and card.recorded["claims"]["ratio_small"]["value"] == round(ratio, 6)
    assert card.recorded["claims"]["lora_beats_zero"]["verdict"] == "skipped"  # zero not run
    # a partial invocation keeps derived numbers it did not give; a full one writes only what the hook gives now
    assert "derived: {plus_over_lora:" in path.read_text()
    path.write_text(path.read_text().replace("derived: {", "derived: {gone_from_the_hook: 1.0, ", 1))
    assert repro_main(args) == 0
    assert load_card(path).recorded["derived"]["gone_from_the_hook"] == 1.0
    assert repro_main([a for a in args if a not in ("--only", "lora,plus")]) == 0
    assert set(load_card(path).recorded["derived"]) == {"plus_over_lora"}
    bad = write_card(tmp_path, TINY_CARD + "report_hook: tests.test_repro\n", "bad.yaml")
    with pytest.raises(CardError, match="report_hook must be"):
        load_card(bad)


def test_only_runs_a_subset_and_skips_the_claims_it_cannot_judge(tmp_path):
    card = load_card(write_card(tmp_path))
    res = reproduce(card, only=["plus"], out_root=tmp_path / "repro")
    assert list(res.runs) == ["plus"] and [c.verdict for c in res.claims] == ["skipped", "skipped", "pass"]
    assert res.status == "not run" and "lora" in res.claims[0].reason
    with pytest.raises(CardError, match="unknown runs \\['nope'\\]"):
        reproduce(card, only=["nope"], out_root=tmp_path / "repro")


def test_record_writes_per_seed_numbers_and_claims_into_the_card(tmp_path):
    path = write_card(tmp_path)
    repro_main([str(path), "--out", str(tmp_path / "repro"), "--record"])
    card = load_card(path)
    rec = card.recorded
    assert rec["status"] == "reproduced" and rec["seeds"] == [0, 1, 2]
    assert rec["claims_sha256"] == card.claims_sha256()  # what the numbers were judged under
    assert set(rec["results"]) == {"zero", "lora", "plus"} and rec["results"]["lora"]["seeds"] == [0, 1, 2]
    assert rec["results"]["plus"]["metrics"]["val/delta_rank"]["values"] == [64.0] * 3
    headline = rec["claims"]["plus_beats_lora"]
    vs = headline["vs"]["lora:val/rel_err"]
    assert vs["n"] == 3 and vs["paired"] and vs["ci95"][0] > 0.1 and vs["margin"] == 0.1
    assert headline["role"] == "headline" and headline["paper_effect"] == 0.5 and headline["mde"] < 0.5
    assert card.title == "Tiny matrix card"  # the rest of the card is untouched


def test_check_recorded_compares_every_seed_with_the_determinism_tolerance(tmp_path):
    path = write_card(tmp_path)
    out = str(tmp_path / "repro")
    repro_main([str(path), "--out", out, "--record"])
    assert repro_main([str(path), "--out", out, "--check-recorded"]) == 0  # bit-identical on CPU
    data = yaml.safe_load(path.read_text())
    data["recorded"]["results"]["lora"]["metrics"]["val/rel_err"]["values"][1] += 1e-4  # one seed moved
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert repro_main([str(path), "--out", out, "--check-recorded"]) == 1
    report = (tmp_path / "repro" / "tiny" / "report.md").read_text()
    assert "lora val/rel_err seed 1: measured" in report
    data["determinism"] = {"atol": 1e-3}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert repro_main([str(path), "--out", out, "--check-recorded"]) == 0
    # a wall-clock metric (a latency) is recorded but never compared: no tolerance covers another machine's load
    data["recorded"]["results"]["plus"]["metrics"]["val/delta_rank"]["values"][0] += 5.0
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert repro_main([str(path), "--out", out, "--check-recorded"]) == 1
    data["determinism"] = {"atol": 1e-3, "wall_clock": ["val/delta_rank"]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert repro_main([str(path), "--out", out, "--check-recorded"]) == 0
    data["determinism"] = {"atol": 1e-3, "wall_clock": "val/delta_rank"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CardError, match="determinism.wall_clock must be a list"):
        load_card(path)


def test_a_metric_can_carry_its_own_determinism_tolerance(tmp_path):
    """One card-wide atol, set by the metric that drifts most (a x100 score), would mark every verdict on a 0-1
    metric fragile and let it drift unchecked; ``metric_atol`` gives that metric its own measured tolerance,
    used by ``--check-recorded`` (mismatches, drift) and by the fragility test alike."""
    path = write_card(tmp_path)
    record_values(path, VALUES)

    def with_tolerance(det):
        data = yaml.safe_load(path.read_text())
        data["determinism"] = det
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return load_card(path)

    card = with_tolerance({"atol": 0.5})
    fragile = {r.id: r.fragile for r in judge_recorded(card)}
    assert fragile["plus_beats_lora"] and not fragile["plus_is_full_rank"]  # 0.82 apart, shifted 0.5 each way
    card = with_tolerance({"atol": 0.5, "metric_atol": {"val/rel_err": 0.01, "val/delta_rank": 60}})
    fragile = {r.id: r.fragile for r in judge_recorded(card)}
    assert not fragile["plus_beats_lora"] and fragile["plus_is_full_rank"]  # 64 - 60 is not > 8
    assert "val/delta_rank 60" in card.determinism.describe()
    moved = {run: {m: dict(v) for m, v in ms.items()} for run, ms in VALUES.items()}
    moved["plus"]["val/delta_rank"][0] += 30.0  # within its own 60
    assert mismatches(card, "quick", moved) == []
    moved["plus"]["val/rel_err"][1] += 0.02  # within the card-wide 0.5, beyond its own 0.01
    (problem,) = mismatches(card, "quick", moved)
    assert problem.startswith("plus val/rel_err seed 1")
    assert {d.run: d.beyond for d in drift(card, "quick", moved)}["plus"] == 1
    with pytest.raises(CardError, match="metric_atol names \\['val/nope'\\]"):
        with_tolerance({"atol": 0.5, "metric_atol": {"val/nope": 1.0}})
    with pytest.raises(CardError, match="metric_atol must map metric names to tolerances >= 0"):
        with_tolerance({"atol": 0.5, "metric_atol": {"val/rel_err": -1.0}})


BEATS_FLOOR = """  - id: plus_beats_zero
    kind: better
    method: plus
    against: [zero]
    margin: 0.01
"""
PARITY_CLAIM = """  - id: plus_matches_lora
    kind: parity
    method: plus
    against: [lora]
    margin_rel: 100.0
"""
VALUES = {
    "zero": {"val/rel_err": {0: 1.0, 1: 1.0, 2: 1.0}},
    "lora": {"val/rel_err": {0: 0.93, 1: 0.94, 2: 0.935}},
    "plus": {"val/rel_err": {0: 0.1, 1: 0.11, 2: 0.12}, "val/delta_rank": {0: 64.0, 1: 64.0, 2: 64.0}},
}


def record_values(path, values):
    """Write ``values`` (run -> metric -> seed -> value) into the card at ``path`` as its recorded block."""
    card = yaml.safe_load(path.read_text())
    card["recorded"] = {
        "scale": "quick",
        "seeds": [0, 1, 2],
        "results": {
            n: {"seeds": [0, 1, 2], "metrics": {m: {"values": list(v.values())} for m, v in ms.items()}}
            for n, ms in values.items()
        },
    }
    path.write_text(yaml.safe_dump(card, sort_keys=False))


def test_a_claim_that_cannot_tell_the_method_from_a_baseline_is_refused(tmp_path, capsys):
    """Falsifiability over roles: "the method beats the floor" also holds for the baseline in the method's
    place, so it says nothing of the method; refused at record time on fresh numbers and at load time on
    recorded ones, and shown by --null. The claim's own compared runs are not stand-ins."""
    path = write_card(tmp_path, TINY_CARD + BEATS_FLOOR)
    out = str(tmp_path / "repro")
    assert repro_main([str(path), "--out", out, "--record"]) == 2
    assert "cannot tell plus:val/rel_err from lora:val/rel_err" in capsys.readouterr().err
    assert "recorded" not in yaml.safe_load(path.read_text())  # nothing recorded
    card = load_card(path)
    (problem,) = refutations(card, VALUES)
    assert "plus_beats_zero" in problem and "add lora to its 'against'" in problem
    fixed = TINY_CARD + BEATS_FLOOR.replace("against: [zero]", "against: [zero, lora]")
    assert refutations(load_card(write_card(tmp_path, fixed, "fixed.yaml")), VALUES) == []
    # a parity claim loose enough for the floor to pass it too
    parity = load_card(write_card(tmp_path, TINY_CARD + PARITY_CLAIM, "parity.yaml"))
    (problem,) = refutations(parity, VALUES)
    assert "plus_matches_lora" in problem and "zero" in problem
    # a floor of another task (setting) is no stand-in: the parity claim is then left with none at all
    other_task = (TINY_CARD + PARITY_CLAIM).replace(
        "    role: floor\n", "    role: floor\n    setting: flat\n"
    )
    (problem,) = refutations(load_card(write_card(tmp_path, other_task, "other.yaml")), VALUES)
    assert "no baseline or floor run with values of val/rel_err could fail it" in problem
    # listing the surviving floor among a parity claim's references does not hide it
    hidden = TINY_CARD + PARITY_CLAIM.replace("against: [lora]", "against: [lora, zero]")
    problems = refutations(load_card(write_card(tmp_path, hidden, "hidden.yaml")), VALUES)
    assert any("cannot tell plus:val/rel_err from zero:val/rel_err" in p for p in problems), problems
    tight = TINY_CARD + PARITY_CLAIM.replace("margin_rel: 100.0", "margin_rel: 0.05")
    assert refutations(load_card(write_card(tmp_path, tight, "tight.yaml")), VALUES) == []
    record_values(path, VALUES)
    with pytest.raises(
        CardError, match="refused, on its recorded numbers: claim 'plus_beats_zero' cannot tell"
    ):
        load_checked_card(path)
    assert repro_main([str(path), "--null"]) == 2
    shown = capsys.readouterr().out
    assert "plus_beats_zero" in shown and "lora:val/rel_err" in shown and "HOLDS: refused" in shown
    assert "plus_beats_lora                    pass     zero:val/rel_err" in shown  # checked, fails: fine


def test_rejudge_writes_the_verdicts_of_the_recorded_numbers_under_amended_claims(tmp_path, capsys):
    path = write_card(tmp_path)
    record_values(path, VALUES)
    assert repro_main([str(path), "--rejudge"]) == 0
    rec = load_card(path).recorded
    assert rec["status"] == "reproduced" and rec["claims"]["plus_beats_lora"]["verdict"] == "pass"
    sha = rec["claims_sha256"]
    # the paper's effect was smaller than the interval: an amendment, then the status follows
    text = path.read_text().replace("paper_effect: 0.5", "paper_effect: 0.05")
    path.write_text(text)
    assert repro_main([str(path), "--rejudge"]) == 2  # refused: no amendment
    assert "no amendment says so" in capsys.readouterr().err
    new_sha = load_card(path, check_preregistration=False).claims_sha256()
    text = text.replace(
        "recorded:",
        f"amendments:\n- {{date: x, changed: paper_effect, why: y, old: '0.5', claims_sha256: {new_sha}}}\nrecorded:",
    )
    path.write_text(text)
    assert repro_main([str(path), "--rejudge"]) == 0
    rec = load_card(path).recorded
    assert rec["status"] == "inconclusive" and rec["claims_sha256"] == sha  # the measured-under hash stays


def test_welch_interval_matches_scipy():
    from scipy import stats

    a, b = [0.31, 0.35, 0.29, 0.4], [0.5, 0.42, 0.47]
    diff, low, high = welch_interval(a, b, sign=1.0)
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (diff, low, high) == pytest.approx((sum(a) / 4 - sum(b) / 3, ci.low, ci.high))
    assert welch_interval([2.0, 2.0, 2.0], [1.0, 1.0, 1.0], sign=-1.0) == (
        -1.0,
        -1.0,
        -1.0,
    )  # a ledger: exact
    assert welch_interval([1.0], [0.0, 0.1], sign=1.0)[1] == float("-inf")  # one seed proves nothing


def test_paired_interval_matches_scipy():
    from scipy import stats

    a, b = [0.31, 0.35, 0.29, 0.4], [0.5, 0.42, 0.47, 0.45]
    diff, low, high = paired_interval([x - y for x, y in zip(a, b)])
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert (diff, low, high) == pytest.approx((sum(a) / 4 - sum(b) / 4, ci.low, ci.high))


def _result(cid, verdict, headline=False, control=False, half=0.1, margin=0.0, effect=0.5, n=5):
    comp = Comparison("b:m", 1, 0, 0, 0, n, n, 0.5, 0.5 - half, 0.5 + half, margin, paired=True, n_pairs=n)
    return ClaimResult(
        cid,
        "better",
        verdict,
        headline=headline,
        control=control,
        comparisons=(comp,),
        paper_effect=effect if headline else None,
    )


def test_card_status_the_headline_decides_and_controls_show_the_experiment_can_see():
    control = _result("c", "pass", control=True)
    assert card_status([_result("h", "pass", headline=True), control])[0] == "reproduced"
    assert card_status([_result("h", "fail", headline=True), control])[0] == "not reproduced"
    assert (
        card_status([_result("h", "pass", headline=True), _result("c", "fail", control=True)])[0]
        == "inconclusive"
    )
    assert card_status([_result("h", "fail", headline=True)])[0] == "inconclusive"  # no control
    blind = _result("h", "pass", headline=True, half=0.3, margin=0.25)  # MDE 0.55 > 0.5
    assert card_status([blind, control])[0] == "inconclusive"
    few = _result("h", "pass", headline=True, half=0.3, n=3)  # interval 0.6 wide > 0.5 with 3 seeds
    assert "< 5 seeds" in card_status([few, control])[1]
    assert card_status([_result("h", "pass", headline=True, half=0.3, n=5), control])[0] == "reproduced"
    # secondary claims never set the status
    assert (
        card_status([_result("h", "pass", headline=True), control, _result("s", "fail")])[0] == "reproduced"
    )
    # parity: the margin is the equivalence bound, so the MDE is the interval's half-width alone
    comp = Comparison("b:m", 1, 0, 1, 0, 5, 5, 0.0, -0.1, 0.1, 0.5, paired=True, n_pairs=5, parity=True)
    parity = ClaimResult("p", "parity", "pass", headline=True, comparisons=(comp,), paper_effect=0.5)
    assert parity.mde == pytest.approx(0.1) and card_status([parity, control])[0] == "reproduced"
    gpu = ClaimResult("h", "better", "unrun", headline=True, reason="needs a GPU (requires: cuda)")
    assert card_status([gpu, control]) == ("not testable at this scale", "h: needs a GPU (requires: cuda)")


def test_a_run_has_one_seed_passed_as_a_request(tmp_path):
    templated = TINY_CARD.replace(
        "overrides: {model.init_args.mode: lora,", 'overrides: {data.init_args.seed: "{seed}",', 1
    )
    with pytest.raises(CardError, match="seeds are not templated"):
        load_card(write_card(tmp_path, templated))
    request = fit_request(load_card(write_card(tmp_path)), "zero", "quick", 7, tmp_path, ["--x=1"])
    assert request.seed == 7 and FitRequest.from_json(json.loads(json.dumps(request.to_json()))) == request
    args = request.cli_args()
    assert "--seed_everything=7" in args and args[-1] == "--x=1" and not any("seed=" in a for a in args[2:-5])


def test_seed_streams_are_derived_by_name(monkeypatch):
    from litlab.lit_modules.core.seeding import derive_seed, reset_ledger, seed_ledger

    monkeypatch.setenv("PL_GLOBAL_SEED", "3")
    reset_ledger(3)
    data, backbone = derive_seed("data"), derive_seed("backbone")
    assert data != backbone and derive_seed("data") == data and derive_seed("target", fixed=1) == 1
    assert seed_ledger() == {
        "run_seed": 3,
        "components": {"backbone": backbone, "data": data, "target": 1},
        "artefacts": {},
    }
    monkeypatch.setenv("PL_GLOBAL_SEED", "4")
    assert derive_seed("data") != data  # another run seed, another stream
    with pytest.raises(ValueError, match="component needs a name"):
        derive_seed("")


def test_card_refuses_components_shared_across_seeds(tmp_path):
    card = load_card(write_card(tmp_path))

    def ledger(seed, backbone_fp, target=1):
        return {
            "run_seed": seed,
            "components": {"data": 100 + seed, "target": target},
            "artefacts": {"backbone": backbone_fp},
        }

    varied = {"plus": {s: ledger(s, f"fp{s}", target=s) for s in (0, 1, 2)}}
    assert check_seed_ledgers(card, varied) == []
    # a broken card: every seed trained on the same cached backbone, and a pinned target
    broken = {"plus": {s: ledger(s, "same") for s in (0, 1, 2)}}
    problems = check_seed_ledgers(card, broken)
    assert len(problems) == 2 and "'backbone' has the same artefact fingerprint" in problems[1]
    assert "'target' has the same seed for card seeds [0, 1, 2]" in problems[0]
    shared = TINY_CARD.replace(
        "pairing: seed", "pairing: seed\nshared: {backbone: a real pretrained model, target: fixed}"
    )
    assert check_seed_ledgers(load_card(write_card(tmp_path, shared, "s.yaml")), broken) == []
    # shared at one scale only (a full scale's one data file): the quick scale still refuses it
    per_scale = TINY_CARD.replace(
        "  quick: {seeds: [0, 1, 2]}",
        "  quick: {seeds: [0, 1, 2]}\n  full: {seeds: [0, 1, 2], shared: {backbone: one file, target: fixed}}",
    )
    per_scale_card = load_card(write_card(tmp_path, per_scale, "p.yaml"))
    assert check_seed_ledgers(per_scale_card, broken, "full") == []
    assert len(check_seed_ledgers(per_scale_card, broken, "quick")) == 2
    assert "no seed_ledger" in check_seed_ledgers(card, {"plus": {0: None, 1: ledger(1, "a")}})[0]
    with pytest.raises(CardError, match="'shared' maps each seed component"):
        load_card(
            write_card(tmp_path, TINY_CARD.replace("pairing: seed", "pairing: seed\nshared: [x]"), "b.yaml")
        )


@pytest.mark.parametrize(
    "mutation,message",
    [
        (
            ("metric: {name: val/rel_err, mode: min}", "metric: {name: val/rel_err, mode: lowest}"),
            "metric.mode",
        ),
        (("venue: test", "venue: test\nauthor: me"), "unknown keys \\['author'\\]"),
        (("  plus:\n", "  plus-x:\n"), "must be an identifier"),
        (("against: [lora]", "against: [lorra]"), "claim 'plus_beats_lora' names unknown run 'lorra'"),
        (("margin: 0.1", "margin: -0.1"), "the margin must be >= 0"),
        (("kind: better", "kind: bigger"), "kind must be one of"),
        (('    op: ">"\n', ""), "a mechanism claim needs"),
        (("    fails_if: a Khatri-Rao", "    note: a Khatri-Rao"), "needs 'fails_if'"),
        (("against: [lora]", "against: [lora:val/delta_rank]"), "compares different metrics"),
        (("margin: 0.1", "margin: 0.1\n    same_units: maybe"), "same_units must be true or false"),
        (("seeds: [0, 1, 2]", "seeds: [0, 1]"), "at least 3 distinct seeds"),
        (("claim: LoKRA+ fits a diagonal target that LoRA cannot.\n", ""), "missing required key 'claim'"),
        (("pairing: seed\n", ""), "missing required key 'pairing'"),
        (("pairing: seed", "pairing: yes"), "pairing must be 'seed'"),
        (("    role: floor\n", ""), "runs.zero.role must be one of"),
        (("    role: floor\n", "    role: floor\n    mode: max\n"), "a run's 'mode' is gone"),
        (("metrics: {val/delta_rank: max}\n", ""), "which 'metrics:' does not list"),
        (("    headline: true\n    paper_effect: 0.5\n", ""), "no headline claim"),
        (("    headline: true\n", ""), "paper_effect belongs to headline claims"),
        (("    paper_effect: 0.5\n", ""), "needs 'paper_effect'"),
        (("    control: true\n", ""), "no positive control"),
        (
            ("    method: lora\n    against: [zero]", "    method: zero\n    against: [lora]"),
            "a positive control compares",
        ),
        (("    margin: 0.03\n", "    margin: 0.03\n    controls: [zero]\n"), "parity 'controls' are gone"),
        (
            (
                "    config: configs/lokra/matrix.yaml\n    overrides: {model.init_args.mode: lora, trainer",
                "    overrides: {model.init_args.mode: lora, trainer",
            ),
            "runs.lora needs a 'config'",
        ),
    ],
)
def test_card_validation_names_the_problem(tmp_path, mutation, message):
    bad = write_card(tmp_path, TINY_CARD.replace(*mutation, 1))
    with pytest.raises(CardError, match=message):
        load_card(bad)


def test_same_units_lets_a_claim_compare_two_scalars_of_one_fit(tmp_path):
    """Two scalars of one kind (two orderings' AUCs logged by one analysis fit) may be compared when the claim
    says so; the refusal without it is tested above."""
    text = TINY_CARD.replace("against: [lora]", "against: [lora:val/delta_rank]", 1).replace(
        "margin: 0.1", "margin: 0.1\n    same_units: true", 1
    )
    card = load_card(write_card(tmp_path, text))
    claim = next(c for c in card.claims if c.id == "plus_beats_lora")
    assert claim.same_units and claim.against == (Ref("lora", "val/delta_rank"),)
    assert card.metrics_of("lora") == ["val/rel_err", "val/delta_rank"]


def test_a_censored_claim_compares_the_fraction_of_seeds_that_reach(tmp_path):
    """``censored: true``: a non-finite value (a target not reached) is never averaged; with one on either side the
    claim compares the fractions of seeds that reach (paired indicators, margin 0); finite everywhere, the values."""
    text = TINY_CARD.replace("margin: 0.1\n", "margin: 0.1\n    censored: true\n", 1)
    card = load_card(write_card(tmp_path, text))
    claim = next(c for c in card.claims if c.id == "plus_beats_lora")
    assert (
        claim.censored and card.claims_sha256() != load_card(write_card(tmp_path, TINY_CARD)).claims_sha256()
    )
    inf = math.inf

    def judged(plus, lora):
        values = {
            "plus": {"val/rel_err": dict(enumerate(plus))},
            "lora": {"val/rel_err": dict(enumerate(lora))},
        }
        return evaluate_claim(card, claim, values, {})

    every = judged([0.1, 0.2, 0.1], [0.9, 0.8, 0.9])  # all finite: the usual paired interval, margin 0.1
    assert (
        every.holds
        and not every.comparisons[0].reach
        and every.mde == pytest.approx(every.comparisons[0].mde)
    )
    never = judged([0.1, 0.2, 0.1], [inf, inf, inf])  # the method reaches on every seed, LoRA on none
    c = never.comparisons[0]
    assert (
        never.holds and c.reach and (c.method_mean, c.against_mean, c.diff, c.ci_low) == (1.0, 0.0, 1.0, 1.0)
    )
    assert never.mde is None and never.sensitivity == "" and c.margin == 0.0
    mixed = judged([0.1, inf, 0.1], [inf, 0.01, 0.01])  # 2 of 3 each: no difference in reach, not a number
    assert (
        not mixed.holds
        and mixed.comparisons[0].diff == 0.0
        and "reached on 67% vs 67% of seeds" in mixed.reason
    )
    # a failing headline on reach fractions is judged only where the interval could tell every seed from none,
    # and never where neither side reaches: that is no evidence against the method
    assert "cannot tell every seed reaching from none" in mixed.sensitivity
    neither = judged([inf, inf, inf], [inf, inf, inf])
    assert not neither.holds and "neither side reaches the target on any seed" in neither.sensitivity
    control = dataclasses.replace(every, id="control", headline=False, control=True)
    assert card_status([neither, control])[0] == "inconclusive"
    assert card_status([dataclasses.replace(never, verdict="fail"), control])[0] == "not reproduced"
    plain = load_card(write_card(tmp_path, TINY_CARD))
    with pytest.raises(CardError, match="censored: true"):
        evaluate_claim(
            plain, plain.claims[0], {"plus": {"val/rel_err": {0: inf}}, "lora": {"val/rel_err": {0: 1}}}, {}
        )
    with pytest.raises(CardError, match="censored must be true or false"):
        load_card(
            write_card(tmp_path, TINY_CARD.replace("margin: 0.1\n", "margin: 0.1\n    censored: 1\n", 1))
        )


def test_override_args_format():
    assert override_args(
        {"model.init_args.mode": "lora", "trainer.max_steps": 5, "m.targets": ["q", "v"], "m.lam": 0.001}
    ) == ["--model.init_args.mode=lora", "--trainer.max_steps=5", "--m.targets=[q, v]", "--m.lam=0.001"]


def test_full_scale_offline_stops_at_once_with_what_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert repro_main(["lokra", "--scale", "full", "--out", str(tmp_path), "--only", "lora_full"]) == 2
    err = capsys.readouterr().err
    assert "meta-llama/Meta-Llama-3-8B" in err and "hf download" in err


def test_invalid_card_path_is_reported(tmp_path, capsys):
    assert repro_main([str(tmp_path / "missing.yaml")]) == 2
    assert "no reproduction card at" in capsys.readouterr().err


OPTIONAL_RUN = """  lokra:
    role: ablation
    optional: true
    config: configs/lokra/matrix.yaml
    overrides: {model.init_args.mode: lokra, trainer.max_steps: 150, data.init_args.steps_per_epoch: 50}
claims:
"""
OPTIONAL_CLAIM = """  - id: lokra_fits_some
    kind: mechanism
    value: lokra:val/rel_err
    op: "<"
    target: 1.0
    fails_if: the adapter's gradients never reach its factors
"""


def test_optional_runs_need_all_and_their_claims_are_skipped(tmp_path):
    path = write_card(tmp_path, TINY_CARD.replace("claims:\n", OPTIONAL_RUN, 1) + OPTIONAL_CLAIM)
    card = load_card(path)
    res = reproduce(card, out_root=tmp_path / "repro")
    assert "lokra" not in res.runs and res.status == "reproduced"
    assert [c.verdict for c in res.claims] == ["pass", "pass", "pass", "skipped"]
    repro_main([str(path), "--out", str(tmp_path / "repro"), "--record"])
    first = load_card(path).recorded
    repro_main([str(path), "--out", str(tmp_path / "repro"), "--only", "lokra", "--record"])
    rec = load_card(path).recorded
    assert set(rec["results"]) == {"zero", "lora", "plus", "lokra"} and "from" in rec["results"]["lora"]
    # every claim judged on the merged numbers: the earlier runs' claims still pass, the new one now too
    assert (
        rec["claims"]["plus_beats_lora"]["verdict"] == "pass"
        and rec["claims"]["lokra_fits_some"]["verdict"] == "pass"
    )
    # a partial invocation keeps the card's command and timing; its own runs say where they come from
    assert "--only" not in rec["command"] and rec["wall_time_s"] == first["wall_time_s"]
    assert "--only lokra" in rec["results"]["lokra"]["from"] and rec["status"] == "reproduced"


def test_a_headline_or_control_on_an_optional_run_is_refused(tmp_path):
    # a default `litlab repro <slug>` skips optional runs, so a claim that decides the status must not read one
    card = TINY_CARD.replace("claims:\n", OPTIONAL_RUN, 1)
    headline = card.replace("against: [lora]", "against: [lora, lokra]")
    with pytest.raises(CardError, match=r"headline or positive control reads optional run\(s\) \['lokra'\]"):
        load_card(write_card(tmp_path, headline, name="headline.yaml"))
    control = card.replace("role: ablation", "role: floor").replace(
        "against: [zero]", "against: [zero, lokra]"
    )
    with pytest.raises(CardError, match=r"optional run\(s\) \['lokra'\]"):
        load_card(write_card(tmp_path, control, name="control.yaml"))
    load_card(write_card(tmp_path, card + OPTIONAL_CLAIM, name="secondary.yaml"))  # a secondary claim may


def test_jobs_run_in_worker_processes_with_the_same_numbers(tmp_path):
    card = load_card(write_card(tmp_path))
    # 6 fits on 2 long-lived workers: each worker fits more than one run, one after another
    parallel = reproduce(card, seeds=[0, 1], out_root=tmp_path / "par", jobs=2)
    assert not any(r.reused for run in parallel.runs.values() for r in run.runs)
    logs = tmp_path / "par" / "tiny" / "logs"
    assert {p.name for p in logs.iterdir()} == {
        f"{r}-s{s}.log" for r in ("zero", "lora", "plus") for s in (0, 1)
    }
    serial = reproduce(card, seeds=[0, 1], out_root=tmp_path / "ser")  # one thread in-process too
    assert {n: r.values for n, r in parallel.runs.items()} == {n: r.values for n, r in serial.runs.items()}
    again = reproduce(card, seeds=[0, 1], out_root=tmp_path / "par", jobs=2)
    assert all(r.reused for run in again.runs.values() for r in run.runs)


def test_every_shipped_card_is_judged_by_its_headline_under_controls():
    """load_card refuses a card without roles, headline, paper_effect, control or pairing, one whose passing
    claim a baseline or floor also passes, and one whose claims changed since recording without an amendment.
    The recorded status is the one the recorded numbers give under the current claims (make readme agrees)."""
    for path in sorted((ROOT / "seeds").glob("*.yaml")):
        card = load_card(path)
        v = verdict(card)
        assert card.recorded.get("status") == v.status, (path.name, card.recorded.get("status"), v.status)
        assert card.recorded.get("claims_sha256"), path.name
        assert v.status in ("reproduced", "not reproduced", "inconclusive", "not testable at this scale"), (
            path
        )
        assert len(card.recorded.get("seeds", [])) >= 3, path.name
        assert all(c.fails_if for c in card.claims if c.kind == "mechanism"), path.name


def test_every_mechanism_claim_names_its_mutation_test():
    """A mechanism claim stays in a card only where a plausible wrong implementation fails it: its fails_if says
    which, and a test in tests/ (naming the claim) builds that variant and shows the measurement failing."""
    sources = "\n".join(
        p.read_text() for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_repro.py"
    )
    missing = [
        f"{path.stem}: {claim.id}"
        for path in sorted((ROOT / "seeds").glob("*.yaml"))
        for claim in load_card(path).claims
        if claim.kind == "mechanism" and claim.id not in sources
    ]
    assert not missing, f"mechanism claims without a mutation test naming them: {missing}"


def test_readme_methods_table_is_generated_from_the_cards():
    readme = (ROOT / "README.md").read_text()
    begin, end = "<!-- cards:begin (make readme) -->\n", "<!-- cards:end -->"
    assert begin in readme and end in readme, "README lacks the generated methods table markers"
    table = readme.split(begin, 1)[1].split(end, 1)[0]
    assert table == cards_markdown(), "README's methods table is out of date: run `make readme`"


def test_cards_and_configs_resolve_in_the_users_project_first(tmp_path, monkeypatch, capsys):
    """A user's own repository: `seeds/mine.yaml` and `configs/mine/matrix.yaml` in the working directory
    (litlab has neither), found by slug; litlab's own cards still listed, a same-named local card wins."""
    project = tmp_path / "project"
    (project / "seeds").mkdir(parents=True)
    (project / "configs" / "mine").mkdir(parents=True)
    config = (ROOT / "configs/lokra/matrix.yaml").read_text()
    (project / "configs/mine/matrix.yaml").write_text(config)
    card = TINY_CARD.replace("configs/lokra/matrix.yaml", "configs/mine/matrix.yaml")
    (project / "seeds/mine.yaml").write_text(card.replace("Tiny matrix card", "My own card"))
    (project / "seeds/lokra.yaml").write_text(card.replace("Tiny matrix card", "My lokra"))
    monkeypatch.chdir(project)
    code = repro_main(["mine", "--seeds", "0", "--only", "lora", "--out", str(tmp_path / "out")])
    assert code == 0
    assert list((tmp_path / "out" / "mine").glob("matrix/*-s0/summary.json"))
    args = fit_request(load_card(project / "seeds/mine.yaml"), "lora", "quick", 0, tmp_path, []).cli_args()
    assert f"--config={project / 'configs/mine/matrix.yaml'}" in args
    rows = {slug: card for card, slug, _ in card_rows()}
    assert rows["mine"].title == "My own card" and rows["lokra"].title == "My lokra"
    assert "xkv" in rows  # litlab's own cards are still there


def test_a_worker_exits_when_its_repro_dies(tmp_path):
    """A `--jobs` worker must not train on for minutes after its `litlab repro` was killed (SIGKILL included):
    here the parent starts a worker-like child and dies at once; the child is gone within seconds."""
    import os
    import subprocess
    import sys
    import time

    child = "import time; from litlab.repro import _exit_with_parent; _exit_with_parent(0.1); time.sleep(60)"
    parent = (
        "import subprocess, sys, os\n"
        "env = {**os.environ, 'LITLAB_REPRO_PID': str(os.getpid())}\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL, env=env)\n"
        "print(p.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.split()[0])
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    raise AssertionError(f"worker {pid} outlived its parent by 20 s")


def test_plan_lists_the_fits_without_running(tmp_path, capsys):
    path = write_card(tmp_path)
    assert repro_main([str(path), "--plan", "--seeds", "0,1"]) == 0
    out = capsys.readouterr().out
    assert "3 runs x 2 seeds [0, 1] = 6 fits" in out and "plus" in out and "method" in out
    assert "--model.init_args.mode=lokra_plus" in out and not (tmp_path / "runs").exists()
    assert repro_main([str(path), "--plan", "--only", "nope"]) == 2


def test_medium_scale_is_opt_in_per_run_and_refused_where_a_card_has_none(tmp_path, capsys):
    """``medium`` (real pretrained models, <= 30 min) exists only where a card's runs name it: the card's claims
    follow their runs there, its hash is unchanged for cards without it, and ``--scale medium`` on a card with no
    medium run stops naming the scale instead of running nothing."""
    plain = write_card(tmp_path)
    assert load_card(plain).runs_for("medium") == {}
    assert repro_main([str(plain), "--scale", "medium", "--plan"]) == 2
    assert "no runs at scale 'medium'" in capsys.readouterr().err
    text = TINY_CARD.replace(
        "  quick: {seeds: [0, 1, 2]}", "  quick: {seeds: [0, 1, 2]}\n  medium: {seeds: [0, 1, 2, 3, 4]}"
    )
    for run in ("zero", "lora", "plus"):
        text = text.replace(f"  {run}:\n    role:", f"  {run}:\n    scales: [quick, medium]\n    role:")
    card = load_card(write_card(tmp_path, text, name="medium.yaml"))
    assert set(card.runs_for("medium")) == {"zero", "lora", "plus"} and card.seeds["medium"] == (
        0,
        1,
        2,
        3,
        4,
    )
    assert {c.id for c in card.claims_for("medium")} == {
        "plus_beats_lora",
        "lora_beats_zero",
        "plus_is_full_rank",
    }
    assert card.runs_for("full") == {}
    assert repro_main([str(tmp_path / "medium.yaml"), "--scale", "medium", "--plan"]) == 0
    assert "at scale medium: 3 runs x 5 seeds" in capsys.readouterr().out
