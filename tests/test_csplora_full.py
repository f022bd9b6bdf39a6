"""CSPLoRA at full scale, self-contained (issue 32): the card's ``csplora_full`` run sets
``model.init_args.adapter.rank_plan: probe``, so the fit probes its frozen base once when it sets up, with the planner
``litlab plan`` runs (``LoKRALanguageModel.make_rank_plan``, ``adapter.probe_batches`` batches), builds the planned
adapters and writes the plan into its run folder; on the stand-in (a tiny ``LlamaForCausalLM``, 10 records) the
probe reads the 2 batches one epoch gives."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from litlab.lit_modules.core.rank_plan import RankPlan
from litlab.standin import expand_stand_in_flag

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "csplora" / "full.yaml"
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns when pytest's arguments are there too
    return tmp_path


def _planned(run_dir: Path) -> tuple[RankPlan, dict[str, int]]:
    plan = RankPlan.load(run_dir / "rank_plan.json")
    return plan, json.loads((run_dir / "ranks.json").read_text())["ranks"]


def test_the_cards_full_scale_plan_run_probes_at_fit_start_on_the_stand_in(offline):
    """``litlab repro csplora --scale full --stand-in --only csplora_full`` runs (it stopped before: the run named a
    plan file nobody had made, and the probe wanted 20 batches of the stand-in's 2); the run folder holds the plan
    of one 2-batch probe of the 14 projections and ranks that spend the uniform budget 14 x 4 unevenly."""
    from litlab.repro import main

    out = offline / "out"
    assert (
        main(
            ["csplora", "--scale", "full", "--stand-in", "--only", "csplora_full", "--jobs", "1"]
            + ["--out", str(out)]
        )
        == 0
    )
    (run_dir,) = [p.parent for p in (out / "csplora").rglob("rank_plan.json")]
    plan, ranks = _planned(run_dir)
    assert plan.probe["steps"] == 2 and len(plan.scores) == 14 == len(ranks)
    assert sum(ranks.values()) == 14 * 4 and len(set(ranks.values())) > 1, ranks
    results = json.loads((out / "csplora" / "results.json").read_text())
    assert torch.isfinite(torch.tensor(results["runs"]["csplora_full"]["metrics"]["val/loss"])).all()


def test_a_probed_fit_resumes_and_evaluates_with_its_plan_and_litlab_plan_probes_the_same(offline):
    """The probe draws its batches from the run seed's ``"probe"`` stream, so a relaunch (``--ckpt_path last``)
    and ``validate`` from the checkpoint rebuild adapters of the same ranks and load it; ``litlab plan --stand-in``
    on the same config (a plan file, adapters at B = 0) gives the fit's scores."""
    from litlab.cli import LitlabCLI
    from litlab.plan import main as plan_main

    common = [f"--config={CONFIG}", "--stand-in", f"--runs_dir={offline / 'runs'}"]
    probe = ["--model.init_args.adapter.rank_plan=probe", *QUIET]
    first = LitlabCLI(args=expand_stand_in_flag(["fit", *common, *probe]))
    plan, ranks = _planned(first.run_dir)
    built = {k: v.shape[0] for k, v in first.model.state_dict().items() if k.endswith(".A")}
    assert sorted(built.values()) == sorted(ranks.values()), (built, ranks)  # the adapters are the plan's
    again = LitlabCLI(args=expand_stand_in_flag(["fit", *common, *probe, "--ckpt_path=last"]))
    assert again.run_dir == first.run_dir and again.trainer.global_step == first.trainer.global_step
    ckpt = first.run_dir / "checkpoints" / "last.ckpt"
    evaluated = LitlabCLI(args=expand_stand_in_flag(["validate", *common, *probe, f"--ckpt_path={ckpt}"]))
    assert torch.isfinite(evaluated.trainer.callback_metrics["val/loss"])

    assert (
        plan_main(
            ["--config", str(CONFIG), "--stand-in", f"--runs_dir={offline / 'runs'}", "--out", "p.json"]
        )
        == 0
    )
    alone = RankPlan.load(offline / "p.json")
    assert list(alone.scores) == list(plan.scores)
    assert alone.scores == pytest.approx(plan.scores, rel=1e-5)
