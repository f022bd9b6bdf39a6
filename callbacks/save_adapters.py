"""Keep a run's adapters apart from its base model, as PEFT does: ``<run>/adapters.safetensors``."""

from __future__ import annotations

from pathlib import Path

import lightning as L

from litlab.lit_modules.core.adapters import find_adapters, save_adapters


class SaveAdapters(L.Callback):
    """At the end of fit, write every adapter branch's factors (and their layout) to ``filename`` in the run
    folder; ``litlab.lit_modules.core.adapters.load_adapters(base_model, path)`` puts them back on a fresh base."""

    def __init__(self, filename: str = "adapters.safetensors"):
        self.filename = filename

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        adapted = find_adapters(pl_module)
        if adapted and trainer.is_global_zero and not trainer.interrupted:
            save_adapters(
                adapted,
                Path(trainer.default_root_dir) / self.filename,
                extra={"model": type(pl_module).__qualname__, "global_step": trainer.global_step},
            )
