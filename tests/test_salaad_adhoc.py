"""The ad-hoc baselines trained for one budget (``structured.adhoc``): the constraint holds after every optimiser step
of a real fit, the deployed model at the run's budget is the trained one, the floor has no blocks, and bad
settings fail by name."""

from __future__ import annotations

import math

import pytest
import torch
from test_salaad import TINY, _dm

from litlab.lit_modules.structured.adhoc import AdHocConfig, AdHocStructure, uniform_rank
from litlab.lit_modules.structured.capacity import CapacitySweep, deploy
from litlab.lit_modules.structured.salaad import SALAADLM

QUICK_SHAPES = [(64, 64)] * 8 + [(128, 64), (128, 64), (64, 128)] * 2  # the quick model's 14 blocks


def test_uniform_rank_is_the_largest_within_the_budget():
    assert [uniform_rank(QUICK_SHAPES, f) for f in (0.15, 0.25, 0.35)] == [5, 9, 13]
    for f in (0.15, 0.25, 0.35):
        k = uniform_rank(QUICK_SHAPES, f)
        dense = sum(m * n for m, n in QUICK_SHAPES)
        assert (
            sum(k * (m + n) for m, n in QUICK_SHAPES)
            <= f * dense
            < sum((k + 1) * (m + n) for m, n in QUICK_SHAPES)
        )
    assert (
        uniform_rank(QUICK_SHAPES, 0.0) == 0 and uniform_rank(QUICK_SHAPES, 1.0) == 37
    )  # 37 x 2,176 <= 81,920


class _CheckEveryStep(AdHocStructure):
    """Asserts the constraint on the weights the next forward pass sees, after every projection."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.checked = 0

    def project(self) -> None:
        super().project()
        for lin in self.modules.values():
            W = lin.weight.detach()
            if self.config.components == "low_rank":
                assert torch.linalg.matrix_rank(W) <= self.rank
            else:
                assert int((W != 0).sum()) <= math.floor(self.config.budget * W.numel())
        self.checked += 1


@pytest.mark.parametrize("components", ["low_rank", "sparse"])
def test_a_fit_stays_inside_the_constraint_and_deploys_as_trained(quiet_trainer, components):
    torch.manual_seed(0)
    module = SALAADLM(**TINY, admm=None, adhoc={"components": components, "budget": 0.3})
    (callback,) = module.configure_callbacks()
    assert isinstance(callback, AdHocStructure) and callback.config == AdHocConfig(components, 0.3)
    probe = _CheckEveryStep(callback.config)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    quiet_trainer(max_steps=6, num_sanity_val_steps=0, limit_val_batches=2, callbacks=[probe]).fit(
        module, _dm()
    )
    assert probe.checked == 7  # once before the first step, then after each of the 6 optimiser steps
    moved = [n for n, p in module.named_parameters() if not torch.equal(p, before[n])]
    assert any("proj" in n for n in moved)  # the blocks learn inside the constraint
    blocks = probe.structured_blocks()
    dep = deploy(blocks, 0.3)
    for name, (lin, _, _) in blocks.items():  # at its own budget HPA keeps every rank and entry
        assert torch.allclose(dep.weights[name], lin.weight.detach(), atol=1e-5), name
    assert dep.fraction <= 0.3


def test_the_floor_has_no_blocks_and_the_sweep_reads_it(quiet_trainer):
    torch.manual_seed(0)
    module = SALAADLM(**TINY, admm=None, adhoc={"components": "low_rank", "budget": 0.0})
    sweep = CapacitySweep(fractions=(0.5, 0.15))
    quiet_trainer(max_steps=3, num_sanity_val_steps=0, limit_val_batches=2, callbacks=[sweep]).fit(
        module, _dm(12)
    )
    (callback,) = [c for c in module.trainer.callbacks if isinstance(c, AdHocStructure)]
    assert callback.rank == 0 and all(not lin.weight.any() for lin in callback.modules.values())
    logged = module.trainer.callback_metrics
    assert float(logged["capacity/params@0.5"]) == 0.0
    assert float(logged["val/loss@0.5"]) == pytest.approx(float(logged["val/loss@0.15"]))


def test_bad_adhoc_settings_fail_by_name():
    with pytest.raises(ValueError, match="budget=1.5"):
        AdHocConfig(budget=1.5)
    with pytest.raises(ValueError, match="components='both'"):
        AdHocConfig(components="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="both set"):
        SALAADLM(**TINY, adhoc={"budget": 0.25})  # the default admm is SALAAD's: a run is one or the other
