"""What the domain-adaptation family reads from its DataModule, written down and checked once at setup.

* ``DomainData``      a labelled source domain and target domains: the source stage reads
                      ``source_train_loader`` and ``data_key`` (the cache key of the source checkpoint), the
                      methods the targets' unlabelled training images and labelled test split.
* ``SourceFreeData``  ``DomainData`` with one adapted target whose ``train_dataloader()`` yields
                      ``(view_1, view_2, index)`` of the target's unlabelled training images only, and
                      ``target_plain_loader`` yields ``(x, index)`` in order (bank and BN-statistics passes).

``litlab.datamodules.domain.RegressionDomainsDataModule`` and ``MultiTargetDigitsDataModule`` are the ones the
project ships (re-exported here for the report hooks, which rebuild a run's DataModule from its checkpoint);
this is the only file of the family that imports ``datamodules/``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch.utils.data import DataLoader

from litlab.datamodules.domain import (
    DOMAIN_LAYOUTS,
    MultiTargetDigitsDataModule,
    RegressionDomainsDataModule,
    check_domain_folder,
    weak_augment,
)
from litlab.lit_modules.core.contracts import check_data

__all__ = [
    "DOMAIN_LAYOUTS",
    "DomainData",
    "MultiTargetDigitsDataModule",
    "RegressionDomainsDataModule",
    "SourceFreeData",
    "check_data",
    "check_domain_folder",
    "weak_augment",
]


@runtime_checkable
class DomainData(Protocol):
    task: str  # "classification" | "regression"
    source_domain: str
    target_domains: list[str]
    num_outputs: int  # classes, or regression factors
    input_shape: tuple[int, int, int]

    def data_key(self) -> dict:
        """Everything that shapes the source data (the source checkpoint's cache key)."""
        ...

    def source_train_loader(self, batch_size: int = 64, shuffle: bool = True, seed: int = 0) -> DataLoader:
        """The labelled source domain, ``(x, y)``: the source stage only."""
        ...


@runtime_checkable
class SourceFreeData(DomainData, Protocol):
    target: str

    def target_size(self, target: str | None = None) -> int: ...

    def target_plain_loader(self, target: str | None = None, batch_size: int = 256) -> DataLoader:
        """The target's unlabelled training images in order, ``(x, index)``."""
        ...

    def train_dataloader(self) -> DataLoader: ...

    def val_dataloader(self) -> DataLoader: ...
