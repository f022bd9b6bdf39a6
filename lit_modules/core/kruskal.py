"""Kruskal rank, Khatri–Rao product and the LoKRA log-determinant surrogate (shared/methods/lokra.md §3).

The Kruskal rank k(M) of a matrix is the largest k such that *every* set of k columns is linearly
independent. LoKRA raises a differentiable surrogate of it; LoKRA+ builds its update as a Khatri–Rao
product, whose Kruskal rank is bounded below by k(D) + k(C) − 1 (Sidiropoulos & Bro, 2000).

Pure functions only: the adapter layer (``adapters.py``) and the LoKRA module use them.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

import torch
from torch import Tensor

BlockMode = Literal["random", "fixed"]


def khatri_rao(D: Tensor, C: Tensor) -> Tensor:
    """Column-wise Kronecker product: ``(D ⊙ C)[a·r₂ + b, j] = D[a, j] · C[b, j]`` (lokra.md §3.1)."""
    if D.ndim != 2 or C.ndim != 2 or D.shape[1] != C.shape[1]:
        raise ValueError(
            f"khatri_rao needs two matrices with equal column counts, got {tuple(D.shape)} and {tuple(C.shape)}"
        )
    r1, n = D.shape
    r2 = C.shape[0]
    return (D[:, None, :] * C[None, :, :]).reshape(r1 * r2, n)


def normalize_columns(M: Tensor, delta: float = 1e-6) -> Tensor:
    """Unit-norm columns, so the penalty cannot be lowered by inflating norms (§3.4 step 1).

    Divides by ``max(‖M[:, j]‖, δ)`` rather than the spec's ``‖M[:, j]‖ + δ``: the same guard for zero columns,
    but exactly unit norm otherwise, which §7.4's invariants (P(cM) = P(M), the orthogonal floor, to 1e-5)
    need. A zero column stays zero, so the penalty's gradient at B = 0 is still exactly 0.
    """
    return M / M.norm(dim=0, keepdim=True).clamp_min(delta)


def _column_blocks(n: int, q: int, mode: BlockMode, generator: torch.Generator | None) -> Tensor:
    """Indices ``[nb, q]`` of disjoint q-column blocks; leftover columns sit out this step (§3.4 step 2)."""
    nb = n // q
    if nb == 0:
        raise ValueError(f"block size q={q} is larger than the number of columns n={n}")
    if mode == "fixed":
        order = torch.arange(n)
    elif mode == "random":
        order = torch.randperm(n, generator=generator)
    else:
        raise ValueError(f"block_mode must be 'random' or 'fixed', got {mode!r}")
    return order[: nb * q].reshape(nb, q)


def blockwise_logdet_penalty(
    M: Tensor,
    q: int | None = None,
    generator: torch.Generator | None = None,
    eps: float = 1e-4,
    delta: float = 1e-6,
    block_mode: BlockMode = "random",
    normalize: bool = True,
) -> Tensor:
    """``P(M) = −(1/nb) Σ_S log det(M̃_Sᵀ M̃_S + εI)`` over disjoint q-column blocks S (§3.4, reconstructed).

    ``M`` is ``[q_rows, n]``; its columns are the vectors that should be k-independent. The block size
    defaults to the row count, i.e. the maximal Kruskal rank. ``P ≈ −q·log(1+ε)`` when every block is
    orthonormal and grows without bound as any block's columns become parallel.
    ``normalize=False`` is the spec's ``"unnormalized"`` alternative (pair it with a norm penalty).
    """
    q = M.shape[0] if q is None else q
    Mn = normalize_columns(M, delta) if normalize else M
    blocks = _column_blocks(M.shape[1], q, block_mode, generator).to(M.device)
    Ms = Mn[:, blocks].permute(1, 0, 2)  # [nb, rows, q]
    gram = Ms.transpose(1, 2) @ Ms + eps * torch.eye(q, device=M.device, dtype=M.dtype)
    # Cholesky is cheaper than slogdet and G is SPD by construction (+εI).
    chol = torch.linalg.cholesky(gram)
    logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    return -logdet.mean()


def sampled_column_subsets(n: int, k: int, n_samples: int, generator: torch.Generator | None) -> Tensor:
    """``[n_samples, k]`` random k-subsets of ``range(n)`` (with replacement across samples)."""
    keys = torch.rand(n_samples, n, generator=generator)
    return keys.argsort(dim=1)[:, :k]


@torch.no_grad()
def sampled_logvol(
    M: Tensor,
    k: int | None = None,
    n_samples: int = 500,
    generator: torch.Generator | None = None,
    delta: float = 1e-6,
) -> Tensor:
    """Mean over random k-column subsets of ``log det`` of the normalised Gram — the "log-volume" the
    penalty raises (higher = more independent directions; lokra.md §5, §6a)."""
    k = M.shape[0] if k is None else k
    idx = sampled_column_subsets(M.shape[1], k, n_samples, generator).to(M.device)
    Ms = normalize_columns(M.double(), delta)[:, idx].permute(1, 0, 2)
    sign, logabs = torch.linalg.slogdet(Ms.transpose(1, 2) @ Ms)
    return (
        torch.where(sign > 0, logabs, torch.full_like(logabs, -math.inf)).clamp_min(-1e3).mean().to(M.dtype)
    )


@torch.no_grad()
def sampled_sigma_min(
    M: Tensor,
    k: int | None = None,
    n_samples: int = 500,
    generator: torch.Generator | None = None,
    delta: float = 1e-6,
) -> Tensor:
    """Smallest singular value of the column-normalised k-subsets, one per sampled subset ``[n_samples]``."""
    k = M.shape[0] if k is None else k
    idx = sampled_column_subsets(M.shape[1], k, n_samples, generator).to(M.device)
    Ms = normalize_columns(M.double(), delta)[:, idx].permute(1, 0, 2)
    return torch.linalg.svdvals(Ms)[:, -1].to(M.dtype)


def kruskal_rank_exact(M: Tensor, tol: float = 1e-6) -> int:
    """Brute-force Kruskal rank (exponential: tiny matrices only, e.g. 9×6)."""
    rows, n = M.shape
    if n > 16:
        raise ValueError(f"kruskal_rank_exact is brute force; {n} columns is too many (max 16)")
    Md = M.double()
    rank_tol = tol * max(1.0, float(Md.abs().max()))
    best = 0
    for k in range(1, min(rows, n) + 1):
        if all(
            torch.linalg.matrix_rank(Md[:, list(cols)], atol=rank_tol) == k
            for cols in itertools.combinations(range(n), k)
        ):
            best = k
        else:
            break
    return best


def effective_rank(M: Tensor) -> Tensor:
    """Entropy effective rank ``exp(H(σ/Σσ))`` (Roy & Vetterli, 2007)."""
    s = torch.linalg.svdvals(M.detach().double())
    p = s / s.sum().clamp_min(1e-12)
    return torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum()).to(M.dtype)
