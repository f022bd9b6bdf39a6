"""The local text corpus that needs no download, and its character tokenizer.

The corpus is the docstrings of a fixed list of pure-Python stdlib modules: English prose with some code, a few
hundred thousand characters, enough to pre-train and adapt tiny language models. Its exact text depends on the
Python minor version (3.11 and 3.12 docstrings differ), so compare losses only between runs on the same Python.
``datamodules.text`` serves it as a LightningDataModule; ``core.pretrain`` pre-trains tiny models on it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import types

import numpy as np
import torch

# Pure-Python modules only: C modules have short or platform-dependent docstrings.
# Sorted, and never reordered, so the corpus is stable within a Python version.
CORPUS_MODULES = (
    "argparse",
    "ast",
    "asyncio.events",
    "asyncio.streams",
    "asyncio.tasks",
    "calendar",
    "collections",
    "configparser",
    "contextlib",
    "dataclasses",
    "difflib",
    "doctest",
    "email.message",
    "email.utils",
    "enum",
    "fractions",
    "ftplib",
    "functools",
    "gettext",
    "http.client",
    "http.cookiejar",
    "http.server",
    "imaplib",
    "inspect",
    "ipaddress",
    "logging",
    "logging.handlers",
    "mailbox",
    "optparse",
    "pathlib",
    "pdb",
    "pickletools",
    "poplib",
    "pprint",
    "shutil",
    "smtplib",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "typing",
    "unittest.case",
    "unittest.mock",
    "urllib.parse",
    "urllib.request",
    "uuid",
    "zipfile",
)

_CORPUS_CACHE: dict[str, str] = {}


def normalise(doc: str) -> str:
    lines = (" ".join(line.split()) for line in doc.splitlines())
    return "\n".join(line for line in lines if line)


def module_docstrings(module: types.ModuleType) -> list[str]:
    """The module's docstring, then those of its own classes (with their methods and properties) and functions,
    in name order; ``logging.Logger`` is read as the cards were recorded (``recorded_logger_members``)."""
    with recorded_logger_members():
        return _own_docstrings(module)


def _own_docstrings(module: types.ModuleType) -> list[str]:
    docs = [module.__doc__]
    for name in sorted(vars(module)):
        obj = vars(module)[name]
        # Skip re-exports: their text belongs to (and may be collected with) another module.
        if getattr(obj, "__module__", None) != module.__name__:
            continue
        if isinstance(obj, type):
            docs.append(obj.__doc__)
            for member_name in sorted(vars(obj)):
                member = vars(obj)[member_name]
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, (types.FunctionType, property)):
                    docs.append(member.__doc__)
        elif isinstance(obj, types.FunctionType):
            docs.append(obj.__doc__)
    return [doc for doc in docs if isinstance(doc, str)]


@contextlib.contextmanager
def stdlib_members_kept():
    """Import a library that re-binds members of stdlib classes without changing the corpus.

    transformers and diffusers both bind ``logging.Logger.warning_advice`` (and friends), each with its own
    docstring, and ``module_docstrings`` reads ``logging.Logger``'s members: whichever library was imported last
    would decide the corpus. Every language-model fit imports transformers first, so the corpus the cards were
    recorded on holds transformers' bindings; a later import (diffusers) inside this block leaves them as they were.
    """
    logger_members = dict(vars(logging.Logger))
    try:
        yield
    finally:
        for name in set(vars(logging.Logger)) - set(logger_members):
            delattr(logging.Logger, name)
        for name, member in logger_members.items():
            if vars(logging.Logger).get(name) is not member:
                setattr(logging.Logger, name, member)


# The members transformers binds on ``logging.Logger`` when it is imported (transformers.utils.logging).
TRANSFORMERS_LOGGER_MEMBERS = ("warning_advice", "warning_once", "info_once")


@contextlib.contextmanager
def recorded_logger_members():
    """``logging.Logger`` as the cards' corpus was recorded: the stdlib class plus transformers' three bindings.

    ``module_docstrings`` reads ``logging.Logger``'s members, and what they are depends on which libraries this
    process imported, and in which order (diffusers re-binds ``warning_advice``; a process that never imported
    transformers has none of the three). Reading docstrings under this block makes the text independent of that
    history; the class is left as it was found.
    """
    from transformers.utils import logging as transformers_logging

    with stdlib_members_kept():
        for name in TRANSFORMERS_LOGGER_MEMBERS:
            setattr(logging.Logger, name, getattr(transformers_logging, name))
        yield


def local_text_corpus(min_chars: int = 200_000) -> str:
    """Docstrings of `CORPUS_MODULES`, whitespace-normalised, joined with blank lines.

    Deterministic for a given Python minor version. Raises if fewer than `min_chars`
    characters are found (e.g. under `python -OO`, which strips docstrings).
    """
    if "text" not in _CORPUS_CACHE:
        seen: set[str] = set()
        parts: list[str] = []
        for module_name in CORPUS_MODULES:
            for doc in module_docstrings(importlib.import_module(module_name)):
                text = normalise(doc)
                # Aliases share a docstring; repeating it would inflate the corpus.
                if text and text not in seen:
                    seen.add(text)
                    parts.append(text)
        _CORPUS_CACHE["text"] = "\n\n".join(parts)
    text = _CORPUS_CACHE["text"]
    if len(text) < min_chars:
        raise RuntimeError(
            f"local text corpus has {len(text)} characters, fewer than min_chars={min_chars}; "
            "docstrings may be stripped (python -OO) or this Python's stdlib differs"
        )
    return text


class CharTokenizer:
    """Fixed character vocabulary: 0 = unknown, 1 = newline, then the 95 printable ASCII characters.

    Independent of the corpus, so models trained on different splits share token ids.
    """

    unknown_id = 0
    unknown_char = "\ufffd"

    def __init__(self) -> None:
        self.chars = [self.unknown_char, "\n"] + [chr(c) for c in range(32, 127)]
        self._ascii_to_id = np.zeros(128, dtype=np.int64)
        for i, ch in enumerate(self.chars[1:], start=1):
            self._ascii_to_id[ord(ch)] = i

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        codes[codes >= 128] = 0  # code point 0 (NUL) is not in the vocabulary either, so -> unknown
        return torch.from_numpy(self._ascii_to_id[codes])

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        return "".join(self.chars[i] for i in ids)
