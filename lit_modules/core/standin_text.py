"""Text data sets and tokenizers in their real layout, for the stand-ins of the full configs
(``litlab.standin``): a few C4 records in ``allenai/c4``'s shard layout and tokenizers of the classes that t5-base
and gpt2 load as, built here from a vocabulary written here. Nothing is downloaded; the same call writes the same
bytes (a seeded ``random.Random``; gzip headers without a time stamp).
"""

from __future__ import annotations

import gzip
import json
import random
import string
from collections.abc import Callable
from pathlib import Path

SEED = 0
# the words of the stand-in's text: common English words, so a word-piece vocabulary has something to merge
WORDS = (
    "the of and a to in is for on that with was as it by at from be this are have new more an will can "
    "city water time people year day world data model music school family house river market game study"
).split()
# allenai/c4 (en): 1024 train and 8 validation shards of JSON lines {"text", "timestamp", "url"}
C4_SHARDS = {"train": "c4-train.00000-of-01024.json.gz", "validation": "c4-validation.00000-of-00008.json.gz"}


def c4_document(rng: random.Random, words: int) -> str:
    """Sentences of 6-14 words from ``WORDS``, capitalised, with a number now and then."""
    sentences, left = [], words
    while left > 0:
        n = min(left, rng.randint(6, 14))
        tokens = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            tokens[rng.randrange(n)] = str(rng.randint(1, 2020))
        sentences.append(" ".join(tokens).capitalize() + rng.choice(".!?"))
        left -= n
    return " ".join(sentences)


def write_c4_layout(
    root: Path, subset: str = "en", docs: dict[str, int] | None = None, words_per_doc: int = 80
) -> Path:
    """``<root>/<subset>/c4-<split>.00000-of-<n>.json.gz``: ``docs[split]`` records (default 64 train, 16
    validation) of C4's fields, each line ``{"text", "timestamp", "url"}``. Returns ``root`` (``local_dir``)."""
    rng = random.Random(SEED)
    folder = root / subset
    folder.mkdir(parents=True)
    for split, count in (docs or {"train": 64, "validation": 16}).items():
        with gzip.GzipFile(folder / C4_SHARDS[split], "wb", mtime=0) as f:
            for i in range(count):
                record = {
                    "text": c4_document(rng, words_per_doc),
                    "timestamp": f"2019-04-{1 + i % 28:02d}T12:00:00Z",
                    "url": f"https://example.org/{split}/{i}",
                }
                f.write((json.dumps(record) + "\n").encode())
    return root


def write_t5_tokenizer(folder: Path) -> Path:
    """A ``T5Tokenizer`` as t5-base's (SentencePiece unigram, ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, 100 sentinel
    ``<extra_id_*>`` tokens) over the ASCII printable characters and ``WORDS`` as word pieces: 218 tokens."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -5.0) for c in string.ascii_letters + string.digits + string.punctuation]
    pieces += [("\u2581" + w, -3.0) for w in WORDS[:20]]
    T5Tokenizer(vocab=pieces, extra_ids=100).save_pretrained(folder)
    return folder


def write_gpt2_tokenizer(folder: Path) -> Path:
    """A ``GPT2Tokenizer`` as gpt2's (byte-level BPE, ``<|endoftext|>`` as BOS/EOS/UNK) with the 256 byte tokens
    (``core.tiny_hf.byte_vocab``) and no merges: any text encodes, one token per byte; 257 tokens."""
    from transformers import GPT2Tokenizer

    from litlab.lit_modules.core.tiny_hf import byte_vocab

    GPT2Tokenizer(vocab=byte_vocab("<|endoftext|>"), merges=[]).save_pretrained(folder)
    return folder


def c4_stand_in_data(
    workdir: Path, write_tokenizer: Callable[[Path], Path], name: str
) -> tuple[int, list[str]]:
    """What the C4 pre-training stand-ins share: ``write_c4_layout`` in ``<workdir>/c4`` and a tokenizer written by
    ``write_tokenizer`` in ``<workdir>/<name>``; returns the tokenizer's size (the model's vocabulary) and the
    data module's arguments (that folder and tokenizer, 2 sequences of 64 tokens a batch, 2 validation batches, no
    loader workers)."""
    from transformers import AutoTokenizer

    c4 = write_c4_layout(workdir / "c4")
    tokenizer = write_tokenizer(workdir / name)
    vocab = len(AutoTokenizer.from_pretrained(tokenizer))
    return vocab, [
        f"--data.init_args.local_dir={c4}",
        f"--data.init_args.tokenizer={tokenizer}",
        "--data.init_args.block_size=64",
        "--data.init_args.batch_size=2",
        "--data.init_args.val_batches=2",
        "--data.init_args.num_workers=0",
    ]
