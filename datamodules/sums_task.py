"""The sub-distribution-selection task of task complexity's CPU recipe ("Operationalising the Superficial Alignment
Hypothesis via Task Complexity", Vergara-Browne et al., ICML 2026, arXiv 2602.15829; the toy is ours, built so that
post-training "only picks which format to use").

Universe: the 100 questions ``a+b=`` with ``a, b`` in 0..9, and two answer styles, digits (``7``) and words
(``seven``). Every line is ``a+b=<answer>\\n`` in litlab's character vocabulary (``core.corpus.CharTokenizer``).

* pre-training stream: lines with uniform ``(a, b)``, the words style in ``words_frac`` of them (all sums are seen
  in both styles; the greedy default is digits);
* post-training lines: the words style for ``a`` in 0..4 only (related data, not the task);
* tasks (``TASKS``): ``words`` = answer in words for ``a`` in 5..9 (the recipe's task, 50 questions); ``digits`` = the
  same questions answered in digits (the pre-training default, a sanity task).

``SumsTaskDataModule`` serves a task: its 50 examples in an order drawn from the run's ``data.order`` stream
(``core.seeding.derive_seed``; the order a program transmits them in:
the first ``k`` are ICL's prompt, the first ``n`` online coding's data, the first ``lora_examples`` LoRA's training
set), and the whole universe of the task as the evaluation set (exact match of the generated line). Its one training
batch is that ordered list: the analysis module measures, it does not train the checkpoint.
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader

from litlab.lit_modules.core.corpus import CharTokenizer
from litlab.lit_modules.core.seeding import derive_seed

WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen"
).split()
TASKS = {"words": ("words", range(5, 10)), "digits": ("digits", range(5, 10))}


def answer(a: int, b: int, style: str) -> str:
    if style not in ("digits", "words"):
        raise ValueError(f"style must be 'digits' or 'words', got {style!r}")
    return str(a + b) if style == "digits" else WORDS[a + b]


def sum_line(a: int, b: int, style: str) -> str:
    return f"{a}+{b}={answer(a, b, style)}\n"


def pretraining_text(n_lines: int, words_frac: float, seed: int) -> str:
    """``n_lines`` lines with uniform ``(a, b)``; each in words style with probability ``words_frac``."""
    g = torch.Generator().manual_seed(seed)
    ab = torch.randint(0, 10, (n_lines, 2), generator=g).tolist()
    words = (torch.rand(n_lines, generator=g) < words_frac).tolist()
    return "".join(sum_line(a, b, "words" if w else "digits") for (a, b), w in zip(ab, words))


def posttraining_text(n_lines: int, seed: int, a_range: range = range(0, 5)) -> str:
    """``n_lines`` words-style lines with ``a`` uniform in ``a_range`` and ``b`` uniform in 0..9."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(a_range.start, a_range.stop, (n_lines,), generator=g).tolist()
    b = torch.randint(0, 10, (n_lines,), generator=g).tolist()
    return "".join(sum_line(x, y, "words") for x, y in zip(a, b))


def task_pairs(task: str) -> list[tuple[str, str]]:
    """``(question, answer line)`` of every question of ``task``, in (a, b) order: ``("7+8=", "fifteen\\n")``."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}")
    style, a_range = TASKS[task]
    return [(f"{a}+{b}=", answer(a, b, style) + "\n") for a in a_range for b in range(10)]


class SumsTaskDataModule(L.LightningDataModule):
    """One task of the sums universe (``TASKS``); the run's ``data.order`` stream fixes the transmission order of
    its examples."""

    def __init__(self, task: str = "words"):
        super().__init__()
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASKS)}")
        self.save_hyperparameters()
        self.task = task
        self.tokenizer = CharTokenizer()

    def examples(self) -> list[tuple[str, str]]:
        """The task's examples in the run's transmission order."""
        pairs = task_pairs(self.task)
        gen = torch.Generator().manual_seed(derive_seed("data.order"))
        order = torch.randperm(len(pairs), generator=gen).tolist()
        return [pairs[i] for i in order]

    def eval_pairs(self) -> list[tuple[str, str]]:
        """Every question of the task (exact match of the generated answer line)."""
        return task_pairs(self.task)

    def score(self, generated: str, answer: str) -> float:
        """Exact match of the generated line with the answer line."""
        return float(generated == answer.rstrip("\n"))

    def train_dataloader(self) -> DataLoader:
        # one batch: the ordered examples (the module's strategies transmit prefixes of it)
        return DataLoader([0], batch_size=1, collate_fn=lambda _: {"examples": self.examples()})
