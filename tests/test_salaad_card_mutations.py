"""SALAAD card (seeds/salaad.yaml, issue 28): the mutation behind its mechanism claim ``surrogate_tracks_x`` (the
median over blocks of ||X - L - S|| / ||X|| at the last ADMM refresh is below 0.1).

A tiny SALAADLM with the quick config's SALAAD settings (rho 2e-2, F = 10, r* 0.15 / 0.35 for the MLP, hard-cut
d* 0.05), 200 steps: the real ADMM keeps the surrogate on X (median residual about 0.04); the same run with the
dual ascent's sign flipped (Y <- Y - rho (X - L - S), the broken variant the claim's ``fails_if`` names) drives the
residual far above 0.1. (``tests/test_salaad.py::test_admm_recovers_rpca_and_a_flipped_dual_sign_does_not`` shows
the same sign error on robust PCA.)
"""

import statistics

import lightning as L
import torch

from litlab.datamodules.text import LocalTextDataModule
from litlab.lit_modules.structured.lm import AdamWSchedule, DecoderShape
from litlab.lit_modules.structured.salaad import SALAAD, SALAADLM, SALAADSchedule
from litlab.lit_modules.structured.sparse_lowrank import BlockADMM

TINY = dict(
    net=DecoderShape(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, max_positions=32),
    optim=AdamWSchedule(warmup_steps=2),
)
STEPS = 200


def median_residual(quiet_trainer, tmp_path) -> float:
    torch.set_num_threads(1)
    L.seed_everything(0)  # the run seed: the model's init and the training windows ("data" stream)
    module = SALAADLM(**TINY, schedule=SALAADSchedule(rate_rank_by_name={"mlp": 0.35}, log_blocks=False))
    data = LocalTextDataModule(block_size=32, batch_size=4, train_windows_per_epoch=4 * STEPS, val_windows=8)
    trainer = quiet_trainer(
        max_steps=STEPS,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        gradient_clip_val=1.0,
    )
    trainer.fit(module, data)
    callback = next(c for c in trainer.callbacks if isinstance(c, SALAAD))
    assert all(b.count == STEPS // 10 for b in callback.state.values())  # one refresh every F = 10 steps
    return statistics.median(b.residual for b in callback.state.values())


def test_flipped_dual_sign_breaks_the_surrogate_residual(tmp_path, monkeypatch, quiet_trainer):
    real = median_residual(quiet_trainer, tmp_path / "real")
    assert real < 0.1  # the card's claim holds for the real implementation

    update = BlockADMM.update

    def flipped_dual(self, X):  # the broken variant: dual ascent with the wrong sign
        before = self.Y.clone()
        update(self, X)
        self.Y = before - (self.Y - before)

    monkeypatch.setattr(BlockADMM, "update", flipped_dual)
    broken = median_residual(quiet_trainer, tmp_path / "broken")
    assert not broken < 0.1, broken  # the claim fails on the broken ADMM
    assert broken > 10 * real or broken != broken  # grows without bound (or overflows to nan)
