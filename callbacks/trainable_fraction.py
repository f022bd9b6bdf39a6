"""``TrainableFractionLogger``: ``|phi| / |theta|``, the trainable parameters against a reference module.

The number adapter papers report, e.g. LiteVSR (arXiv 2606.09250, Table 1): 11.25 % of the DiT's parameters are
trained (the VAE and text encoder are not in the reference). Counted over distinct tensors (a tied weight counts
once). ``phi`` is every parameter of the LightningModule that requires grad; ``reference`` is an attribute path
on it (``"backbone.transformer"``). At the end of each validation epoch it logs ``{prefix}trainable_frac`` and
``{prefix}trainable_params``.
"""

from __future__ import annotations

import lightning as L
import torch

from litlab.lit_modules.core.frozen import param_count, param_fraction, resolve_module


class TrainableFractionLogger(L.Callback):
    """See the module docstring."""

    def __init__(self, reference: str = "backbone", log_prefix: str = "val/"):
        if not isinstance(reference, str) or not reference:
            raise ValueError(
                f"reference must be an attribute path of the reference module, got {reference!r}"
            )
        self.reference = reference
        self.log_prefix = log_prefix

    def measure(self, pl_module: torch.nn.Module) -> tuple[int, float]:
        """(trainable parameter count, fraction of the reference module's count)."""
        ref = resolve_module(pl_module, self.reference)
        if param_count(ref.parameters()) == 0:
            raise ValueError(f"the reference module {self.reference!r} has no parameters")
        trainable = [p for p in pl_module.parameters() if p.requires_grad]
        return param_count(trainable), param_fraction(trainable, ref.parameters())

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        count, frac = self.measure(pl_module)
        pl_module.log(f"{self.log_prefix}trainable_params", float(count), on_step=False, on_epoch=True)
        pl_module.log(f"{self.log_prefix}trainable_frac", frac, on_step=False, on_epoch=True)
