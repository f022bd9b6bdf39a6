"""Comparing two weight matrices by their SVD: the quantities of Diffract §3.2 ("Diffract: Spectral View of LLM
Domain Adaptation", ICML 2026; toolkit definitions of github.com/Risk-AI-Research/diffract), as pure functions.

Notation: ``W = U diag(s) Vᵀ`` with ``s`` sorted descending (the toolkit stores ascending), PyTorch layout
``[out, in]``; ``W0`` the base matrix, ``Wd`` the matrix after continued pre-training, ``dW = Wd - W0``.
Everything is computed in float64 and is invariant to the SVD's sign gauge (absolute values of overlaps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SVD:
    U: Tensor  # [m, r]
    s: Tensor  # [r], descending
    V: Tensor  # [n, r]


def svd(W: Tensor) -> SVD:
    """Thin SVD in float64, singular values descending."""
    U, s, Vh = torch.linalg.svd(W.detach().double(), full_matrices=False)
    return SVD(U, s, Vh.mT)


def randomized_top_k(W: Tensor, k: int, niter: int = 4, seed: int = 0) -> SVD:
    """Top-``k`` singular triplets by randomized SVD (Halko, Martinsson & Tropp 2011): ``torch.svd_lowrank`` with
    ``q = k + 10``; its random test matrix comes from a private generator, so the caller's RNG is untouched."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        U, s, V = torch.svd_lowrank(W.detach().double(), q=min(k + 10, min(W.shape)), niter=niter)
    return SVD(U[:, :k], s[:k], V[:, :k])


# ---- §3.2.1 norms and ranks ----------------------------------------------------------------------------
def norms_and_ranks(W: Tensor) -> dict[str, float]:
    """``||W||_F``, ``||W||_2 = s_1``, stable rank ``||W||_F² / s_1²``, effective rank ``exp(-Σ p_i ln p_i)`` with
    ``p_i = s_i / Σ s_j`` (the toolkit's convention: singular values, not their squares)."""
    s = torch.linalg.svdvals(W.detach().double())
    fro = float(s.pow(2).sum().sqrt())
    top = float(s[0]) if s.numel() else 0.0
    p = s / s.sum() if float(s.sum()) > 0 else s
    p = p[p > 0]
    return {
        "fro": fro,
        "spectral": top,
        "stable_rank": fro**2 / top**2 if top > 0 else 0.0,
        "effective_rank": float(torch.exp(-(p * p.log()).sum())) if p.numel() else 0.0,
    }


def esd(W: Tensor) -> Tensor:
    """Empirical spectral density points ``λ_i = s_i² / max(m, n)``."""
    return torch.linalg.svdvals(W.detach().double()).pow(2) / max(W.shape)


# ---- §3.2.2-3 relative changes and the spectrum-invariance ratio ----------------------------------------
def relative_changes(W0: Tensor, Wd: Tensor) -> dict[str, float]:
    """``rW = ||dW||_F / ||W0||_F``, ``rS = ||s_d - s_0||_2 / ||s_0||_2`` and ``ρ = ||s_d - s_0||_2 / ||dW||_F``
    (ρ = 0 when dW = 0). Mirsky: ``0 <= ρ <= 1``; since ``||s_0||_2 = ||W0||_F``, ``rS = ρ·rW`` exactly."""
    W0, Wd = W0.detach().double(), Wd.detach().double()
    s0, sd = torch.linalg.svdvals(W0), torch.linalg.svdvals(Wd)
    dW = float(torch.linalg.matrix_norm(Wd - W0))
    ds = float((sd - s0).norm())
    n0 = float(s0.norm())
    return {
        "rW": dW / n0 if n0 > 0 else 0.0,
        "rS": ds / n0 if n0 > 0 else 0.0,
        "rho": ds / dW if dW > 0 else 0.0,
    }


# ---- §3.2.4-5 singular-vector alignment and subspace overlap --------------------------------------------
def alignment(X0: Tensor, Xd: Tensor) -> tuple[Tensor, Tensor]:
    """``O = |X0ᵀ Xd|`` over the first ``r`` components: diagonal agreement ``a_i = O_ii`` and best match
    ``b_i = max_j O_ij`` (robust to permuted components)."""
    r = min(X0.shape[1], Xd.shape[1])
    O = (X0[:, :r].mT @ Xd[:, :r]).abs()
    return torch.diagonal(O), O.max(dim=1).values


