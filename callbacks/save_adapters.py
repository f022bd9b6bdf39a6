"""Keep a run's adapters apart from its base model, as PEFT does: ``<run>/adapters.safetensors``, and, for a
Hugging Face base, ``<run>/adapter_peft/`` in PEFT's own layout (``peft.PeftModel.from_pretrained`` loads it).
``litlab export --peft <run or checkpoint>`` writes the same folder later, from any checkpoint of a finished run."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from litlab.lit_modules.core.adapters import find_adapters, save_adapters
from litlab.lit_modules.core.peft_format import hf_model_holding_adapters, save_module_peft_adapter


class SaveAdapters(L.Callback):
    """At the end of fit, write every adapter branch's factors (and their layout) to ``filename`` in the run
    folder; ``litlab.lit_modules.core.adapters.load_adapters(base_model, path)`` puts them back on a fresh base.

    ``peft``: also write the adapters in PEFT's LoRA layout to ``<run>/<peft_folder>``. ``"auto"`` does it when
    a Hugging Face model inside the LightningModule holds every adapter (module names are then relative to
    it, as PEFT expects); ``"always"`` fails the fit's end with the reason when that cannot be done (a
    Khatri–Rao branch, a merged one, no Hugging Face base); ``"never"`` skips it."""

    def __init__(
        self,
        filename: str = "adapters.safetensors",
        peft: str = "auto",
        peft_folder: str = "adapter_peft",
    ):
        if peft not in ("auto", "always", "never"):
            raise ValueError(f"SaveAdapters(peft=...) must be 'auto', 'always' or 'never', got {peft!r}")
        self.filename, self.peft, self.peft_folder = filename, peft, peft_folder

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        adapted = find_adapters(pl_module)
        if not (adapted and trainer.is_global_zero and not trainer.interrupted):
            return
        run_dir = Path(trainer.default_root_dir)
        save_adapters(
            adapted,
            run_dir / self.filename,
            extra={"model": type(pl_module).__qualname__, "global_step": trainer.global_step},
        )
        if self.peft == "never" or (self.peft == "auto" and hf_model_holding_adapters(pl_module) is None):
            return
        try:
            save_module_peft_adapter(pl_module, run_dir / self.peft_folder)
        except ValueError as err:
            if self.peft == "always":
                raise ValueError(f"SaveAdapters(peft='always'): {err}") from None
            rank_zero_info(f"SaveAdapters: no PEFT copy of the adapters ({err})")
