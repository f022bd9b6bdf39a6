"""Trajectory lock-in in narrow-task fine-tuning (ICML 2026; only the abstract could be read: title, arXiv id, code
and numbers were not found). Everything below the abstract's level is RECONSTRUCTED.

The abstract's claims: the (task loss, broad loss) pairs of fine-tuning runs fall on one shared degradation curve,
and common stabilisers (smaller lr, weight decay, L2-to-init, early stopping, clipping) mostly change the speed
along it ("lock-in"); drift ||θ - θ0|| is a poor proxy of damage ("drift paradox"); an online curvature-based harm
signal tracks how much of the update sits in high-curvature directions; escaping needs a "spectral bifurcation"
that re-orients the update toward soft curvature modes.

Algorithm, as reconstructed (our numbering):
    1. curvature basis at θ0 on broad calibration data: top-k eigenpairs (λ_i, v_i) of H_B by Lanczos
       (``curvature.lanczos`` over ``curvature.hvp``), or layer-wise input covariances A_l = E[a aᵀ]
    2. fine-tune; log (t, L_T, A_T, L_B, d_t = ||θ_t - θ0||) every ``eval_every`` steps
    3. harm signal h_t = ½ Σ_i λ_i (v_iᵀ(θ_t - θ0))²; stiff fraction f_t = ||Sᵀ(θ_t - θ0)||² / ||θ_t - θ0||²;
       curvature share c_t = h_t / (½ λ_1 d_t²)
    4. soft-mode projection after each optimizer step: step ← step - S Sᵀ step (global) or
       dW ← dW - (dW U_r) U_rᵀ (layer-wise, U_r the eigenvectors carrying τ of A_l's energy)
    5. offline: isotonic fit L_B = Φ(L_T) over a run family (pool-adjacent-violators), collapse score R²_T,
       R²_d of L_B on a monotone function of the drift, drift-paradox witnesses, matched-performance comparison,
       Spearman of h with ΔL_B
    probes of the update subspace: erank of dW (p_i = s_i²/Σ s²), stability ||V_tᵀ V_{t-τ}||²_F / k, participation
    ratio of the windowed update stream (Σμ)²/Σμ².

This file holds steps 3-5 and the probes as pure functions; the module and card are not built yet (see the family
README / issue 16).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


# ---- 3. harm signal ---------------------------------------------------------------------------------------
def harm_signal(delta: Tensor, values: Tensor, vectors: Tensor) -> float:
    """``h = ½ Σ_i λ_i (v_iᵀ δ)²`` for ``δ = θ_t - θ0`` and the basis ``vectors`` ``[P, k]``."""
    proj = vectors.T.to(delta.dtype) @ delta
    return float(0.5 * (values.to(delta.dtype) * proj.pow(2)).sum())


def stiff_fraction(delta: Tensor, vectors: Tensor) -> float:
    """``f = ||Sᵀ δ||² / ||δ||²`` (0 for δ = 0)."""
    n = float(delta.pow(2).sum())
    return float((vectors.T.to(delta.dtype) @ delta).pow(2).sum()) / n if n > 0 else 0.0


def curvature_share(h: float, lam1: float, drift: float) -> float:
    """``c = h / (½ λ_1 d²)`` (0 for d = 0)."""
    return h / (0.5 * lam1 * drift**2) if drift > 0 and lam1 > 0 else 0.0


# ---- 4. soft-mode projection ------------------------------------------------------------------------------
def project_out(step: Tensor, vectors: Tensor) -> Tensor:
    """``step - S (Sᵀ step)`` (S with orthonormal columns)."""
    return step - vectors @ (vectors.T @ step)


def project_out_damped(step: Tensor, values: Tensor, vectors: Tensor, gamma: float) -> Tensor:
    """``step - S diag(λ_i / (λ_i + γ)) Sᵀ step`` (the soft variant)."""
    return step - vectors @ ((values / (values + gamma)) * (vectors.T @ step))


def energy_basis(A: Tensor, tau: float = 0.9) -> Tensor:
    """Top eigenvectors of the PSD ``A`` whose eigenvalues carry at least ``tau`` of its trace, ``[in, r]``."""
    evals, evecs = torch.linalg.eigh(A.double())
    evals, evecs = evals.flip(0).clamp_min(0), evecs.flip(1)
    cum = torch.cumsum(evals, 0) / evals.sum().clamp_min(1e-300)
    r = int((cum < tau).sum()) + 1
    return evecs[:, : min(r, A.shape[0])]


def project_layer(dW: Tensor, U: Tensor) -> Tensor:
    """``dW - (dW U_r) U_rᵀ`` for an ``[out, in]`` update and the input basis ``U_r`` ``[in, r]``."""
    U = U.to(dW.dtype)
    return dW - (dW @ U) @ U.T


# ---- 5. collapse, paradox, rank statistics ---------------------------------------------------------------
def isotonic_decreasing(x: Sequence[float], y: Sequence[float]) -> Tensor:
    """Least-squares fit ``ŷ`` non-increasing in ``x`` (pool-adjacent-violators), in the input order."""
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    order = torch.argsort(x, stable=True)
    vals, weights = [], []
    for v in (-y[order]).tolist():  # increasing fit of -y
        vals.append(v)
        weights.append(1.0)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            w = weights[-2] + weights[-1]
            v = (vals[-2] * weights[-2] + vals[-1] * weights[-1]) / w
            vals[-2:], weights[-2:] = [v], [w]
    fit = torch.cat([torch.full((int(w),), -v, dtype=torch.float64) for v, w in zip(vals, weights)])
    out = torch.empty_like(fit)
    out[order] = fit
    return out


def isotonic_increasing(x: Sequence[float], y: Sequence[float]) -> Tensor:
    return -isotonic_decreasing(x, [-v for v in y])


def r2(y: Sequence[float], fit: Sequence[float]) -> float:
    y, fit = torch.as_tensor(y, dtype=torch.float64), torch.as_tensor(fit, dtype=torch.float64)
    ss_tot = float((y - y.mean()).pow(2).sum())
    return 1.0 - float((y - fit).pow(2).sum()) / ss_tot if ss_tot > 0 else 1.0


def collapse_r2(task_loss: Sequence[float], broad_loss: Sequence[float]) -> float:
    """``R²_T``: broad loss explained by one non-increasing curve of the task loss (pooled over runs)."""
    return r2(broad_loss, isotonic_decreasing(task_loss, broad_loss))


def drift_r2(drift: Sequence[float], broad_loss: Sequence[float]) -> float:
    """``R²_d``: broad loss explained by one non-decreasing curve of the drift."""
    return r2(broad_loss, isotonic_increasing(drift, broad_loss))


def paradox_witnesses(
    drift: Sequence[float], dLB: Sequence[float], tol: float = 0.1, ratio: float = 1.5
) -> list[tuple[int, int]]:
    """Pairs ``(a, b)`` with ``|d_a - d_b| <= tol · mean(d_a, d_b)`` and ``max/min`` of ``ΔL_B`` at least ``ratio``
    (both increases positive)."""
    out = []
    for a in range(len(drift)):
        for b in range(a + 1, len(drift)):
            da, db = drift[a], drift[b]
            if abs(da - db) <= tol * 0.5 * (da + db) and min(dLB[a], dLB[b]) > 0:
                if max(dLB[a], dLB[b]) / min(dLB[a], dLB[b]) >= ratio:
                    out.append((a, b))
    return out


def _ranks(x: Sequence[float]) -> Tensor:
    x = torch.as_tensor(x, dtype=torch.float64)
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=torch.float64)
    for v in torch.unique(x):  # average ranks of ties
        m = x == v
        ranks[m] = ranks[m].mean()
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()))


# ---- probes of the update subspace --------------------------------------------------------------------------
def erank_energy(dW: Tensor) -> float:
    """``exp(H(p))`` with ``p_i = s_i² / Σ s²`` (0 for dW = 0)."""
    s2 = torch.linalg.svdvals(dW.double()).pow(2)
    if float(s2.sum()) == 0:
        return 0.0
    p = s2 / s2.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def subspace_stability(V_now: Tensor, V_before: Tensor) -> float:
    """``||V_tᵀ V_{t-τ}||²_F / k``."""
    k = V_now.shape[1]
    return float((V_now.T @ V_before).pow(2).sum() / k)


def participation_ratio(steps: Tensor) -> float:
    """``(Σ μ)² / Σ μ²`` of the eigenvalues ``μ`` of the Gram matrix of the step vectors ``[w, P]``."""
    mu = torch.linalg.eigvalsh(steps.double() @ steps.double().T).clamp_min(0)
    return float(mu.sum() ** 2 / mu.pow(2).sum()) if float(mu.pow(2).sum()) > 0 else 0.0