def subspace_overlap(X0: Tensor, Xd: Tensor, k: int) -> float:
    """``ov_k = ||X0[:, :k]ᵀ Xd[:, :k]||_F² / k`` in [0, 1]: mean squared cosine of the principal angles
    (random floor ``k / m``)."""
    k = min(k, X0.shape[1], Xd.shape[1])
    return float((X0[:, :k].mT @ Xd[:, :k]).pow(2).sum() / k)


def noise_floors(m: int, r: int) -> dict[str, float]:
    """Alignment of unrelated bases in dimension ``m``: ``a ~ 1/√m``, ``b ~ √(2 ln r / m)``."""
    return {"a": 1.0 / math.sqrt(m), "b": math.sqrt(2.0 * math.log(max(r, 2)) / m)}


def spectral_change(
    W0: Tensor, Wd: Tensor, k: int = 16, factors: tuple[SVD, SVD] | None = None
) -> dict[str, float]:
    """Every §3.2 scalar of one matrix pair: ``rW, rS, rho``, left/right mean agreement ``a``, best match ``b``,
    top-k overlap ``ov`` (left singular vectors), and the noise floors of ``a`` and ``b``. ``factors``: the pair's
    ``(svd(W0), svd(Wd))`` when the caller already has them (the same numbers, no second SVD)."""
    out = relative_changes(W0, Wd)
    f0, fd = factors if factors is not None else (svd(W0), svd(Wd))
    aL, bL = alignment(f0.U, fd.U)
    aR, bR = alignment(f0.V, fd.V)
    floors = noise_floors(W0.shape[0], min(W0.shape))
    out.update(
        a=float(torch.cat([aL, aR]).mean()),
        b=float(torch.cat([bL, bR]).mean()),
        ov=subspace_overlap(f0.U, fd.U, k),
        a_floor=floors["a"],
        b_floor=floors["b"],
    )
    return out


# ---- §3.2.6 the swap test [reconstructed] --------------------------------------------------------------
def swap_values(W0: Tensor, Wd: Tensor) -> Tensor:
    """``W_val = U_0 diag(s_d) V_0ᵀ``: the tuned singular values on the base's singular vectors."""
    return swap_values_from(svd(W0), svd(Wd))


def swap_vectors(W0: Tensor, Wd: Tensor) -> Tensor:
    """``W_vec = U_d diag(s_0) V_dᵀ``: the base's singular values on the tuned singular vectors."""
    return swap_vectors_from(svd(W0), svd(Wd))


def swap_values_from(f0: SVD, fd: SVD) -> Tensor:
    """``swap_values`` from the two SVDs."""
    return (f0.U * fd.s) @ f0.V.mT


def swap_vectors_from(f0: SVD, fd: SVD) -> Tensor:
    """``swap_vectors`` from the two SVDs."""
    return (fd.U * f0.s) @ fd.V.mT


def gain_recovered(loss_base: float, loss_hybrid: float, loss_tuned: float) -> float:
    """``G = (L(θ0) - L(hybrid)) / (L(θ0) - L(θd))``: the share of the domain gain a hybrid keeps."""
    gain = loss_base - loss_tuned
    return (loss_base - loss_hybrid) / gain if gain != 0 else float("nan")


# ---- §3.4 the `rotation` block criterion [reconstructed] ------------------------------------------------
def rotation_from_factors(f0: SVD, fd: SVD) -> float:
    """The ``rotation`` criterion from the two SVDs (invariant to their sign gauge and to permuted components)."""
    _, bL = alignment(f0.U, fd.U)
    _, bR = alignment(f0.V, fd.V)
    w = f0.s.pow(2)
    w = w / w.sum() if float(w.sum()) > 0 else w
    return float(1.0 - 0.5 * (w * (bL + bR)).sum())


def rotation_score(W0: Tensor, Wd: Tensor) -> float:
    """Energy-weighted best-match agreement loss ``c = 1 - ½ Σ_i w_i (b^L_i + b^R_i)``, ``w_i = s_{0,i}² / Σ s_0²``:
    0 when the singular vectors did not move, near 1 when every base direction rotated away."""
    return rotation_from_factors(svd(W0), svd(Wd))
