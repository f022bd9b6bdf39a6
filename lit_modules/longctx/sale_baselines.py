"""SALE's density-matched block-selection baselines: coarse (mean-pooled) ranking and random selection.

Both keep SALE's reserved blocks (sink + local window, ``kernels.block_select.reserved_blocks``) and ONE top fraction
of every query block's middle blocks, the fraction chosen per layer call so that the total equals SALE's selected
count (equal density; copying SALE's per-block counts would hand a baseline SALE's needle locations). They differ
only in how the middle blocks are ranked:

* ``pooled``: by the mean-pooled score q_bar(query block) . k_bar(key block), our stand-in for the coarse
  inspection that the SALE paper (arXiv 2505.24179, abstract) says costs accuracy (SpargeAttn-style selection);
* ``random``: by a uniform random draw, the floor: a selection that knows nothing about the attention map.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from litlab.kernels.block_select import reserved_blocks


class SALEConfig(Protocol):
    """What the baselines read of the method's config (``sale.SALEConfig``), named here so that this harness
    module does not import the method module that imports it."""

    block_q: int
    block_k: int

    def blocks(self) -> dict[str, int]: ...


def reserved_only_mask(mask_like: torch.Tensor, N: int, cfg: SALEConfig) -> torch.Tensor:
    """The reserved blocks alone (the selection at tau = +inf): per query block, the sink block and the last
    ``n_loc`` causal blocks (``reserved_blocks``' bookkeeping, no selection pass), as uint8 [B, H, nQ, nK]."""
    mask = torch.zeros(mask_like.shape, dtype=torch.uint8)
    for qb in range(mask_like.shape[2]):
        n_max, n_loc, _ = reserved_blocks(qb, N, **cfg.blocks())
        mask[..., qb, 0] = 1
        mask[..., qb, n_max - n_loc : n_max] = 1
    return mask


def pooled_scores(q: torch.Tensor, k: torch.Tensor, cfg: SALEConfig) -> torch.Tensor:
    """[B, H, nQ, nK]: mean-pooled q_bar(query block) . k_bar(key block) (grouped KV heads repeated)."""
    N = q.shape[2]
    n_qb, n_kb = math.ceil(N / cfg.block_q), math.ceil(N / cfg.block_k)
    pad_q, pad_k = n_qb * cfg.block_q - N, n_kb * cfg.block_k - N
    qp = torch.nn.functional.pad(q.float(), (0, 0, 0, pad_q)).unflatten(2, (n_qb, cfg.block_q)).mean(3)
    kp = torch.nn.functional.pad(k.float(), (0, 0, 0, pad_k)).unflatten(2, (n_kb, cfg.block_k)).mean(3)
    return qp @ kp.repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)


def top_blocks_mask(score: torch.Tensor, N: int, n_keep: torch.Tensor, cfg: SALEConfig) -> torch.Tensor:
    """Reserved blocks + the ``n_keep[b,h,qb]`` middle blocks of largest ``score`` [B, H, nQ, nK] (uint8 mask)."""
    mask = reserved_only_mask(score, N, cfg)
    middle = torch.zeros_like(mask, dtype=torch.bool)
    for qb in range(score.shape[2]):
        rng = reserved_blocks(qb, N, **cfg.blocks())[2]
        middle[:, :, qb, rng.start : rng.stop] = True
    ranked = score.masked_fill(~middle, float("-inf")).argsort(-1, descending=True)
    keep = torch.arange(score.shape[3])[None, None, None, :] < n_keep[..., None]
    chosen = torch.zeros_like(middle).scatter_(-1, ranked, keep) & middle
    return (mask.bool() | chosen).to(torch.uint8)


def pooled_block_mask(q, k, n_keep: torch.Tensor, cfg: SALEConfig) -> torch.Tensor:
    """Coarse baseline: reserved blocks + the ``n_keep`` middle blocks of largest mean-pooled score."""
    return top_blocks_mask(pooled_scores(q, k, cfg), q.shape[2], n_keep, cfg)


def random_block_mask(like: torch.Tensor, N: int, n_keep: torch.Tensor, cfg: SALEConfig, gen) -> torch.Tensor:
    """Floor: reserved blocks + ``n_keep`` middle blocks drawn uniformly (``gen``, a CPU torch.Generator) per
    (b, h, query block); ``like`` is any [B, H, nQ, nK] mask of the call."""
    return top_blocks_mask(torch.rand(like.shape, generator=gen), N, n_keep, cfg)


def pooled_keep_counts(sale_mask: torch.Tensor, N: int, cfg: SALEConfig) -> torch.Tensor:
    """Middle blocks a baseline keeps per (b, h, query block): ONE fraction f of every query block's middle region
    ("top fraction per query block"), chosen so the total matches SALE's selected count, i.e. equal density."""
    n_mid = torch.tensor(
        [len(reserved_blocks(qb, N, **cfg.blocks())[2]) for qb in range(sale_mask.shape[2])],
        dtype=torch.float32,
    )
    selected = float(sale_mask.sum() - reserved_only_mask(sale_mask, N, cfg).sum())
    total_mid = float(n_mid.sum()) * sale_mask.shape[0] * sale_mask.shape[1]
    frac = selected / total_mid if total_mid else 0.0
    return torch.round(frac * n_mid).long().expand(*sale_mask.shape[:2], -1)
