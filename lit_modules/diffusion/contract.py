"""What the diffusion family reads from its DataModule, written down and checked once at setup.

* ``ConceptStreamData``  a base world to pre-train a small text-to-image base on (``base_batch``,
                         ``data_key``, ``vocab``, ``seq_len``, ``image_size``; ``data_root`` None) or a concept
                         folder that needs a pretrained base (``data_root``), a sequence of concepts with
                         their training images, prompts, token rows and held-out grids, generic calibration
                         prompts, and the task of each epoch of the one fit that walks the sequence.
* ``VideoSRData``        paired video super-resolution: clip geometry (``frames``, ``frame_size``, ``scale``), unpaired
                         HQ clips to pre-train a small video DiT on (``pretrain_batch``, ``data_key``), and
                         (HQ, LQ) batches from its train / val loaders (HQ (B, 3, F, H, W), LQ (B, 3, F, H/s, W/s),
                         both in [-1, 1]).

``litlab.datamodules.continual_concepts.ContinualConceptDataModule`` and
``litlab.datamodules.synthetic_vsr.SyntheticVSRDataModule`` are the ones the project ships; this is the only file
of the family that imports ``datamodules/``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from litlab.datamodules.continual_concepts import CIFC_LAYOUT, tokenize
from litlab.datamodules.synthetic_vsr import bicubic_up
from litlab.lit_modules.core.contracts import check_data

__all__ = [
    "CIFC_LAYOUT",
    "ConceptStreamData",
    "VideoSRData",
    "bicubic_up",
    "check_data",
    "tokenize",
]


@runtime_checkable
class ConceptStreamData(Protocol):
    num_concepts: int
    image_size: int
    seq_len: int
    vocab: tuple[str, ...]
    eval_timesteps: list[int]
    data_root: str | None  # a concept folder (no base world: the model needs a pretrained base), or None

    def data_key(self) -> dict:
        """Everything that shapes the base world (the cached base's key)."""
        ...

    def base_batch(self, batch_size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """Base-world images and prompt ids (pre-training of the quick-scale base)."""
        ...

    def base_eval_set(self) -> tuple[Tensor, Tensor]:
        """Images and prompt ids of the base-preservation set (the loss at tau = 500 before and after the stream)."""
        ...

    def task_of_epoch(self, epoch: int) -> int: ...

    def task_images(self, t: int) -> Tensor: ...

    def concept_prompt(self, t: int) -> str: ...

    def class_prompt(self, t: int) -> str: ...

    def token_ids(self, t: int) -> tuple[int, int]:
        """(row of <V_t>, row of its class word) in the text encoder's embedding."""
        ...

    def heldout(self, t: int, noise_shape: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Concept t's held-out (images, timesteps, noise) grid; the noise in ``noise_shape`` per item (default
        the image's: pixel space)."""
        ...

    def calibration_prompts(self) -> list[str]: ...

    def concept_tokens(self) -> list[str]:
        """``<V_t>`` of every concept, in task order."""
        ...

    def use_tokenizer(self, tokenize_fn, token_id_fn) -> None:
        """Prompts and token rows from a pretrained base's tokenizer instead of the fixed vocabulary."""
        ...


@runtime_checkable
class VideoSRData(Protocol):
    frames: int
    frame_size: tuple[int, int]  # (height, width) of an HQ frame
    scale: int

    def data_key(self) -> dict:
        """Everything that shapes the pre-training clips (the cached backbone's key)."""
        ...

    def pretrain_batch(self, batch_size: int, gen: torch.Generator) -> Tensor:
        """Unpaired HQ clips (B, 3, F, H, W) in [-1, 1] for pre-training the quick-scale backbone."""
        ...

    def train_dataloader(self): ...

    def val_dataloader(self): ...
