"""Keep a run's adapters apart from its base model, as PEFT does: ``<run>/adapters.safetensors``, and, for a
Hugging Face base, ``<run>/adapter_peft/`` in PEFT's own layout (``peft.PeftModel.from_pretrained`` loads it)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from litlab.lit_modules.core.adapters import find_adapters, save_adapters
from litlab.lit_modules.core.peft_format import save_peft_adapter


def _hf_base_holding_all(pl_module: L.LightningModule, adapted: dict) -> tuple[str, nn.Module] | None:
    """The outermost ``transformers.PreTrainedModel`` inside ``pl_module`` that holds every adapter, if any."""
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    for name, module in pl_module.named_modules():
        if isinstance(module, PreTrainedModel):
            prefix = f"{name}." if name else ""
            if all(a.startswith(prefix) for a in adapted):
                return name, module
    return None


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
        if self.peft == "never":
            return
        found = _hf_base_holding_all(pl_module, adapted)
        if found is None:
            if self.peft == "always":
                raise ValueError(
                    f"SaveAdapters(peft='always'): no Hugging Face model inside {type(pl_module).__name__} holds "
                    f"all its adapters ({list(adapted)[:4]}...); PEFT loads adapters onto a Hugging Face base"
                )
            return
        _, base = found
        try:
            save_peft_adapter(
                base,
                run_dir / self.peft_folder,
                base_model_name_or_path=getattr(base.config, "_name_or_path", None) or None,
                task_type="CAUSAL_LM" if type(base).__name__.endswith("ForCausalLM") else None,
            )
        except ValueError as err:
            if self.peft == "always":
                raise
            rank_zero_info(f"SaveAdapters: no PEFT copy of the adapters ({err})")
