"""Long-context retrieval prompts generated locally (passkey, multi-key needle, multi-value).

Two vocabularies share the generators' logic:
* ``vocab="tiny"``: the integer vocabulary of the tiny passkey Llama (0 pad, 1 BOS, 2 QUERY, 3 NEEDLE, 4..15 keys,
  16..47 values, 48..127 filler). Passkey: ``[BOS, filler.., v, filler.., QUERY] -> v``.
* ``vocab="smollm2"``: natural-language prompts for SmolLM2-135M-Instruct: filler sentences, the
  needle " The pass key is NNNNN. Remember it. NNNNN is the pass key. " at a depth, and the question
  "\\nWhat is the pass key? The pass key is" (or ``needle="secret_number"``: the same with "the secret number",
  which SmolLM2-135M answers in this filler); success if the key appears in the greedy answer.
  ``filler="corpus"`` (default): varied natural text, the prose sentences of the platform's stdlib docstring
  corpus (``litlab.lit_modules.core.corpus``; no digits, so no distractor keys), drawn in a new order for every
  prompt (the prompt's seed); ``filler="repeat"``: the RULER-style repeated "The grass is green. ..." line, which
  is repetitive and low-rank and so flatters every low-rank KV method.

Every item is ``{"context_ids", "query_ids", "answer_ids", "answer_text", "length", "depth"}``; the query is kept
separate so KV methods can compress the context before the question arrives (xKV's multi-turn setting, arXiv
2503.18893). This is the ``PromptItem`` of ``litlab.lit_modules.longctx.contract``, which says what the long-context
family needs from a DataModule (``tokenizer``, ``val_dataloader``, ``calib_prompts``).
Prompts are seeded by ``(the run's "prompts" stream, split, length, index)``: the stream is
``derive_seed("prompts")`` (``litlab.lit_modules.core.seeding``), so every run of one run seed reads the same prompts
and another run seed draws others; nothing is downloaded. The ``calib`` split holds multi-key prompts (SALE's
per-head threshold calibration, arXiv 2505.24179).
"""

from __future__ import annotations

import re
import zlib
from functools import lru_cache
from typing import Literal

import lightning as L
import torch
from torch.utils.data import DataLoader

from litlab.lit_modules.core.corpus import local_text_corpus
from litlab.lit_modules.core.hf import load_tokenizer, smollm2_folder
from litlab.lit_modules.core.seeding import derive_seed, fingerprint, record_artefact

PAD, BOS, QUERY, NEEDLE = 0, 1, 2, 3
KEYS, VALUES, FILLER = range(4, 16), range(16, 48), range(48, 128)
Task = Literal["passkey", "multikey", "multivalue"]
Filler = Literal["corpus", "repeat"]
Needle = Literal["pass_key", "secret_number"]

# The passkey task's needle and question (``{c}``: the five-digit code). "pass_key" is RULER's wording; in the
# docstring filler, whose prose is about programming, SmolLM2-135M-Instruct often reads "the pass key is" as code
# ("... is a function that is passed to the"): 5 of 8 prompts right at ~2K tokens, dense (2026-12-06). With
# "secret_number" it answered 8 of 8 (the same prompts otherwise).
NEEDLES = {
    "pass_key": (
        " The pass key is {c}. Remember it. {c} is the pass key. ",
        "\nWhat is the pass key? The pass key is",
    ),
    "secret_number": (
        " The secret number is {c}. Remember it. {c} is the secret number. ",
        "\nWhat is the secret number? The secret number is",
    ),
}

FILLER_TEXT = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there.\n"
)


