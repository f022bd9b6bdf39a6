"""The reproduction harness on a tiny card: runs, reuse, report, verdict, and card validation."""

import json
from pathlib import Path

import pytest

from litlab.cards import evaluate, load_card, split_clauses
from litlab.lit_modules.core.errors import CardError
from litlab.lit_modules.core.results import ReportExtras
from litlab.repro import main as repro_main
from litlab.repro import override_args, reproduce

ROOT = Path(__file__).resolve().parent.parent

TINY_CARD = """
title: Tiny matrix card
venue: test
claim: LoKRA+ fits a diagonal target that LoRA cannot.
metric: {name: val/rel_err, mode: min}
scales:
  quick: {seeds: [0, 1]}
runs:
  lora:
    config: configs/lokra/matrix.yaml
    overrides: {model.init_args.mode: lora, trainer.max_steps: 150, data.init_args.steps_per_epoch: 50}
  plus:
    config: configs/lokra/matrix.yaml
    overrides: {model.init_args.mode: lokra_plus, model.init_args.penalty.lam: 0.0, trainer.max_steps: 150,
                data.init_args.steps_per_epoch: 50}
  plus_rank:
    config: configs/lokra/matrix.yaml
    overrides: {model.init_args.mode: lokra_plus, model.init_args.penalty.lam: 0.0, trainer.max_steps: 150,
                data.init_args.steps_per_epoch: 50}
    metric: val/delta_rank
expectation: "plus < lora - 0.1 and plus_rank > 8"
"""


