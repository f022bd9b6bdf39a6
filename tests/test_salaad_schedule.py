"""SALAAD's refresh schedule on a real Trainer and the controller details that follow the official trainer
(github.com/HaoMAFRLu/salaad, ``salaad/trainer_salad.py`` and ``salaad/adaptive_param.py``): one ADMM / controller
iteration after every F-th optimiser step whatever the gradient accumulation, the damped law from update number
``pd_after`` on, ``prev_rate`` starting at 0, and the threshold clamp as an option."""

from __future__ import annotations

import pytest
import torch
from test_salaad import _Tiny

from litlab.lit_modules.structured.salaad import SALAAD, SALAADSchedule
from litlab.lit_modules.structured.sparse_lowrank import ADMMConfig, BlockADMM, controller_update, svt

STEPS, F = 8, 2


class _CountingSALAAD(SALAAD):
    """Records the optimiser step after which each ADMM iteration ran."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.refresh_steps: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        before = next(iter(self.state.values())).count
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if next(iter(self.state.values())).count != before:
            self.refresh_steps.append(trainer.global_step)


@pytest.mark.parametrize("accumulation", [1, 4, 8])
@pytest.mark.parametrize("gradient_mode", ["coupled", "decoupled"])
def test_one_admm_refresh_per_fth_step_whatever_the_accumulation(quiet_trainer, accumulation, gradient_mode):
    """The official trainer refreshes when ``num_it % num_freq == 0``, ``num_it`` counting optimiser steps: 8 steps at
    F = 2 give 4 refreshes, after steps 2, 4, 6, 8 (before the fix, 25 at accumulation 8)."""
    torch.manual_seed(1)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(STEPS * accumulation * 2, 6)), batch_size=2
    )
    schedule = SALAADSchedule(blocks=r"_proj$", num_freq=F, gradient_mode=gradient_mode, log_blocks=False)
    cb = _CountingSALAAD(ADMMConfig(rate_rank=0.5, rho=0.1), schedule)
    trainer = quiet_trainer(max_steps=STEPS, accumulate_grad_batches=accumulation, callbacks=[cb])
    trainer.fit(_Tiny(lr=0.05), data)
    assert trainer.global_step == STEPS
    assert cb.refresh_steps == [2, 4, 6, 8]
    assert all(b.count == STEPS // F for b in cb.state.values())


def test_damped_law_starts_at_update_pd_after_as_in_the_official_counter():
    """``PARAM.update`` increments its counter before testing ``nr_updates < start_epoch``: update number pd_after
    (count = pd_after - 1 updates before it) is the first damped one."""
    args = dict(rate=0.5, prev_rate=0.1, target=0.15, rho=0.02, gain=0.005, gain_d=0.01, pd_after=10)
    plain = controller_update(1.0, count=0, **args)
    assert controller_update(1.0, count=8, **args) == plain  # update 9
    assert controller_update(1.0, count=9, **args) > plain  # update 10


def test_prev_rate_starts_at_zero():
    block = BlockADMM((8, 6), ADMMConfig(rate_rank=0.5, rho=0.1, k_dalpha=1.0, pd_after=1))
    assert block.prev_rate == 0.0 and block.prev_density == 0.0
    # with the damped law from the first update, the whole rate counts as an increase over 0
    block.update(torch.randn(8, 6, generator=torch.Generator().manual_seed(0)))
    expected = 0.1 * 0.005 * (block.rate - 0.5) + 0.1 * 1.0 * block.rate
    assert block.alpha == pytest.approx(expected, rel=1e-12)


def test_clamp_thresholds_option():
    """Clamped (the platform's anti-windup) α stops at 0; unclamped (the official code) it goes negative and the SVT
    then inflates every singular value by |τ|, so the rank ratio jumps to 1."""
    low = controller_update(1e-4, rate=0.0, prev_rate=0.0, target=0.5, rho=0.1, gain=0.01)
    assert low == 0.0
    assert controller_update(1e-4, rate=0.0, prev_rate=0.0, target=0.5, rho=0.1, gain=0.01, clamp=False) < 0.0
    Z = torch.randn(8, 1, generator=torch.Generator().manual_seed(1)) @ torch.randn(1, 6)
    _, q_clamped, s_clamped = svt(Z, -0.5)
    _, q_free, s_free = svt(Z, -0.5, clamp=False)
    assert q_clamped == 1 and q_free == 6
    assert torch.allclose(s_free, s_clamped + 0.5, atol=1e-5)
    g = torch.Generator().manual_seed(2)
    # rank 1: the rate stays below r* = 0.9
    X = torch.randn(8, 1, generator=g) @ torch.randn(1, 6, generator=g)
    blocks = {
        c: BlockADMM((8, 6), ADMMConfig(rate_rank=0.9, rho=0.1, k_alpha=5.0, clamp_thresholds=c))
        for c in (True, False)
    }
    for _ in range(3):
        for b in blocks.values():
            b.update(X)
    assert blocks[True].alpha >= 0.0 and blocks[True].tau_L >= 0.0
    assert blocks[False].alpha < 0.0 and blocks[False].tau_L < 0.0
