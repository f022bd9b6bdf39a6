"""``SpectralProbe``: Diffract's spectral probes during any fit ("Diffract: Spectral View of LLM Domain Adaptation",
ICML 2026, the toolkit's spectral kernels).

Every ``every_n_steps`` optimizer steps (before the step's update, so step 0 sees θ = θ0) it compares every analysed
matrix of the model (``pl_module.model`` when the module has one) with its value at the start of the fit: means of
``rW, rS, ρ``, agreement ``a``, best match ``b`` and top-k overlap ``ov`` (``probe/<name>``), plus the per-head update
ratios ``r_{l,h,P}`` (``probe/head_cv``) when the model's attention is recognised. At the end of the fit it writes
``<run>/probe_heads.png`` (the last ``[layer x head]`` heatmaps) and ``<run>/probe.json`` (the history).

It reads weights only, under ``no_grad``, with exact SVDs: no random generator is touched and training is bitwise
the same with or without it. θ0 travels in the callback's checkpoint state, so a resumed fit compares with the
same θ0.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from litlab.lit_modules.analysis import heads as H
from litlab.lit_modules.analysis.checkpoints import head_counts
from litlab.lit_modules.analysis.diffract import (
    DEFAULT_MATRICES,
    analysed_names,
    head_ratios,
    heterogeneity,
    spectral_table,
    table_means,
)
from litlab.lit_modules.core.io import atomic_write_json


class SpectralProbe(L.Callback):
    def __init__(
        self, every_n_steps: int = 50, k: int = 16, matrices: str = DEFAULT_MATRICES, heatmap: bool = True
    ):
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps} must be >= 1")
        self.every, self.k, self.matrices, self.heatmap = every_n_steps, k, matrices, heatmap
        self.base: dict[str, torch.Tensor] | None = None
        self.history: list[dict] = []
        self.last_ratios: dict | None = None

    @staticmethod
    def _model(pl_module):
        inner = getattr(pl_module, "model", None)
        return inner if isinstance(inner, torch.nn.Module) else pl_module

    def _state(self, pl_module) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self._model(pl_module).state_dict().items()}

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.base is None:
            self.base = self._state(pl_module)

    @torch.no_grad()
    def measure(self, pl_module) -> dict[str, float]:
        now = self._state(pl_module)
        names = analysed_names(self.base, self.matrices)
        out = table_means(spectral_table(self.base, now, names, self.k))
        try:
            n, n_kv = head_counts(self._model(pl_module))
            ratios = head_ratios(self.base, now, H.find_attention(self.base, n, n_kv))
        except ValueError:
            ratios = None
        if ratios is not None:
            self.last_ratios = {p: r.tolist() for p, r in ratios.items()}
            if pl_module.global_step > 0:
                out.update(heterogeneity(ratios))
        return out

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every:
            return
        values = self.measure(pl_module)
        self.history.append({"step": step, **values})
        for name, v in values.items():
            pl_module.log(f"probe/{name}", float(v), on_step=True, on_epoch=False)

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        root = Path(trainer.default_root_dir)
        atomic_write_json(root / "probe.json", {"history": self.history, "head_ratios": self.last_ratios})
        if self.heatmap and self.last_ratios:
            import matplotlib  # a second to import: only for the heatmap

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, axes = plt.subplots(1, len(self.last_ratios), figsize=(3 * len(self.last_ratios), 3))
            for ax, (p, r) in zip(axes, self.last_ratios.items()):
                im = ax.imshow(torch.tensor(r), aspect="auto")
                ax.set(title=f"r[layer, head] {p}", xlabel="head", ylabel="layer")
                fig.colorbar(im, ax=ax)
            fig.tight_layout()
            fig.savefig(root / "probe_heads.png", dpi=100)
            plt.close(fig)

    def state_dict(self) -> dict:
        return {"base": self.base, "history": self.history}

    def load_state_dict(self, state: dict) -> None:
        self.base = state.get("base")
        self.history = list(state.get("history", []))
