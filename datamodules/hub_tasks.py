"""The tasks of task complexity at full scale ("Operationalising the Superficial Alignment Hypothesis via Task
Complexity", Vergara-Browne et al., ICML 2026, arXiv 2602.15829, §4): GSM8K, with the training examples a program
transmits drawn from MetaMathQA (``meta-math/MetaMathQA``, columns ``query`` / ``response``) and the evaluation on
the GSM8K test set (``openai/gsm8k``, config ``main``, columns ``question`` / ``answer``), scored by the final number
(the released evaluation: the number after ``The answer is:`` or ``####``, else the last number of the generation).

Sources are read as ``datamodules.hub_corpus`` reads them (``<data_root>/<id>``, a local path, or the Hub; offline,
a source not on disk stops the run when the module is built, naming it and how to get it). An example is
``("Question: <q>\\nAnswer:", " <answer on one line>\\n")``: the strategies decode greedily up to the first newline,
so an answer's own newlines become spaces.

Not built: the paper's other tasks, FLORES en-fr (NLLB examples, sacreBLEU) and IFEval (its instruction checkers).
"""

from __future__ import annotations

import re

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from litlab.datamodules.hub_corpus import CorpusSource, open_records, question_answer, resolve, take_records
from litlab.lit_modules.core.config import as_config
from litlab.lit_modules.core.errors import DatasetUnavailableError
from litlab.lit_modules.core.seeding import derive_seed

METAMATHQA = CorpusSource(
    dataset="meta-math/MetaMathQA", render="question_answer", field="query", answer_field="response"
)
GSM8K_TEST = CorpusSource(
    dataset="openai/gsm8k", name="main", split="test", render="question_answer", field="question"
)
_MARKED = re.compile(r"(?:####|answer is:?)\s*\$?\s*(-?[\d,]*\.?\d+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def final_number(text: str) -> float | None:
    """The answer a GSM8K solution states: the last number after ``####`` or ``answer is:``, else the last number
    of the text (commas and a ``$`` dropped); None when it holds no number."""
    marked = _MARKED.findall(text)
    found = marked[-1] if marked else (_NUMBER.findall(text) or [None])[-1]
    if found is None:
        return None
    try:
        return float(found.replace(",", ""))
    except ValueError:
        return None


def gsm8k_score(generated: str, answer: str) -> float:
    """1.0 when the generation's final number equals the reference's, else 0.0."""
    want, got = final_number(answer), final_number(generated)
    return float(want is not None and got is not None and abs(want - got) < 1e-6)


def one_line(question: str, answer: str) -> tuple[str, str]:
    return question, " " + " ".join(answer.split("\n")).strip() + "\n"


class HubTaskDataModule(L.LightningDataModule):
    """A task of the paper read from Hugging Face data sets, as the ``TaskData`` contract of the analysis family:
    ``examples()`` (the first ``n_examples`` records of ``train_source``, in an order drawn from the run's
    ``data.order`` stream: a program transmits prefixes of it), ``eval_pairs()`` (the first ``n_eval`` records of
    ``eval_source``) and ``score(generated, answer)``. Every training batch is the ordered example list, marked
    ``point_per_step``: ``TaskComplexity`` then measures one group of points per step (each checkpointed) and stops
    the fit after the last; its one validation batch is the evaluation pairs."""

    def __init__(
        self,
        task: str = "gsm8k",
        train_source: CorpusSource | None = None,
        eval_source: CorpusSource | None = None,
        data_root: str | None = None,
        n_examples: int = 32768,
        n_eval: int = 1319,
    ) -> None:
        super().__init__()
        if task != "gsm8k":
            raise ValueError(f"task {task!r} is not built; the full-scale tasks built are ['gsm8k']")
        if min(n_examples, n_eval) <= 0:
            raise ValueError(f"n_examples={n_examples} and n_eval={n_eval} must be positive")
        self.save_hyperparameters()
        self.task = task
        self.train_source = as_config(CorpusSource, train_source or METAMATHQA, "train_source")
        self.eval_source = as_config(CorpusSource, eval_source or GSM8K_TEST, "eval_source")
        for src in (self.train_source, self.eval_source):
            if src.render != "question_answer":
                raise ValueError(
                    f"{src.dataset}: a task's source renders question_answer, got {src.render!r}"
                )
        self.paths = [resolve(s, data_root) for s in (self.train_source, self.eval_source)]
        self._examples: list[tuple[str, str]] | None = None
        self._eval: list[tuple[str, str]] | None = None

    def _pairs(self, source: CorpusSource, path: str, split: str, n: int) -> list[tuple[str, str]]:
        pairs = [
            one_line(*question_answer(source, r))
            for r in take_records(iter(open_records(source, path, split)), n)
        ]
        if not pairs:
            raise DatasetUnavailableError(f"data set {source.dataset!r} has no records in split {split!r}")
        return pairs

    def examples(self) -> list[tuple[str, str]]:
        if self._examples is None:
            src = self.train_source
            pairs = self._pairs(src, self.paths[0], src.split, self.hparams.n_examples)
            order = torch.randperm(
                len(pairs), generator=torch.Generator().manual_seed(derive_seed("data.order"))
            )
            self._examples = [pairs[i] for i in order.tolist()]
        return self._examples

    def eval_pairs(self) -> list[tuple[str, str]]:
        if self._eval is None:
            src = self.eval_source
            self._eval = self._pairs(src, self.paths[1], src.eval_split or src.split, self.hparams.n_eval)
        return self._eval

    def score(self, generated: str, answer: str) -> float:
        return gsm8k_score(generated, answer)

    def train_dataloader(self) -> DataLoader:
        # the ordered examples (the module's strategies transmit prefixes of it), as every batch of an endless
        # stream: the module measures one group of points per step and stops the fit after the last
        return DataLoader(_Repeat(self), batch_size=None, collate_fn=lambda batch: batch)

    def val_dataloader(self) -> DataLoader:
        # one batch: the evaluation pairs (the checkpoint's zero-payload performance)
        return DataLoader([0], batch_size=1, collate_fn=lambda _: {"eval_pairs": self.eval_pairs()})


class _Repeat(IterableDataset):
    def __init__(self, dm: HubTaskDataModule) -> None:
        self.dm = dm

    def __iter__(self):
        while True:
            yield {"examples": self.dm.examples(), "point_per_step": True}
