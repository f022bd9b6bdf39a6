"""Kruskal rank, the Khatri–Rao product and probes of how independent a factor's columns are.

The Kruskal rank k(M) of a matrix is the largest k such that *every* set of k columns is linearly
independent. LoKRA ("LoKRA / LoKRA+: Low Kruskal-Rank Adaptation", ICML 2026) raises a differentiable surrogate
of it (its penalty lives with the method, ``litlab.lit_modules.peft.lokra``); LoKRA+ and KRAdapter (Albert et
al., ICCV 2025, arXiv 2508.00230) build their update as a Khatri–Rao product, whose Kruskal rank is bounded
below by k(D) + k(C) − 1 (Sidiropoulos & Bro, 2000).

Pure functions only: the adapter layer (``adapters.py``), the adapter-spectrum callback and LoKRA use them.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor


def khatri_rao(D: Tensor, C: Tensor) -> Tensor:
    """Column-wise Kronecker product: ``(D ⊙ C)[a·r₂ + b, j] = D[a, j] · C[b, j]`` (Sidiropoulos & Bro, 2000)."""
    if D.ndim != 2 or C.ndim != 2 or D.shape[1] != C.shape[1]:
        raise ValueError(
            f"khatri_rao needs two matrices with equal column counts, got {tuple(D.shape)} and {tuple(C.shape)}"
        )
    r1, n = D.shape
    r2 = C.shape[0]
    return (D[:, None, :] * C[None, :, :]).reshape(r1 * r2, n)


def normalize_columns(M: Tensor, delta: float = 1e-6) -> Tensor:
    """Unit-norm columns, so a log-det penalty cannot be lowered by inflating norms.

    Divides by ``max(‖M[:, j]‖, δ)`` rather than ``‖M[:, j]‖ + δ``: the same guard for zero columns, but
    exactly unit norm otherwise, which LoKRA's penalty invariants (P(cM) = P(M), the orthogonal floor, to 1e-5)
    need. A zero column stays zero, so the penalty's gradient at B = 0 is still exactly 0.
    """
    return M / M.norm(dim=0, keepdim=True).clamp_min(delta)


def sampled_column_subsets(n: int, k: int, n_samples: int, generator: torch.Generator | None) -> Tensor:
    """``[n_samples, k]`` random k-subsets of ``range(n)`` (with replacement across samples)."""
    keys = torch.rand(n_samples, n, generator=generator)
    return keys.argsort(dim=1)[:, :k]


def sampled_normalized_subsets(
    M: Tensor, k: int | None, n_samples: int, generator: torch.Generator | None, delta: float
) -> Tensor:
    """``[n_samples, rows, k]``: random k-column subsets of ``M`` (k = rows by default), columns at unit norm, in
    float64 (log-determinants and smallest singular values of near-singular subsets need it)."""
    k = M.shape[0] if k is None else k
    idx = sampled_column_subsets(M.shape[1], k, n_samples, generator).to(M.device)
    return normalize_columns(M.double(), delta)[:, idx].permute(1, 0, 2)


@torch.no_grad()
def sampled_logvol(
    M: Tensor,
    k: int | None = None,
    n_samples: int = 500,
    generator: torch.Generator | None = None,
    delta: float = 1e-6,
) -> Tensor:
    """Mean over random k-column subsets of ``log det`` of the normalised Gram — the "log-volume" the
    LoKRA penalty raises (higher = more independent directions)."""
    Ms = sampled_normalized_subsets(M, k, n_samples, generator, delta)
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
    Ms = sampled_normalized_subsets(M, k, n_samples, generator, delta)
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
