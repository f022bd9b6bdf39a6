"""The frozen-parameter guard and the trainable-fraction logger (``litlab.callbacks``), on a toy module with a frozen
``backbone`` and a trainable ``head``: each passes on a correct fit and names what is wrong on a broken one."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn

from litlab.callbacks.frozen_guard import FrozenParamGuard
from litlab.callbacks.trainable_fraction import TrainableFractionLogger
from litlab.lit_modules.core.frozen import module_digests, param_count, param_fraction, resolve_module


class Toy(L.LightningModule):
    """y = head(backbone(x)); ``fault`` breaks the frozen backbone in one way during training."""

    def __init__(self, fault: str = ""):
        super().__init__()
        torch.manual_seed(0)
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8))
        self.backbone.requires_grad_(False)
        self.head = nn.Linear(8, 1)
        self.fault = fault

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.fault == "write":
            with torch.no_grad():
                self.backbone[2].weight.add_(1e-3)
        if self.fault == "grad":
            self.backbone[0].bias.grad = torch.zeros_like(self.backbone[0].bias)
        return nn.functional.mse_loss(self.head(self.backbone(x)), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.head(self.backbone(x)), y))

    def configure_optimizers(self):
        params = list(self.head.parameters())
        if self.fault == "optimizer":
            params += list(self.backbone[0].parameters())
        return torch.optim.SGD(params, lr=0.1)


def loader():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    return torch.utils.data.DataLoader(data, batch_size=4)


def fit(model, callbacks, quiet_trainer):
    trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=0, callbacks=callbacks)
    trainer.fit(model, loader(), loader())
    return trainer


def test_guard_passes_and_logs_zero_when_the_backbone_stays_frozen(quiet_trainer):
    model = Toy()
    before = module_digests({"backbone": model.backbone})
    head_before = model.head.weight.detach().clone()
    trainer = fit(model, [FrozenParamGuard(["backbone"])], quiet_trainer)
    assert float(trainer.callback_metrics["val/backbone_changed"]) == 0.0
    assert module_digests({"backbone": model.backbone}) == before
    assert not torch.equal(model.head.weight, head_before)  # the fit did train


def test_guard_names_a_changed_tensor(quiet_trainer):
    guard = FrozenParamGuard(["backbone"])
    with pytest.raises(RuntimeError, match=r"changed during the fit: backbone\.2\.weight$"):
        fit(Toy(fault="write"), [guard], quiet_trainer)
    assert guard.changed(Toy(fault="write")) == {"backbone": []}  # a fresh copy matches the fit-start digests


def test_guard_counts_changed_tensors_in_the_logged_metric(quiet_trainer):
    trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=0, callbacks=[FrozenParamGuard("backbone")])
    with pytest.raises(RuntimeError, match="backbone.2.weight"):
        trainer.fit(Toy(fault="write"), loader(), loader())
    assert float(trainer.callback_metrics["val/backbone_changed"]) == 1.0


def test_guard_names_a_frozen_parameter_with_grad(quiet_trainer):
    with pytest.raises(
        RuntimeError, match=r"hold a \.grad or require one after training batch 0: backbone\.0\.bias"
    ):
        fit(Toy(fault="grad"), [FrozenParamGuard(["backbone"])], quiet_trainer)


def test_guard_names_a_frozen_parameter_in_the_optimizer(quiet_trainer):
    with pytest.raises(
        RuntimeError, match=r"optimizer holds frozen parameters: backbone\.0\.weight, backbone\.0\.bias"
    ):
        fit(Toy(fault="optimizer"), [FrozenParamGuard(["backbone"])], quiet_trainer)


def test_guard_refuses_a_trainable_module_and_a_bad_path(quiet_trainer):
    model = Toy()
    model.backbone[2].requires_grad_(True)
    with pytest.raises(
        ValueError, match=r"require grad at fit start: backbone\.2\.weight, backbone\.2\.bias"
    ):
        fit(model, [FrozenParamGuard(["backbone"])], quiet_trainer)
    with pytest.raises(ValueError, match=r"no module at 'backbone\.nope' \(no attribute 'nope'"):
        fit(Toy(), [FrozenParamGuard(["backbone.nope"])], quiet_trainer)
    with pytest.raises(ValueError, match="non-empty attribute paths"):
        FrozenParamGuard([])


def test_guard_exclude_leaves_the_trained_tensors_out_and_guards_the_rest(quiet_trainer):
    """A method that trains some tensors inside a guarded module (SCNS: chosen K/V rows, one token row) names
    them in ``exclude``; a write to an excluded tensor passes, a write to any other still fails."""
    excl = FrozenParamGuard(["backbone"], exclude=[r"^backbone\.2\.weight$"])
    trainer = fit(Toy(fault="write"), [excl], quiet_trainer)
    assert float(trainer.callback_metrics["val/backbone_changed"]) == 0.0
    assert excl.before is not None and "backbone.2.weight" not in excl.before["backbone"]
    model = Toy(fault="write")
    model.backbone[2].requires_grad_(True)  # trainable and excluded: no refusal at fit start
    fit(model, [FrozenParamGuard(["backbone"], exclude=[r"backbone\.2\."])], quiet_trainer)
    with pytest.raises(RuntimeError, match=r"changed during the fit: backbone\.2\.weight$"):
        fit(Toy(fault="write"), [FrozenParamGuard(["backbone"], exclude=[r"backbone\.0\."])], quiet_trainer)
    with pytest.raises(ValueError, match=r"exclude must be regular expressions, got \['\('\]"):
        FrozenParamGuard(["backbone"], exclude=["("])


def test_fraction_logger_matches_an_independent_count(quiet_trainer):
    trainer = fit(Toy(), [TrainableFractionLogger("backbone")], quiet_trainer)
    head, backbone = 8 * 1 + 1, (4 * 8 + 8) + (8 * 8 + 8)
    m = trainer.callback_metrics
    assert float(m["val/trainable_params"]) == head
    assert float(m["val/trainable_frac"]) == pytest.approx(head / backbone, rel=1e-6)
    # a tied weight counts once
    w = nn.Parameter(torch.ones(3, 3))
    assert param_count([w, w]) == 9 and param_fraction([w], [w, torch.ones(9)]) == 0.5


def test_fraction_logger_refuses_a_reference_without_parameters_or_missing(quiet_trainer):
    model = Toy()
    model.empty = nn.Identity()
    with pytest.raises(ValueError, match="reference module 'empty' has no parameters"):
        fit(model, [TrainableFractionLogger("empty")], quiet_trainer)
    with pytest.raises(ValueError, match=r"no module at 'head\.weight\.x'"):
        fit(Toy(), [TrainableFractionLogger("head.weight.x")], quiet_trainer)
    with pytest.raises(ValueError, match=r"Toy\.fault is a str, not an nn\.Module"):
        resolve_module(Toy(), "fault")
