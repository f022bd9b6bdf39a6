"""Paired image/"caption" data for the Gap-Init dual-encoder toy ("When Is Rank-1 Enough? Geometry-Guided
Initialization for Parameter-Efficient Fine-Tuning", Zhao, Han, Hovy, ICML 2026, arXiv 2602.01522).

sklearn's bundled digits (offline): pixels / 16 flattened to 64 numbers; the "caption" of an image is its digit
id (a 10-word vocabulary). Stratified 70/30 train/test split. The training split also pre-trains the towers
(``pretrain_pairs``) and gives the calibration pairs of Gap-Init (``calibration_dataloader``: ``calib_size``
training pairs). Each draw takes its stream from the run seed (``litlab.lit_modules.core.seeding.derive_seed``):
the split ``"data.split"``, the calibration pairs ``"calibration"``, the batch order ``"batches"``.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset

from litlab.datamodules.bundled import load_bundled
from litlab.lit_modules.core.seeding import derive_seed


def load_digit_pairs(split_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_train [n, 64], y_train [n], x_test, y_test)``: digits / 16, stratified 70/30 (``random_state=split_seed``)."""
    from sklearn.model_selection import train_test_split

    X, y = load_bundled("digits")
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, stratify=y, random_state=split_seed)
    f = lambda a: torch.tensor(a / 16.0, dtype=torch.float32)  # noqa: E731
    return f(Xtr), torch.tensor(ytr), f(Xte), torch.tensor(yte)


class EpochPermutation(Sampler[int]):
    """A permutation drawn from ``seed + 1000·epoch``: every epoch is reproducible, so is a resumed run (Lightning
    calls ``set_epoch`` at each epoch start)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + 1000 * self.epoch)
        yield from torch.randperm(self.n, generator=g).tolist()


def epoch_shuffled_loader(ds: TensorDataset, batch_size: int, collate_fn) -> DataLoader:
    """Training batches of ``ds``: each epoch a fresh ``EpochPermutation`` of the run's ``"batches"`` stream."""
    return DataLoader(
        ds,
        batch_size=batch_size,
        sampler=EpochPermutation(len(ds), derive_seed("batches")),
        collate_fn=collate_fn,
    )


class DigitsPairDataModule(L.LightningDataModule):
    """Batches ``{"x": [b, 64], "y": [b]}``. Training batches are a fresh permutation per epoch (the run's
    ``"batches"`` stream); validation is the whole test split in one batch."""

    def __init__(self, batch_size: int = 64, calib_size: int = 256):
        super().__init__()
        if batch_size < 1 or calib_size < 1:
            raise ValueError(f"batch_size and calib_size must be >= 1, got {batch_size}, {calib_size}")
        self.save_hyperparameters()
        self.x_train, self.y_train, self.x_test, self.y_test = load_digit_pairs(derive_seed("data.split"))
        if calib_size > len(self.x_train):
            raise ValueError(f"calib_size={calib_size} exceeds the {len(self.x_train)} training pairs")

    def pretrain_pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The training split, for the contrastive pre-training of the towers."""
        return self.x_train, self.y_train

    def calibration_dataloader(self) -> DataLoader:
        """``calib_size`` training pairs (the run's ``"calibration"`` draw), one batch: Gap-Init's calibration set
        D_cal."""
        g = torch.Generator().manual_seed(derive_seed("calibration"))
        idx = torch.randperm(len(self.x_train), generator=g)[: self.hparams.calib_size]
        ds = TensorDataset(self.x_train[idx], self.y_train[idx])
        return DataLoader(ds, batch_size=len(idx), collate_fn=_collate)

    def train_dataloader(self) -> DataLoader:
        ds = TensorDataset(self.x_train, self.y_train)
        return epoch_shuffled_loader(ds, self.hparams.batch_size, _collate)

    def val_dataloader(self) -> DataLoader:
        ds = TensorDataset(self.x_test, self.y_test)
        return DataLoader(ds, batch_size=len(ds), collate_fn=_collate)


def _collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    xs, ys = zip(*items)
    return {"x": torch.stack(xs), "y": torch.stack(ys)}
