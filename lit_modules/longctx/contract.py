"""What the long-context family needs from its DataModule, written down and checked once at setup.

``LongContextEval`` (and so every KV-cache / attention method of the family) reads its data only through
``self.trainer.datamodule``; the Trainer calls the DataModule's hooks (``setup``, ``val_dataloader``, ...), the
module never does. A DataModule fits the family when it provides:

* ``tokenizer``: the tokenizer its prompts were encoded with, or ``None`` for an integer vocabulary (the tiny
  passkey Llama). The module decodes answers with its own model's tokenizer; setup checks the two agree.
* ``val_dataloader()``: batches of ONE ``PromptItem`` (a list holding one dict); ``litlab test`` also needs
  ``test_dataloader()`` (Lightning says so when it is missing);
* ``calib_prompts()`` (only for methods that calibrate on prompts, e.g. SALE's per-head thresholds):
  a list of ``PromptItem``.

The harness checks the Protocol once at setup with ``litlab.lit_modules.core.contracts.check_protocol``.
This module is also the family's one door to ``litlab.datamodules``: the prompt generator the tiny passkey model
is pre-trained on (``tiny_prompt``) is re-exported here, so the rest of the family never imports a datamodule.
"""

from __future__ import annotations

from typing import Any, Protocol, TypedDict

import torch

from litlab.datamodules.long_context import tiny_prompt
from litlab.lit_modules.core.errors import ContractError

__all__ = ["CalibrationData", "LongContextData", "PromptItem", "check_prompt_item", "tiny_prompt"]


class PromptItem(TypedDict):
    """One retrieval prompt. The question is kept apart from the context so a KV method can compress the context
    before the question arrives (the multi-turn setting of xKV, arXiv 2503.18893)."""

    context_ids: torch.Tensor  # [L_ctx] long
    query_ids: torch.Tensor  # [L_q] long
    answer_ids: list[int]  # the needle token(s) for an integer vocabulary; [] for text prompts
    answer_text: str  # what must appear in the decoded answer (text prompts)
    length: int  # context + query tokens
    depth: float  # where the needle sits, in [0, 1]


class LongContextData(Protocol):
    """What ``LongContextEval`` needs from ``trainer.datamodule``."""

    @property
    def tokenizer(self) -> Any: ...

    def val_dataloader(self) -> Any: ...


class CalibrationData(LongContextData, Protocol):
    """``LongContextData`` plus calibration prompts (SALE's per-head threshold calibration)."""

    def calib_prompts(self) -> list[PromptItem]: ...


def check_prompt_item(item: object, datamodule: object) -> None:
    """Raise ``ContractError`` when a batch item is not a ``PromptItem`` (checked on the first batch)."""
    cls = type(datamodule)
    if not isinstance(item, dict):
        raise ContractError(
            f"{cls.__qualname__}'s loaders must yield batches of one PromptItem dict; got {type(item).__name__}"
        )
    missing = [k for k in PromptItem.__annotations__ if k not in item]
    if missing:
        raise ContractError(f"{cls.__qualname__}'s prompt items lack {missing} (PromptItem)")
