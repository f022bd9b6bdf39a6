"""``StopOnDivergence``: a fit stops at the first NaN or infinite training loss or logged metric, with status
``diverged: <metric> at step N`` (``RunDiverged``), instead of training on NaN weights to a "finished" run.

Lightning's ``EarlyStopping(check_finite=True)`` checks one monitored metric, at validation only; this checks the
loss every step and every logged metric after every step and validation, before ModelCheckpoint's hook of the same
batch (it runs last), so no checkpoint holds the diverged weights. A module whose metrics are non-finite on purpose
(an analysis' "not applicable", e.g. xKV's ``cr_inf`` for the baselines) names them, as ``fnmatch`` patterns, in a
class attribute ``nonfinite_metrics_allowed``; the training loss is always checked. ``litlab fit
--stop_on_divergence=false`` turns the check off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fnmatch import fnmatch
from typing import Any

import lightning as L
import torch

from litlab.lit_modules.core.errors import RunDiverged


class StopOnDivergence(L.Callback):
    def __init__(self, allowed: tuple[str, ...] = ()):
        self.allowed = tuple(allowed)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss.detach()).all()):
            self._stop(trainer, "loss", loss)
        self._check_metrics(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._check_metrics(trainer, pl_module)

    def _check_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        name = first_nonfinite(trainer.callback_metrics, pl_module, self.allowed)
        if name is not None:
            self._stop(trainer, name, trainer.callback_metrics[name])

    def _stop(self, trainer: L.Trainer, metric: str, value: Any) -> None:
        step = trainer.global_step
        shown = value.detach().float().flatten()[:4].tolist() if isinstance(value, torch.Tensor) else value
        raise RunDiverged(
            f"diverged: {metric} is {shown} at step {step}; the run stopped before checkpointing it (turn the "
            "check off with --stop_on_divergence=false)",
            status=f"diverged: {metric} at step {step}",
        )


def first_nonfinite(
    metrics: Mapping[str, Any], pl_module: L.LightningModule, allowed: tuple[str, ...] = ()
) -> str | None:
    """The first metric that is NaN or infinite, skipping the module's ``nonfinite_metrics_allowed`` patterns."""
    allowed = tuple(allowed) + tuple(getattr(pl_module, "nonfinite_metrics_allowed", ()))
    for name, value in metrics.items():
        if not _finite(value) and not any(fnmatch(name, pattern) for pattern in allowed):
            return name
    return None


def _finite(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value.detach()).all())
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True
