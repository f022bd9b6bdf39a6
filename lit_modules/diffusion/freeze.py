"""Frozen parts of an adapted model.

* ``freeze_(module)``: ``requires_grad_(False)`` and ``eval()``; returns the module.
* ``param_count`` / ``param_fraction(trainable, reference)``: ``|phi| / |theta|`` counted over distinct tensors
  (a tied weight counts once), the number the adapter papers report (e.g. LiteVSR's Table 1, arXiv 2606.09250);
  defined in ``core.frozen``; ``litlab.callbacks.trainable_fraction.TrainableFractionLogger`` logs it.

The bit-identity check of frozen modules across a fit is a callback: ``litlab.callbacks.frozen_guard.FrozenParamGuard``
(the LiteVSR configs put both callbacks in ``trainer.callbacks``; SCNS's quick config guards its whole model
but the K/V projections it may select and the token rows, through the guard's ``exclude``).
"""

from __future__ import annotations

from torch import nn

from litlab.lit_modules.core.frozen import param_count, param_fraction

__all__ = ["freeze_", "param_count", "param_fraction"]


def freeze_(module: nn.Module) -> nn.Module:
    module.requires_grad_(False)
    module.eval()
    return module