def tiny_prompt(task: Task, length: int, gen: torch.Generator, depth: float | None = None) -> dict:
    """One integer-vocabulary prompt of exactly ``length`` tokens (context + query)."""

    def randint(lo, hi):
        return int(torch.randint(lo, hi, (), generator=gen))

    x = torch.randint(FILLER.start, FILLER.stop, (length,), generator=gen)
    x[0] = BOS
    if task == "passkey":
        v = randint(VALUES.start, VALUES.stop)
        pos = 1 + round(depth * (length - 4)) if depth is not None else randint(1, length - 2)
        x[pos], x[length - 2] = v, QUERY
        return _item(
            x[: length - 2], x[length - 2 : length - 1], [v], str(v), length, (pos - 1) / max(length - 4, 1)
        )
    n_needles = 4 if task == "multikey" else 2
    keys = torch.randperm(len(KEYS), generator=gen)[:n_needles] + KEYS.start
    vals = torch.randint(VALUES.start, VALUES.stop, (n_needles,), generator=gen)
    if task == "multivalue":
        keys[:] = keys[0]
    slots = torch.randperm((length - 8) // 3, generator=gen)[:n_needles].sort().values * 3 + 1
    for s, k, v in zip(slots.tolist(), keys.tolist(), vals.tolist()):
        x[s : s + 3] = torch.tensor([NEEDLE, k, v])
    target = int(torch.randint(0, n_needles, (), generator=gen)) if task == "multikey" else 0
    answer = [int(vals[target])] if task == "multikey" else vals.tolist()
    q = torch.tensor([QUERY, int(keys[target])])
    return _item(
        x[: length - 3], q, answer, " ".join(map(str, answer)), length, float(slots[target]) / length
    )


def _item(context, query, answer_ids, answer_text, length, depth) -> dict:
    return {
        "context_ids": context.long(),
        "query_ids": query.long(),
        "answer_ids": list(answer_ids),
        "answer_text": answer_text,
        "length": length,
        "depth": depth,
    }


_CODE_CHARS = set("_()[]{}=:`'\"<>/\\|*@#$%^&~+")


@lru_cache(maxsize=1)
def corpus_sentences() -> tuple[str, ...]:
    """Prose sentences of the local docstring corpus: 6-40 words, mostly letters, no digits (a number in the
    filler could pass for a key), no code characters, no doctest / code lines, and none of the needle's words
    ("pass", "key"). Deterministic for a Python version."""
    out = []
    for para in local_text_corpus().split("\n\n"):
        lines = [ln for ln in para.splitlines() if not ln.lstrip().startswith((">>>", "...", "-", "*", "#"))]
        for sent in re.split(r"(?<=[.!?])\s+(?=[A-Z])", " ".join(lines)):
            words = sent.split()
            letters = sum(ch.isalpha() or ch == " " for ch in sent)
            if (
                6 <= len(words) <= 40
                and sent[-1] in ".!?"
                and sent[0].isupper()
                and letters >= 0.9 * len(sent)
                and not any(ch.isdigit() or ch in _CODE_CHARS for ch in sent)
                and not any(w.lower().strip(".,;!?") in ("pass", "key", "keys", "passed") for w in words)
            ):
                out.append(sent)
    return tuple(out)


def _filler_parts(tokenizer, filler: Filler, budget: int, gen: torch.Generator) -> list[str]:
    """Filler pieces of about ``budget`` tokens in total."""
    if filler == "repeat":
        filler_len = len(tokenizer(FILLER_TEXT, add_special_tokens=False)["input_ids"])
        return [FILLER_TEXT] * max(1, budget // filler_len)
    sents = corpus_sentences()
    parts, used = [], 0
    for i in torch.randperm(len(sents), generator=gen).tolist():  # a new order for every prompt
        piece = " " + sents[i]
        used += len(tokenizer(piece, add_special_tokens=False)["input_ids"])
        if used > budget and parts:
            break
        parts.append(piece)
    return parts


def text_prompt(
    tokenizer,
    task: Task,
    length: int,
    gen: torch.Generator,
    depth: float | None = None,
    filler: Filler = "corpus",
    needle: Needle = "pass_key",
) -> dict:
    """A natural-language prompt of about ``length`` tokens (the needle's depth uniform unless given); ``needle``
    words the passkey task (``NEEDLES``)."""
    depth = float(torch.rand((), generator=gen)) if depth is None else depth
    names = ["Alice", "Bob", "Carol", "Dave"]
    n_needles = 1 if task == "passkey" else (len(names) if task == "multikey" else 2)
    codes = [int(torch.randint(10000, 100000, (), generator=gen)) for _ in range(n_needles)]
    if task == "passkey":
        needles, question = [NEEDLES[needle][0].format(c=codes[0])], NEEDLES[needle][1]
        answer = str(codes[0])
    elif task == "multikey":
        needles = [f" The pass key of {n} is {c}. Remember it. " for n, c in zip(names, codes)]
        target = int(torch.randint(0, n_needles, (), generator=gen))
        question, answer = (
            f"\nWhat is the pass key of {names[target]}? The pass key of {names[target]} is",
            str(codes[target]),
        )
    else:
        needles = [f" One of the pass keys is {c}. Remember it. " for c in codes]
        question, answer = "\nWhat are the pass keys? The pass keys are", " ".join(map(str, codes))
    fixed = len(tokenizer(INTRO + "".join(needles) + question)["input_ids"])
    parts = _filler_parts(tokenizer, filler, length - fixed, gen)
    reps = len(parts)
    for i, text in enumerate(needles):  # needles spread from the chosen depth towards the end
        at = min(reps, round((depth + i * (1 - depth) / max(n_needles, 1)) * reps))
        parts.insert(at + i, text)
    context = tokenizer(INTRO + "".join(parts), return_tensors="pt")["input_ids"][0]
    query = tokenizer(question, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    return _item(context, query, [], answer, int(context.numel() + query.numel()), depth)


class LongContextDataModule(L.LightningDataModule):
    """Retrieval prompts at the given lengths, drawn from the run's ``"prompts"`` stream; batch = one prompt (list
    of one dict). The run's ledger records a fingerprint of each split's prompt set (``prompts.<split>``).

    ``train`` yields one placeholder batch per epoch: the evaluation modules run under ``litlab fit`` (which the
    repro harness uses) and do all their work in validation.
    """

    def __init__(
        self,
        vocab: Literal["tiny", "smollm2", "text"] = "tiny",
        task: Task = "passkey",
        lengths: list[int] | int = 256,
        num_prompts: int = 32,
        calib_prompts: int = 8,
        calib_length: int | None = None,
        depths: list[float] | None = None,
        tokenizer_name: str | None = None,
        filler: Filler = "corpus",
        needle: Needle = "pass_key",
    ):
        super().__init__()
        self.save_hyperparameters()
        self.lengths = [lengths] if isinstance(lengths, int) else list(lengths)
        if vocab not in ("tiny", "smollm2", "text") or task not in ("passkey", "multikey", "multivalue"):
            raise ValueError(
                f"vocab={vocab!r} / task={task!r}: use tiny|smollm2|text and passkey|multikey|multivalue"
            )
        if filler not in ("corpus", "repeat"):
            raise ValueError(f"filler={filler!r}: use corpus (varied natural text) or repeat")
        if needle not in NEEDLES:
            raise ValueError(f"needle={needle!r}: use one of {sorted(NEEDLES)} (the passkey task's wording)")
        if vocab == "text" and not tokenizer_name:
            raise ValueError("vocab='text' needs tokenizer_name (a Hugging Face id or folder)")
        if vocab == "tiny" and min(self.lengths) < 16:
            raise ValueError(f"lengths={self.lengths}: the tiny prompts need at least 16 tokens")
        self._tokenizer = None

    @property
    def tokenizer(self):
        """The tokenizer the prompts are encoded with (None for the integer vocabulary), loaded on first use."""
        if self._tokenizer is None and self.hparams.vocab != "tiny":
            name = smollm2_folder() if self.hparams.vocab == "smollm2" else self.hparams.tokenizer_name
            self._tokenizer = load_tokenizer(name)
        return self._tokenizer

    def setup(self, stage: str) -> None:
        _ = self.tokenizer  # fail at once (offline: ModelUnavailableError naming what to download)

    def prompts(
        self, split: str, task: Task | None = None, lengths: list[int] | None = None, n: int | None = None
    ) -> list[dict]:
        hp = self.hparams
        task = task or hp.task
        n = n if n is not None else (hp.calib_prompts if split == "calib" else hp.num_prompts)
        stream = derive_seed("prompts")
        out = []
        for length in lengths or self.lengths:
            for i in range(n):
                gen = torch.Generator().manual_seed(zlib.crc32(repr((stream, split, length, i)).encode()))
                depth = hp.depths[i % len(hp.depths)] if hp.depths else None
                out.append(
                    tiny_prompt(task, length, gen, depth)
                    if hp.vocab == "tiny"
                    else text_prompt(self.tokenizer, task, length, gen, depth, hp.filler, hp.needle)
                )
        record_artefact(f"prompts.{split}", fingerprint(out))
        return out

    def calib_prompts(self) -> list[dict]:
        length = self.hparams.calib_length or max(self.lengths)
        return self.prompts("calib", "multikey", [length])

    def train_dataloader(self):
        return DataLoader([0], batch_size=1)

    def val_dataloader(self):
        return DataLoader(self.prompts("val"), batch_size=1, collate_fn=lambda b: b)

    def test_dataloader(self):
        return DataLoader(self.prompts("test"), batch_size=1, collate_fn=lambda b: b)
