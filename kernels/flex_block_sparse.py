"""Kernel a on the CPU: SALE's computation pass (arXiv 2505.24179) on PyTorch's block-sparse ``flex_attention``.

``torch.nn.attention.flex_attention`` skips every key block its ``BlockMask`` does not list, so a SALE selection
(uint8 ``[B, H, ceil(M/block_q), ceil(N/block_k)]``) becomes a ``BlockMask`` with the same block geometry: blocks
entirely on or below the diagonal are "full" (no per-element mask), blocks that cross it are "partial" (causal
``mask_mod``, bottom-right aligned like ``block_sparse_attention``). Same semantics as the Triton kernel and
``block_sparse_attention_reference``: a row with no allowed key outputs 0.

Compiled once per process (``compiled_flex_attention``: one ``torch.compile`` of ``flex_attention`` shared by all
callers; the first call compiles the CPU kernel, ~25 s on 2 cores, ~9 s when inductor's on-disk cache is warm;
each new (block size, dtype, head count) pays it again, other lengths recompile once with dynamic shapes).
Eager ``flex_attention`` is ~20x slower, so there is no eager fallback here.
"""

from __future__ import annotations

import math

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

_COMPILED: dict[str, object] = {}


def compiled_flex_attention():
    """The process-wide compiled ``flex_attention`` (built at first use)."""
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention)
    return _COMPILED["flex"]


def _lut(m: torch.Tensor):
    """(count [B,H,nQ] int32, indices [B,H,nQ,nK] int32 with the listed blocks first, ascending)."""
    cnt = m.sum(-1, dtype=torch.int32)
    idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return cnt.contiguous(), idx.contiguous()


def block_mask_from_selection(
    selection: torch.Tensor, M: int, N: int, block_q: int = 64, block_k: int = 32, causal: bool = True
):
    """A ``BlockMask`` that lists exactly the blocks of ``selection`` (uint8/bool [B,H,nQ,nK]).

    Causal: a selected block whose keys all precede its first query row is full, any other selected block is
    partial and gets the causal ``mask_mod`` (query ``i`` sees key ``j`` iff ``j <= i + N - M``). Not causal: all
    selected blocks are full."""
    sel = selection.bool()
    n_qb, n_kb = sel.shape[-2:]
    if (n_qb, n_kb) != (math.ceil(M / block_q), math.ceil(N / block_k)):
        raise ValueError(
            f"selection {tuple(sel.shape)} does not fit M={M}, N={N} in {block_q}x{block_k} blocks"
        )
    offset = N - M
    if causal:
        qb = torch.arange(n_qb, device=sel.device)[:, None]
        kb = torch.arange(n_kb, device=sel.device)[None, :]
        # every key of the block <= the block's first query row (+ offset), and the block is not cut by N
        all_visible = ((kb + 1) * block_k - 1 <= qb * block_q + offset) & ((kb + 1) * block_k <= N)
        full, partial = sel & all_visible, sel & ~all_visible

        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + offset

    else:
        full, partial = sel, torch.zeros_like(sel)

        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx >= 0

    cnt, idx = _lut(partial)
    fcnt, fidx = _lut(full)
    return BlockMask.from_kv_blocks(
        cnt, idx, fcnt, fidx, BLOCK_SIZE=(block_q, block_k), mask_mod=mask_mod, seq_lengths=(M, N)
    )


@torch.no_grad()
def block_sparse_attention_flex(q, k, v, block_mask, block_q=64, block_k=32, causal=True, sm_scale=None):
    """o [B,H,M,d] of attention over the blocks of ``block_mask`` (uint8 selection), via the compiled
    ``flex_attention``; GQA by ``enable_gqa``. (No lse: torch 2.13's compiled CPU flex_attention cannot return it.)"""
    bm = block_mask_from_selection(block_mask, q.shape[2], k.shape[2], block_q, block_k, causal)
    flex = compiled_flex_attention()
    return flex(q, k, v, block_mask=bm, scale=sm_scale, enable_gqa=q.shape[1] != k.shape[1])
