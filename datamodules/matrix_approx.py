"""Synthetic matrix-approximation targets (the matrix-approximation experiment of LoKRA, ICML 2026): can an adapter's ΔW express a target matrix T?"""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from litlab.lit_modules.core.seeding import derive_seed

Target = Literal["flat", "diag", "lowrank"]


def make_target(kind: Target, dim: int = 64, seed: int = 1, lowrank_rank: int = 4) -> torch.Tensor:
    """``flat``: Gaussian; ``diag``: a per-feature rescaling (full rank, what LoRA cannot express);
    ``lowrank``: a rank-``lowrank_rank`` product of Gaussians (what LoRA expresses exactly)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "flat":
        return torch.randn(dim, dim, generator=g)
    if kind == "diag":
        return torch.diag(torch.randn(dim, generator=g))
    if kind == "lowrank":
        return torch.randn(dim, lowrank_rank, generator=g) @ torch.randn(lowrank_rank, dim, generator=g)
    raise ValueError(f"unknown matrix target {kind!r}; expected 'flat', 'diag' or 'lowrank'")


class _Repeat(Dataset):
    def __init__(self, item: dict[str, torch.Tensor], length: int):
        self.item, self.length = item, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.item


class MatrixApproxDataModule(L.LightningDataModule):
    """Full-batch: every training step sees the same target; an "epoch" is ``steps_per_epoch`` steps. The target
    is drawn from the run seed's ``"target"`` stream (``derive_seed``): another run seed, another target."""

    def __init__(
        self,
        target: Target = "diag",
        dim: int = 64,
        lowrank_rank: int = 4,
        steps_per_epoch: int = 200,
    ):
        super().__init__()
        if steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.save_hyperparameters()
        self.target = make_target(target, dim, seed=derive_seed("target"), lowrank_rank=lowrank_rank)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Repeat({"target": self.target}, self.hparams.steps_per_epoch), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_Repeat({"target": self.target}, 1), batch_size=None)
