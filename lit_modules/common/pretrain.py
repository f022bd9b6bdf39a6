"""Small base models pre-trained locally in seconds and cached, standing in for a downloaded checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from lit_modules.common.models import TinyGPT


def cache_dir() -> Path:
    return Path(os.environ.get("LITLAB_CACHE", "runs/cache"))


def pretrained_tiny_gpt(steps: int = 300, d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                        block_size: int = 128, batch_size: int = 32, lr: float = 3e-3, seed: int = 0,
                        split: str = "first_half") -> TinyGPT:
    """A TinyGPT trained for ``steps`` AdamW steps on one half of the local text corpus; cached on disk
    (safetensors, keyed by every argument) so every run of an experiment adapts the same base."""
    from safetensors.torch import load_file, save_file

    from datamodules.text import CharTokenizer, local_text_corpus

    args = dict(steps=steps, d_model=d_model, n_layers=n_layers, n_heads=n_heads, block_size=block_size,
                batch_size=batch_size, lr=lr, seed=seed, split=split)
    key = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / f"tiny_gpt-{key}.safetensors"
    if split not in ("first_half", "second_half", "all"):
        raise ValueError(f"split must be 'first_half', 'second_half' or 'all', got {split!r}")
    tokenizer = CharTokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyGPT(vocab_size=tokenizer.vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                        block_size=block_size)
        if path.exists():
            model.load_state_dict(load_file(str(path)))
            return model
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
            windows = ids[torch.randint(0, len(ids) - block_size - 1, (batch_size, 1), generator=gen) + offsets]
            logits = model(windows[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
    os.replace(tmp, path)
    return model
