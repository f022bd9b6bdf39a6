"""seeds/csplora.yaml under issue 28: the card's mechanism claims against a broken planner (mutation tests), and
the parameter parity that left the card for a test.

On a small version of the card's toy (a 1-epoch token TinyViT, 30 base and 40 downstream samples per class, run
seeds 0-2 as the card's, each drawing data, backbone, probe and init), the real planner satisfies each mechanism claim's ``op target`` and a plausible wrong
implementation violates it:

- ``rank_moves_to_the_shift`` (embed + block 0 get > 5 of the 17 ranks at r_base 1, on every seed): a saliency
  that does not read the task gradient (the base weight's magnitude |W|) moves less rank to the shift on every
  seed, but since the one-run-seed migration no longer below the claim's threshold (an xfail says so);
- ``smol_plan_stable_across_probe_sets`` (smallest Spearman of the structural prior s between probes of different
  calibration batches >= 0.9): a saliency that sums the signed products W * dL/dW before taking the magnitude
  (|sum W*grad| instead of sum |W*grad|) cancels inside each module and its order follows the probe batches.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from scipy.stats import spearmanr

from litlab.datamodules.synth_tokens import PlanningTaskData
from litlab.lit_modules.core import rank_plan as rp
from litlab.lit_modules.peft import csplora as csplora_module
from litlab.lit_modules.peft.csplora import CSPLoRAClassifier, PlannerConfig, TokenViTBase

SEEDS = (0, 1, 2)  # run seeds, as the card's first three
FIRST_BLOCK = ("embed", "blocks.0.")
RANK_TARGET = 5  # rank_moves_to_the_shift: op ">", target 5 (uniform r = 1 gives embed + block 0 five ranks)
STABLE_TARGET = 0.9  # smol_plan_stable_across_probe_sets: op ">=", target 0.9


@pytest.fixture(autouse=True)
def run_seed_restored(monkeypatch):
    """``_toy`` sets the run seed (``PL_GLOBAL_SEED``, what ``derive_seed`` reads); it is restored after each test."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")


def _toy(
    seed: int, probe_batches: int = 10, plan: str = "csplora"
) -> tuple[CSPLoRAClassifier, PlanningTaskData]:
    """The toy at run seed ``seed`` (the data, backbone, probe and head are drawn when first used)."""
    L.seed_everything(seed, verbose=False)
    dm = PlanningTaskData(base_per_class=30, train_per_class=40, test_per_class=10)
    model = CSPLoRAClassifier(
        plan=plan,
        r_base=1,
        base=TokenViTBase(epochs=1),
        planner=PlannerConfig(probe_batches=probe_batches),
    )
    return model, dm


def _first_block_rank(seed: int) -> int:
    model, dm = _toy(seed)
    ranks = model.make_rank_plan(dm).ranks(1, 0, 4, variant="csplora")
    return sum(r for n, r in ranks.items() if n.startswith(FIRST_BLOCK))


def _magnitude_saliency(model, modules, batches, loss_and_confidence, settings):
    """The broken planner: |W| summed per module, the task's gradient never read."""
    return {n: float(m.weight.detach().abs().sum()) for n, m in modules.items()}, {
        "steps": 0,
        "converged": False,
        "mean_relative_ess": 1.0,
    }


def _signed_taylor_saliency(model, modules, batches, loss_and_confidence, settings):
    """The broken planner: |sum W * dL_w/dW| per module (signed products summed before the magnitude)."""
    weights = {n: m.weight for n, m in modules.items()}
    flags = {w: w.requires_grad for w in weights.values()}
    scores = dict.fromkeys(weights, 0.0)
    try:
        for w in weights.values():
            w.requires_grad_(True)
        for batch in batches:
            loss, confidence = loss_and_confidence(model, batch)
            cw = rp.confidence_weights(confidence, settings.gamma_strategy, settings.gamma).to(loss)
            grads = torch.autograd.grad((cw * loss).sum(), list(weights.values()))
            for (n, w), g in zip(weights.items(), grads):
                scores[n] += float((w.detach() * g).sum())
    finally:
        for w, flag in flags.items():
            w.requires_grad_(flag)
    steps = len(batches)
    return {n: abs(s) / steps for n, s in scores.items()}, {
        "steps": steps,
        "converged": False,
        "mean_relative_ess": 1.0,
    }


def test_rank_moves_to_the_shift_less_when_the_saliency_ignores_the_gradient(monkeypatch):
    real = [_first_block_rank(seed) for seed in SEEDS]
    assert all(r > RANK_TARGET for r in real), real  # the claim holds for the real planner on every seed
    monkeypatch.setattr(csplora_module, "probe_saliency", _magnitude_saliency)
    broken = [_first_block_rank(seed) for seed in SEEDS]
    assert all(b < r for b, r in zip(broken, real)), (broken, real)


@pytest.mark.xfail(
    strict=True,
    reason="the claim's fails_if (a |W| saliency gives 6, 4, 5 first-block ranks on seeds 0-2) held on the draws "
    "before the one-run-seed migration (issue 29); at run seeds 0-2 the |W| planner gives 9, 9, 9 (real: 10, 10, "
    "10; 7-9 at run seeds 3-5, measured 2026-12-06): still above uniform's 5, so rank_moves_to_the_shift does not "
    "catch this mutation any more",
)
def test_rank_moves_to_the_shift_fails_when_the_saliency_ignores_the_gradient(monkeypatch):
    monkeypatch.setattr(csplora_module, "probe_saliency", _magnitude_saliency)
    broken = [_first_block_rank(seed) for seed in SEEDS]
    assert not all(r > RANK_TARGET for r in broken), broken


def _min_spearman_across_probe_sets(seed: int) -> float:
    """The card's measure (the smallest pairwise Spearman of s between probes of different calibration batches)
    on one toy backbone, probed with three draws of its training batches."""
    model, dm = _toy(seed, probe_batches=20)
    model._build_base(dm)
    names = model.target_names()
    draw = dm.probe_batches
    priors = []
    for k in range(3):
        dm.probe_batches = lambda n, b, seed, k=k: draw(n, b, seed=100 + k)
        s = model.probe(names, dm).structure("csplora")
        priors.append([s[n] for n in names])
    return min(float(spearmanr(a, b).statistic) for a, b in itertools.combinations(priors, 2))


@pytest.mark.parametrize("seed", [0, 1])
def test_plan_is_stable_across_probe_sets_unless_the_taylor_terms_cancel(seed, monkeypatch):
    assert _min_spearman_across_probe_sets(seed) >= STABLE_TARGET
    monkeypatch.setattr(csplora_module, "probe_saliency", _signed_taylor_saliency)
    assert _min_spearman_across_probe_sets(seed) < STABLE_TARGET


@pytest.mark.parametrize("seed", SEEDS)
def test_planned_adapter_keeps_parameter_parity_with_uniform(seed):
    """Was the card's parameter_parity_low / _high (spec §7.8: the planned adapter's trainable parameters within
    10 % of the uniform adapter's at the same R_tot = 17 r_base); the module's own count (``setup``) on the toy."""
    model, dm = _toy(seed)
    model._trainer = SimpleNamespace(datamodule=dm)  # setup reads the data module from its trainer
    model.setup("fit")
    assert sum(model.ranks.values()) == 17  # the budget R_tot = L r_base is spent exactly
    assert 0.9 <= model.param_ratio <= 1.1, model.param_ratio
    uniform, _ = _toy(seed, plan="uniform")
    uniform._trainer = SimpleNamespace(datamodule=dm)
    uniform.setup("fit")
    assert uniform.param_ratio == 1.0
