"""Small base models trained locally in seconds and cached, standing in for a downloaded checkpoint.

``train_and_cache`` is the one train-and-cache rule every family uses: the model is built and trained under its
own seed (the caller's RNG is left as it was), the weights are cached as safetensors keyed by every argument
that shapes them, and a second call, in any process, loads the same weights.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from litlab.lit_modules.core.corpus import CharTokenizer, local_text_corpus
from litlab.lit_modules.core.io import atomic_path, cache_dir, one_builder
from litlab.lit_modules.core.models import TinyGPT
from litlab.lit_modules.core.seeding import fingerprint, record_artefact

M = TypeVar("M", bound=nn.Module)


def cache_key(args: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]


def train_and_cache(
    name: str,
    args: dict[str, Any],
    seed: int,
    build: Callable[[], M],
    train: Callable[[M], None],
    threads: int,
    skip_keys: tuple[str, ...] = (),
) -> M:
    """``build()`` then ``train(model)`` under ``torch.manual_seed(seed)`` on ``threads`` CPU threads, or load the
    cached weights.

    The thread count is part of the recipe: CPU float sums depend on how a reduction is split, and a few hundred
    optimiser steps turn that rounding into another model (measured: TinyGPT weights differ by 3e-4, the tiny
    passkey Llama's by 3e-3, TinyViT's by 0.7 between 1 and 2 threads). Fixing it per model makes the cached
    artifact the same in a 2-thread ``litlab repro`` and in a 1-thread ``--jobs`` worker.
    The file is ``<cache>/<name>-<hash of args>.safetensors``. ``skip_keys`` are state-dict entries not saved
    (tied weights), loaded back non-strictly.
    """
    from safetensors.torch import load_file, save_file

    path = cache_dir() / f"{name}-{cache_key(args)}.safetensors"
    record_artefact(name, fingerprint(name, args, seed))  # the run's seed ledger names what it was built on
    with one_builder(path), torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build()
        if path.exists():
            model.load_state_dict(load_file(str(path)), strict=not skip_keys)
            return model
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            train(model)
        finally:
            torch.set_num_threads(before)
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k not in skip_keys}
        with atomic_path(path) as tmp:
            save_file(state, str(tmp))
    return model


def pretrained_tiny_gpt(
    steps: int = 300,
    d_model: int = 64,
    n_layers: int = 2,
    n_heads: int = 4,
    block_size: int = 128,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    split: str = "first_half",
) -> TinyGPT:
    """A TinyGPT trained for ``steps`` AdamW steps on one half of the local text corpus, so every run of an
    experiment adapts the same base."""
    if split not in ("first_half", "second_half", "all"):
        raise ValueError(f"split must be 'first_half', 'second_half' or 'all', got {split!r}")
    args = dict(
        steps=steps,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        block_size=block_size,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        split=split,
    )
    tokenizer = CharTokenizer()

    def build() -> TinyGPT:
        return TinyGPT(
            vocab_size=tokenizer.vocab_size,
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            block_size=block_size,
        )

    def train(model: TinyGPT) -> None:
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
        # Not a LightningDataModule: this runs inside a LightningModule's __init__ (see LoKRALanguageModel).
        ids = tokenizer.encode(local_text_corpus())
        middle = len(ids) // 2
        ids = {"all": ids, "first_half": ids[:middle], "second_half": ids[middle:]}[split]
        offsets = torch.arange(block_size + 1)
        gen = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(steps):
            windows = ids[
                torch.randint(0, len(ids) - block_size - 1, (batch_size, 1), generator=gen) + offsets
            ]
            logits = model(windows[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()

    # 2 threads: the recipe the cards' recorded numbers were measured with
    return train_and_cache("tiny_gpt", args, seed, build, train, threads=2)