def write_card(tmp_path, text=TINY_CARD, name="tiny.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_harness_runs_reuses_and_reports(tmp_path, capsys):
    card = load_card(write_card(tmp_path))
    res = reproduce(card, out_root=tmp_path / "repro")
    assert res.passed is True and [c["holds"] for c in res.clauses] == [True, True]
    assert res.runs["plus_rank"].mean == 64.0
    assert len(res.runs["lora"].values) == 2 and res.runs["lora"].std > 0
    assert not any(r.reused for r in res.runs["lora"].runs)
    assert all(r.reused for r in res.runs["plus_rank"].runs)  # same config as `plus`: not rerun
    again = reproduce(card, out_root=tmp_path / "repro")  # an interrupted repro resumes: nothing re-runs
    assert all(r.reused for run in again.runs.values() for r in run.runs)
    assert again.runs["lora"].values == res.runs["lora"].values


def test_command_writes_report_and_exit_code_follows_expectation(tmp_path, capsys):
    out = tmp_path / "repro"
    assert repro_main([str(write_card(tmp_path)), "--out", str(out), "--seeds", "0"]) == 0
    files = {p.name for p in (out / "tiny").iterdir()}
    assert {"report.md", "results.json", "tiny_quick.png"} <= files
    report = (out / "tiny" / "report.md").read_text()
    assert "PASS" in report and "plus < lora - 0.1" in report
    assert json.loads((out / "tiny" / "results.json").read_text())["passed"] is True
    assert "PASS" in capsys.readouterr().out
    failing = write_card(tmp_path, TINY_CARD.replace("plus < lora - 0.1", "plus > lora"), "failing.yaml")
    assert repro_main([str(failing), "--out", str(out), "--seeds", "0"]) == 1  # same runs, reused


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


def test_report_hook_adds_figures_sections_and_recorded_numbers(tmp_path):
    path = write_card(tmp_path, TINY_CARD + "report_hook: tests.test_repro:ratio_hook\n")
    out = tmp_path / "repro"
    assert repro_main([str(path), "--out", str(out), "--seeds", "0", "--only", "lora,plus", "--record"]) == 0
    report = (out / "tiny" / "report.md").read_text()
    assert "## Extra section" in report and "![extra](extra.png)" in report and "plus_over_lora" in report
    ratio = load_card(path).recorded["derived"]["plus_over_lora"]
    assert 0 < ratio < 0.5
    bad = write_card(tmp_path, TINY_CARD + "report_hook: tests.test_repro\n", "bad.yaml")
    with pytest.raises(CardError, match="report_hook must be"):
        load_card(bad)


def test_only_runs_a_subset_and_leaves_the_verdict_open(tmp_path):
    card = load_card(write_card(tmp_path))
    res = reproduce(card, seeds=[0], only=["plus"], out_root=tmp_path / "repro")
    assert list(res.runs) == ["plus"] and res.passed is None
    with pytest.raises(CardError, match="unknown runs \\['nope'\\]"):
        reproduce(card, only=["nope"], out_root=tmp_path / "repro")


def test_record_writes_measured_numbers_into_the_card(tmp_path):
    path = write_card(tmp_path)
    repro_main([str(path), "--out", str(tmp_path / "repro"), "--seeds", "0", "--record"])
    card = load_card(path)
    assert card.recorded["passed"] is True and card.recorded["seeds"] == [0]
    assert set(card.recorded["results"]) == {"lora", "plus", "plus_rank"}
    assert card.title == "Tiny matrix card"  # the rest of the card is untouched


def test_the_shipped_lokra_card_is_valid_and_recorded():
    card = load_card(ROOT / "seeds" / "lokra.yaml")
    assert card.recorded["passed"] is True and card.recorded["seeds"] == [0, 1, 2]
    assert set(card.recorded["results"]) == set(card.runs_for("quick"))


@pytest.mark.parametrize(
    "mutation,message",
    [
        (
            ("metric: {name: val/rel_err, mode: min}", "metric: {name: val/rel_err, mode: lowest}"),
            "metric.mode",
        ),
        (("venue: test", "venue: test\nauthor: me"), "unknown keys \\['author'\\]"),
        (("plus_rank:", "plus-rank:"), "must be an identifier"),
        (('"plus < lora - 0.1 and plus_rank > 8"', '"plus < lorra"'), "unknown runs \\['lorra'\\]"),
        (("claim: LoKRA+ fits a diagonal target that LoRA cannot.\n", ""), "missing required key 'claim'"),
        (
            (
                "    config: configs/lokra/matrix.yaml\n    overrides: {model.init_args.mode: lora,",
                "    overrides: {model.init_args.mode: lora,",
            ),
            "runs.lora needs a 'config'",
        ),
    ],
)
def test_card_validation_names_the_problem(tmp_path, mutation, message):
    bad = write_card(tmp_path, TINY_CARD.replace(*mutation, 1))
    with pytest.raises(CardError, match=message):
        load_card(bad)


def test_expectation_language():
    means = {"a": 1.0, "b": 2.0}
    assert evaluate("a < b - 0.5 and abs(a - b) == 1", means)
    assert not evaluate("a > b or not a < b", means)
    assert evaluate("max(a, b) >= 2 and a + std(a) < b", means, {"a": 0.1})
    assert split_clauses("a < b and b > 1 and a >= 0") == ["a < b", "b > 1", "a >= 0"]
    with pytest.raises(CardError, match="unsupported syntax"):
        evaluate("__import__('os')", means)
    with pytest.raises(CardError, match="not a valid expression"):
        evaluate("a <", means)


def test_override_args_format():
    assert override_args(
        {"model.init_args.mode": "lora", "trainer.max_steps": 5, "m.targets": ["q", "v"], "m.lam": 0.001}
    ) == ["--model.init_args.mode=lora", "--trainer.max_steps=5", "--m.targets=[q, v]", "--m.lam=0.001"]


def test_full_scale_offline_stops_at_once_with_what_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert repro_main(["lokra", "--scale", "full", "--out", str(tmp_path), "--only", "lora_lm"]) == 2
    err = capsys.readouterr().err
    assert "meta-llama/Meta-Llama-3-8B" in err and "hf download" in err


def test_invalid_card_path_is_reported(tmp_path, capsys):
    assert repro_main([str(tmp_path / "missing.yaml")]) == 2
    assert "no reproduction card at" in capsys.readouterr().err


def test_optional_runs_need_all_and_their_clauses_are_skipped(tmp_path):
    text = TINY_CARD.replace(
        "    metric: val/delta_rank\n", "    metric: val/delta_rank\n    optional: true\n"
    )
    path = write_card(tmp_path, text)
    card = load_card(path)
    res = reproduce(card, seeds=[0], out_root=tmp_path / "repro")
    assert "plus_rank" not in res.runs and res.passed is True
    assert [c.get("skipped", False) for c in res.clauses] == [False, True]
    repro_main([str(path), "--out", str(tmp_path / "repro"), "--seeds", "0", "--record"])
    repro_main(
        [str(path), "--out", str(tmp_path / "repro"), "--seeds", "0", "--only", "plus_rank", "--record"]
    )
    recorded = load_card(path).recorded["results"]
    assert (
        set(recorded) == {"lora", "plus", "plus_rank"} and "from" in recorded["lora"]
    )  # earlier numbers kept
    full = reproduce(card, seeds=[0], out_root=tmp_path / "repro", include_optional=True)
    assert full.runs["plus_rank"].mean == 64.0 and full.passed is True


def test_jobs_run_in_worker_processes_with_the_same_numbers(tmp_path):
    card = load_card(write_card(tmp_path))
    parallel = reproduce(card, seeds=[0], out_root=tmp_path / "par", jobs=2)
    assert not any(r.reused for r in parallel.runs["lora"].runs + parallel.runs["plus"].runs)
    assert all(r.reused for r in parallel.runs["plus_rank"].runs)  # shares `plus`'s run
    assert (tmp_path / "par" / "tiny" / "logs" / "lora-s0.log").exists()
    serial = reproduce(card, seeds=[0], out_root=tmp_path / "ser")
    assert {n: r.values for n, r in parallel.runs.items()} == {n: r.values for n, r in serial.runs.items()}
    again = reproduce(card, seeds=[0], out_root=tmp_path / "par", jobs=2)
    assert all(r.reused for run in again.runs.values() for r in run.runs)
