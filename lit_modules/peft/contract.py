"""What the PEFT family's methods need from their DataModules, written down and checked once, at setup.

Each method reads its DataModule through ``self.trainer.datamodule`` (or the one ``litlab plan`` hands it); any
DataModule that provides the members below works, and ``check_protocol`` stops a run at once, naming the class and
the missing member, when one is absent. The project's DataModules are named in each Protocol's docstring.

* ``PlanningData``      CSPLoRA's toy: the base classes that pre-train the backbone, the downstream training
                        tensors the head warms up on, and random training batches for the probe.
* ``CalibrationText``   CSPLoRA's probe of a pretrained LM: batches of token windows.
* ``CalibrationPairs``  Gap-Init: the pairs that pre-train the towers and the calibration pairs of the gap.
* ``CaptionedImages``   Gap-Init at full scale: images with captions, encoded by the backbone's encoder.
* ``RegressionText``    SPR-RAFT: records with a ``[REG]`` slot, the answer grid, target statistics, the
                        evaluation splits in loader order.
* ``SyntheticRecords``  SPR-RAFT's stand-in backbone: its generated pre-training records.
* ``NumericSplits``     SPR-RAFT's non-LLM references: the raw features of each split.

The methods check them with ``litlab.lit_modules.core.contracts.check_protocol``.

Random draws a DataModule makes take their streams from the run seed (``core.seeding.derive_seed``); a method
passes the stream it owns (the probe's batches) as an argument, so the DataModule does not decide it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from torch import Tensor
from torch.utils.data import DataLoader


class PlanningData(Protocol):
    """CSPLoRA's classification toy (``litlab.datamodules.synth_tokens.PlanningTaskData``); the tensors exist once
    ``setup`` ran."""

    num_classes: int  # downstream classes: the head's width
    train_x: Tensor  # downstream training inputs [n, tokens, dim]: the head warms up on them
    train_y: Tensor

    def pretrain_set(self) -> tuple[Tensor, Tensor]:
        """The base classes' inputs and labels, on which the frozen backbone is pre-trained."""
        ...

    def probe_batches(self, n_batches: int, batch_size: int, seed: int) -> list[tuple[Tensor, Tensor]]:
        """``n_batches`` random training batches drawn from ``seed`` (the probe's own stream)."""
        ...


class CalibrationText(Protocol):
    """Token windows for probing a pretrained causal LM (``litlab.datamodules.lm_calibration.LMCalibrationText``)."""

    def probe_batches(self, n_batches: int, batch_size: int, seed: int) -> list[dict[str, Tensor]]:
        """``{"input_ids", "labels"}`` batches (labels next-token aligned), window starts drawn from ``seed``."""
        ...


class CalibrationPairs(Protocol):
    """Paired images and captions (``litlab.datamodules.digits_pairs.DigitsPairDataModule``)."""

    def pretrain_pairs(self) -> tuple[Tensor, Tensor]:
        """The training split: the towers' contrastive pre-training and the adapted layer's training loss."""
        ...

    def calibration_dataloader(self) -> DataLoader:
        """One batch ``{"x", "y"}``: Gap-Init's calibration set D_cal."""
        ...


class CaptionedImages(Protocol):
    """Images with captions for a vision-language backbone
    (``litlab.datamodules.coco_caption.CocoKarpathyCaptionDataModule``): every loader's collate calls the encoder the
    method hands over; evaluation batches also carry ``references``."""

    def use_encoder(self, encode: Callable[[list[Any], list[str]], dict[str, Tensor]]) -> None:
        """The backbone's batch encoder ``(images, captions) -> tensors``."""
        ...

    def calibration_dataloader(self) -> DataLoader:
        """Batches of Gap-Init's calibration pairs D_cal (from the training split)."""
        ...


class NumericSplits(Protocol):
    """The raw features of each split (``litlab.datamodules.text_regression``'s DataModules)."""

    eval_splits: Sequence[str]  # the split each validation loader serves, in loader order

    def numeric_split(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``(features [n, f], targets [n])`` of split ``name`` ("train", "val", "test")."""
        ...


class RegressionText(NumericSplits, Protocol):
    """Regression records as token ids with a ``[REG]`` slot at one index (``TextRegressionDataModule``,
    ``LMTextRegressionDataModule``); the members exist once ``setup`` ran."""

    reg_index: int  # index of [REG] in every record
    width: int  # digits of a serialised target
    raft_grid: Tensor  # candidate targets of the grid expectation
    target_mean: float  # training-split statistics: z = (y - mean) / std
    target_std: float
    token_ids: dict[str, Any]  # "reg", "pad", "eos" ids and the ten "digits" ids

    def encode_answers(self, values: Any) -> Tensor:
        """``[K, width + 1]``: each value's digit ids, then <eos>."""
        ...


class SyntheticRecords(Protocol):
    """The pre-training text of SPR-RAFT's stand-in backbone (``TextRegressionDataModule``)."""

    def synthetic_records(self, n: int, seed: int) -> Tensor:
        """``n`` generated records drawn from ``seed`` (the backbone's stream)."""
        ...
