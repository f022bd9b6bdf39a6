"""The key-block layout of SALE's selection (arXiv 2505.24179), step 1: which key blocks a query block keeps
exactly (the sink block 0 and its local blocks) and which middle blocks the low-bit estimate decides. Shared by the
PyTorch reference and Triton kernel (``block_select``) and the CPU int8 pass (``block_select_cpu``)."""

from __future__ import annotations

import math


def reserved_blocks(qb: int, n_tokens: int, block_q: int, block_k: int, local_blocks: int, seg_blocks: int):
    """Selection step 1 for query block ``qb``: (n_max causal key blocks, n_loc local blocks, middle range)."""
    n_max = math.ceil(min((qb + 1) * block_q, n_tokens) / block_k)
    n = n_max - 1
    n_loc = n if n <= local_blocks else local_blocks + (n - local_blocks) % seg_blocks
    return n_max, n_loc, range(1, n - n_loc + 1)
