"""What the domain-adaptation family reads from its DataModule, written down and checked once at setup.

* ``DomainData``      a labelled source domain and target domains: the source stage reads
                      ``source_train_loader`` and ``data_key`` (the cache key of the source checkpoint), the
                      methods the targets' unlabelled training images and labelled test split.
* ``SourceFreeData``  ``DomainData`` with one adapted target whose ``train_dataloader()`` yields
                      ``(view_1, view_2, index)`` of the target's unlabelled training images only, and
                      ``target_plain_loader`` yields ``(x, index)`` in order (bank and BN-statistics passes);
                      ``factor_names`` name the regression factors in the logged metrics.
* ``MultiTargetData`` ``DomainData`` whose source and target images the method samples itself (an
                      iteration-bounded schedule: ``train_dataloader()`` yields step indices only);
                      ``val_dataloader()`` yields every target image as ``(x, y, domain index)``, the only
                      place target labels appear.

A module reads no DataModule member outside these Protocols (no ``getattr`` with a default): a DataModule that
lacks one fails ``check_data`` at setup, naming it.

``litlab.datamodules.domain.RegressionDomainsDataModule`` and ``MultiTargetDigitsDataModule`` are the ones the
project ships (re-exported here for the report hooks, which rebuild a run's DataModule from its checkpoint);
this is the only file of the family that imports ``datamodules/``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor
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
    "MultiTargetData",
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
    factor_names: list[str]  # one per regression factor: val/mae_<name>

    def target_size(self, target: str | None = None) -> int: ...

    def target_plain_loader(self, target: str | None = None, batch_size: int = 256) -> DataLoader:
        """The target's unlabelled training images in order, ``(x, index)``."""
        ...

    def train_dataloader(self) -> DataLoader: ...

    def val_dataloader(self) -> DataLoader: ...


@runtime_checkable
class MultiTargetData(DomainData, Protocol):
    source_x: Tensor  # (N_s, C, H, W), the labelled source images
    source_y: Tensor  # (N_s,) their classes
    target_x: list[Tensor]  # per target (``target_domains`` order): its (N_m, C, H, W) unlabelled images
    classes: list[str]  # class names, index order

    def train_dataloader(self) -> DataLoader:
        """Step indices, as many as the module's ``total_steps()``."""
        ...

    def val_dataloader(self) -> DataLoader:
        """Every target image with its class and domain index (1..M), ``(x, y, d)``: evaluation only."""
        ...
