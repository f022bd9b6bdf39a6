"""The reproduction harness on a tiny card: runs, reuse, claims and their statistics, the falsifiability
check, status, recording, and card validation."""

import json
from pathlib import Path

import pytest
import yaml

from litlab.cards import load_card, substitute_seed
from litlab.claims import card_status, refutations, welch_interval
from litlab.lit_modules.core.errors import CardError
from litlab.lit_modules.core.results import ReportExtras
from litlab.repro import card_rows, fit_args, override_args, reproduce
from litlab.repro import main as repro_main

ROOT = Path(__file__).resolve().parent.parent

TINY_CARD = """
title: Tiny matrix card
venue: test
claim: LoKRA+ fits a diagonal target that LoRA cannot.
metric: {name: val/rel_err, mode: min}
scales:
  quick: {seeds: [0, 1, 2]}
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
    mode: max
claims:
  - id: plus_beats_lora
    kind: better
    method: plus
    against: [lora]
    margin: 0.1
    paper: "LoKRA+ fits a diagonal target that LoRA cannot"
  - id: plus_is_full_rank
    kind: mechanism
    value: plus_rank
    op: ">"
    target: 8
"""


def write_card(tmp_path, text=TINY_CARD, name="tiny.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_harness_runs_reuses_and_reports(tmp_path, capsys):
    card = load_card(write_card(tmp_path))
    res = reproduce(card, out_root=tmp_path / "repro")
    better, mechanism = res.claims
    assert better.verdict == "pass" and better.status == "reproduced"
    (vs_lora,) = better.comparisons
    assert vs_lora.n_method == vs_lora.n_against == 3 and vs_lora.ci_low > 0.1
    assert vs_lora.diff == pytest.approx(
        res.runs["lora"].mean - res.runs["plus"].mean
    )  # min metric: lower wins
    assert mechanism.verdict == "pass" and mechanism.value == [64.0, 64.0, 64.0]
    assert res.status == "reproduced" and not res.refutations and not res.regressions
    assert len(res.runs["lora"].values) == 3 and res.runs["lora"].std > 0
    assert not any(r.reused for r in res.runs["lora"].runs)
    # same config as `plus`: one fit for both entries (fitted by this invocation, so not "reused")
    assert [r.run_dir for r in res.runs["plus_rank"].runs] == [r.run_dir for r in res.runs["plus"].runs]
    assert not any(r.reused for r in res.runs["plus_rank"].runs)
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
    assert "**Status: reproduced.**" in report and "| plus_beats_lora | better | vs lora | 3/3 |" in report
    saved = json.loads((out / "tiny" / "results.json").read_text())
    assert saved["status"] == "reproduced" and saved["claims"][0]["comparisons"][0]["ci_low"] > 0.1
    assert "status: reproduced" in capsys.readouterr().out
    # the same claim id, now asking for more than the runs show: it was recorded as passing, so exit 1
    raised = path.read_text().replace("margin: 0.1\n", "margin: 5.0\n")
    path.write_text(raised)
    assert repro_main([str(path), "--out", str(out)]) == 1  # same runs, reused
    # a claim that never passed is a result, not a failure
    fresh = write_card(tmp_path, TINY_CARD.replace("margin: 0.1\n", "margin: 5.0\n"), "fresh.yaml")
    assert repro_main([str(fresh), "--out", str(out)]) == 0
    res = json.loads((out / "fresh" / "results.json").read_text())
    assert res["status"] == "not reproduced" and res["claims"][0]["verdict"] == "fail"
    assert "does not clear margin 5" in res["claims"][0]["reason"]


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
    assert repro_main([str(path), "--out", str(out), "--only", "lora,plus", "--record"]) == 0
    report = (out / "tiny" / "report.md").read_text()
    assert "## Extra section" in report and "![extra](extra.png)" in report and "plus_over_lora" in report
    card = load_card(path)
    ratio = card.recorded["derived"]["plus_over_lora"]
    assert 0 < ratio < 0.5 and card.recorded["claims"]["ratio_small"]["value"] == round(ratio, 6)
    assert card.recorded["claims"]["plus_is_full_rank"]["verdict"] == "skipped"  # plus_rank not run
    bad = write_card(tmp_path, TINY_CARD + "report_hook: tests.test_repro\n", "bad.yaml")
    with pytest.raises(CardError, match="report_hook must be"):
        load_card(bad)


def test_only_runs_a_subset_and_skips_the_claims_it_cannot_judge(tmp_path):
    card = load_card(write_card(tmp_path))
    res = reproduce(card, only=["plus"], out_root=tmp_path / "repro")
    assert list(res.runs) == ["plus"] and [c.verdict for c in res.claims] == ["skipped", "skipped"]
    assert res.status == "not run" and "lora" in res.claims[0].reason
    with pytest.raises(CardError, match="unknown runs \\['nope'\\]"):
        reproduce(card, only=["nope"], out_root=tmp_path / "repro")


def test_record_writes_per_seed_numbers_and_claims_into_the_card(tmp_path):
    path = write_card(tmp_path)
    repro_main([str(path), "--out", str(tmp_path / "repro"), "--record"])
    card = load_card(path)
    rec = card.recorded
    assert rec["status"] == "reproduced" and rec["seeds"] == [0, 1, 2]
    assert set(rec["results"]) == {"lora", "plus", "plus_rank"} and rec["results"]["lora"]["seeds"] == [
        0,
        1,
        2,
    ]
    vs = rec["claims"]["plus_beats_lora"]["vs"]["lora"]
    assert vs["n"] == [3, 3] and vs["ci95"][0] > 0.1 and vs["margin"] == 0.1
    assert card.title == "Tiny matrix card"  # the rest of the card is untouched


def test_check_recorded_compares_every_seed_with_the_determinism_tolerance(tmp_path):
    path = write_card(tmp_path)
    out = str(tmp_path / "repro")
    repro_main([str(path), "--out", out, "--record"])
    assert repro_main([str(path), "--out", out, "--check-recorded"]) == 0  # bit-identical on CPU
    data = yaml.safe_load(path.read_text())
    data["recorded"]["results"]["lora"]["values"][1] += 1e-4  # one seed moved
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert repro_main([str(path), "--out", out, "--check-recorded"]) == 1
    report = (tmp_path / "repro" / "tiny" / "report.md").read_text()
    assert "lora seed 1: measured" in report
    data["determinism"] = {"atol": 1e-3}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert repro_main([str(path), "--out", out, "--check-recorded"]) == 0


PARITY_CLAIM = """  - id: plus_matches_lora
    kind: parity
    method: plus
    against: [lora]
    margin_rel: 100.0
    controls: [lora_copy]
"""
LORA_COPY = """  lora_copy:
    config: configs/lokra/matrix.yaml
    overrides: {model.init_args.mode: lora, trainer.max_steps: 150, data.init_args.steps_per_epoch: 50}
claims:
"""


def test_a_claim_that_cannot_tell_the_method_from_a_baseline_is_refused(tmp_path, capsys):
    """The toy: a parity claim so loose that its control passes too (with the control's numbers in the
    method's place the claim still holds), at record time on fresh numbers and at load time on recorded ones."""
    text = TINY_CARD.replace("claims:\n", LORA_COPY, 1) + PARITY_CLAIM
    path = write_card(tmp_path, text)
    out = str(tmp_path / "repro")
    assert repro_main([str(path), "--out", out, "--record"]) == 2
    assert "cannot tell plus from lora_copy" in capsys.readouterr().err
    assert "recorded" not in yaml.safe_load(path.read_text())  # nothing recorded
    card = load_card(path)
    values = {
        "plus": [0.1, 0.11, 0.12],
        "lora": [1.0, 1.1, 0.9],
        "lora_copy": [1.0, 1.1, 0.9],
        "plus_rank": [64.0] * 3,
    }
    (problem,) = refutations(card, values)
    assert "plus_matches_lora" in problem
    tight = path.read_text().replace("margin_rel: 100.0", "margin_rel: 0.05")
    assert refutations(load_card(write_card(tmp_path, tight, "tight.yaml")), values) == []
    recorded = yaml.safe_load(path.read_text())
    recorded["recorded"] = {
        "scale": "quick",
        "seeds": [0, 1, 2],
        "results": {n: {"seeds": [0, 1, 2], "values": v} for n, v in values.items()},
    }
    path.write_text(yaml.safe_dump(recorded, sort_keys=False))
    with pytest.raises(
        CardError, match="refused, on its recorded numbers: claim 'plus_matches_lora' cannot tell"
    ):
        load_card(path)


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


def test_card_status_from_claim_verdicts():
    assert card_status([("better", "pass"), ("mechanism", "pass")]) == "reproduced"
    assert card_status([("better", "pass"), ("parity", "fail")]) == "partial"
    assert card_status([("better", "fail"), ("mechanism", "pass")]) == "not reproduced"
    assert card_status([("better", "unrun"), ("mechanism", "pass")]) == "mechanism only"
    assert card_status([("better", "skipped")]) == "not run"


def test_seed_placeholder_in_overrides(tmp_path):
    assert substitute_seed("{seed}", 3) == 3 and substitute_seed("run-{seed}", 3) == "run-3"
    assert substitute_seed({"a": ["{seed}", 1]}, 4) == {"a": [4, 1]} and substitute_seed(0.5, 4) == 0.5
    text = TINY_CARD.replace(
        "overrides: {model.init_args.mode: lora,", 'overrides: {data.init_args.seed: "{seed}",', 1
    )
    args = fit_args(load_card(write_card(tmp_path, text)), "lora", "quick", 7, tmp_path, [])
    assert "--data.init_args.seed=7" in args and "--seed_everything=7" in args


@pytest.mark.parametrize(
    "mutation,message",
    [
        (
            ("metric: {name: val/rel_err, mode: min}", "metric: {name: val/rel_err, mode: lowest}"),
            "metric.mode",
        ),
        (("venue: test", "venue: test\nauthor: me"), "unknown keys \\['author'\\]"),
        (("plus_rank:", "plus-rank:"), "must be an identifier"),
        (("against: [lora]", "against: [lorra]"), "claim 'plus_beats_lora' names unknown run 'lorra'"),
        (("margin: 0.1", "margin: -0.1"), "the margin must be >= 0"),
        (("kind: better", "kind: bigger"), "kind must be one of"),
        (("kind: better", "kind: parity"), "name 'controls'"),
        (('    op: ">"\n', ""), "a mechanism claim needs"),
        (("against: [lora]", "against: [plus_rank]"), "compares runs that read different metrics"),
        (("margin: 0.1", "margin: 0.1\n    same_units: maybe"), "same_units must be true or false"),
        (("seeds: [0, 1, 2]", "seeds: [0, 1]"), "at least 3 distinct seeds"),
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


def test_same_units_lets_a_claim_compare_two_scalars_of_one_fit(tmp_path):
    """Two scalars of one kind (two orderings' AUCs logged by one analysis fit) may be compared when the claim
    says so; the refusal without it is tested above."""
    text = TINY_CARD.replace("against: [lora]", "against: [plus_rank]", 1).replace(
        "margin: 0.1", "margin: 0.1\n    same_units: true", 1
    )
    card = load_card(write_card(tmp_path, text), check_falsifiable=False)
    claim = next(c for c in card.claims if c.id == "plus_beats_lora")
    assert claim.same_units and claim.against == ("plus_rank",)


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


def test_optional_runs_need_all_and_their_claims_are_skipped(tmp_path):
    text = TINY_CARD.replace("    mode: max\n", "    mode: max\n    optional: true\n")
    path = write_card(tmp_path, text)
    card = load_card(path)
    res = reproduce(card, out_root=tmp_path / "repro")
    assert "plus_rank" not in res.runs and res.status == "reproduced"
    assert [c.verdict for c in res.claims] == ["pass", "skipped"]
    repro_main([str(path), "--out", str(tmp_path / "repro"), "--record"])
    first = load_card(path).recorded
    repro_main([str(path), "--out", str(tmp_path / "repro"), "--only", "plus_rank", "--record"])
    rec = load_card(path).recorded
    assert set(rec["results"]) == {"lora", "plus", "plus_rank"} and "from" in rec["results"]["lora"]
    assert rec["claims"]["plus_beats_lora"]["verdict"] == "pass"  # earlier verdict kept, not "skipped"
    # a partial invocation keeps the card's command and timing; its own runs say where they come from
    assert "--only" not in rec["command"] and rec["wall_time_s"] == first["wall_time_s"]
    assert "--only plus_rank" in rec["results"]["plus_rank"]["from"] and rec["status"] == "reproduced"
    full = reproduce(card, out_root=tmp_path / "repro", include_optional=True)
    assert full.runs["plus_rank"].mean == 64.0 and [c.verdict for c in full.claims] == ["pass", "pass"]


def test_jobs_run_in_worker_processes_with_the_same_numbers(tmp_path):
    card = load_card(write_card(tmp_path))
    # 4 fits on 2 long-lived workers: each worker fits more than one run, one after another
    parallel = reproduce(card, seeds=[0, 1], out_root=tmp_path / "par", jobs=2)
    # `plus_rank` shares `plus`'s run: fitted by this invocation, so not "reused" (that means: from before)
    assert not any(r.reused for run in parallel.runs.values() for r in run.runs)
    assert parallel.runs["plus_rank"].runs[0].run_dir == parallel.runs["plus"].runs[0].run_dir
    logs = tmp_path / "par" / "tiny" / "logs"
    assert {p.name for p in logs.iterdir()} == {f"{r}-s{s}.log" for r in ("lora", "plus") for s in (0, 1)}
    serial = reproduce(card, seeds=[0, 1], out_root=tmp_path / "ser")  # one thread in-process too
    assert {n: r.values for n, r in parallel.runs.items()} == {n: r.values for n, r in serial.runs.items()}
    again = reproduce(card, seeds=[0, 1], out_root=tmp_path / "par", jobs=2)
    assert all(r.reused for run in again.runs.values() for r in run.runs)


def test_every_shipped_card_has_claims_and_passes_the_falsifiability_check():
    """load_card refuses a card whose recorded numbers let a baseline pass one of its comparative claims."""
    for path in sorted((ROOT / "seeds").glob("*.yaml")):
        card = load_card(path)
        assert card.claims, path.name
        assert card.recorded.get("status") in ("reproduced", "partial", "not reproduced", "mechanism only"), (
            path
        )
        assert len(card.recorded.get("seeds", [])) >= 3, path.name


def test_readme_methods_table_is_generated_from_the_cards():
    from litlab.repro import cards_markdown

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
    args = fit_args(load_card(project / "seeds/mine.yaml"), "lora", "quick", 0, tmp_path, [])
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
