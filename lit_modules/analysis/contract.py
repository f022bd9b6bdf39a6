"""What the analysis family reads from its DataModule (checked once at setup with ``check_data``).

``DomainEvalData``: the CPT domain's name and fixed evaluation windows of the domain and of the general
(pre-training-like) distribution, as one ``{"input_ids", "labels"}`` batch each, for training-free evaluations
(head rewinding, swaps, interpolation). ``litlab.datamodules.domain_corpus.DomainCorpusDataModule`` (local corpora)
and ``litlab.datamodules.hub_corpus.HubCorpusDataModule`` (Hugging Face data sets) provide it.

``TaskData``: a task's examples in their transmission order and its evaluation pairs, ``(question, answer line)``
strings, and how a generated answer line scores against an answer (``score``), for task complexity.
``litlab.datamodules.sums_task.SumsTaskDataModule`` (the sums toy, exact match) and
``litlab.datamodules.hub_tasks.HubTaskDataModule`` (GSM8K, the final number) provide it.
"""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from torch import Tensor

from litlab.datamodules.domain_corpus import DOMAINS, DomainCorpusDataModule, domain_ids, fixed_windows
from litlab.datamodules.sums_task import (
    TASKS,
    SumsTaskDataModule,
    posttraining_text,
    pretraining_text,
    task_pairs,
)
from litlab.lit_modules.core.contracts import check_data

__all__ = [
    "DOMAINS",
    "TASKS",
    "DomainCorpusDataModule",
    "DomainEvalData",
    "SumsTaskDataModule",
    "TaskData",
    "check_data",
    "domain_eval_set",
    "posttraining_text",
    "pretraining_text",
    "task_pairs",
]


@runtime_checkable
class DomainEvalData(Protocol):
    domain: str
    general_domain: str

    def eval_set(self, which: Literal["domain", "general"]) -> dict[str, Tensor]: ...


@runtime_checkable
class TaskData(Protocol):
    task: str

    def examples(self) -> list[tuple[str, str]]: ...

    def eval_pairs(self) -> list[tuple[str, str]]: ...

    def score(self, generated: str, answer: str) -> float: ...


def domain_eval_set(
    domain: str, block_size: int = 64, n: int = 64, tokenizer: str | None = None
) -> dict[str, Tensor]:
    """The fixed validation windows of a local domain for ``litlab analyze``: characters (litlab's tiny models) or,
    with ``tokenizer`` (``smollm2``, a Hugging Face id or folder), that LM's tokens, as ``DomainCorpusDataModule``."""
    return fixed_windows(domain_ids(domain, tokenizer=tokenizer)[1], block_size, n)
