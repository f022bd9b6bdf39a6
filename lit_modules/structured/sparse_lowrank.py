"""Sparse + low-rank maths, pure torch (no Lightning): what SALAAD (arXiv 2602.00942) and any other method that
decomposes weight matrices into ``L + S`` share.

Notation (SALAAD §3 of the platform spec; the paper's method section could not be read, the formulas follow the
official implementation): a block is one weight matrix ``X ∈ R^{m×n}`` coupled to a surrogate ``L + S`` through the
scaled augmented Lagrangian ``ρ/2 ‖X − L − S + Y/ρ‖_F²``; the prox thresholds are ``τ_L = α/ρ`` and ``τ_S = β/ρ``.

* ``svt`` / ``soft_threshold`` / ``hard_cut_threshold``: the closed-form L- and S-updates (robust PCA by inexact
  augmented Lagrangian, Candès et al. 2011; Lin, Chen & Ma 2010); ``project_rank`` / ``top_entries``: their
  projections onto the rank-k / k-sparse sets, for the ad-hoc baselines trained at one budget.
* ``effective_rank`` (training rule, cumulative σ² energy) and ``deploy_rank`` (deployment rule, cumulative σ).
* ``controller_update``: the integral controller on a threshold (α or β), with the optional damping term.
* ``BlockADMM``: one block's state (L, S, Y, ρ, α, β, previous rate/density, update count) and its update in the
  code's order L, α, S, β, ρ, Y.
* ``hpa_shrink``: Homomorphic Parameter Allocation, the same shrink factor ``c`` for every block's energy rank
  (reconstructed from the official evaluation script; the paper may define a more elaborate allocation).
* ``factorize`` / ``surrogate`` / ``hpa_surrogates`` / ``posthoc_surrogates``: deployment at a budget, for a trained
  ``(L, S)`` or, as the baseline, post-hoc for a dense ``X`` (truncated SVD + top-|·| entries of the residual).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from litlab.lit_modules.core.config import config_part

ENERGY = 0.999  # e: the energy kept by the effective rank (training and deployment)


# ---- proximal operators -----------------------------------------------------------------------------------------
def effective_rank(sigma: Tensor, energy: float = ENERGY) -> int:
    """Training rule (spec §3.5 step 1): ``q = min{k : Σ_{j≤k} σ_j² ≥ e · Σ_j σ_j²}``, 0 when σ ≡ 0.

    ``sigma`` sorted descending. σ = (4, 3, 0, …): e = 0.999 → 2, e = 0.6 → 1."""
    energies = sigma.double().square()
    total = float(energies.sum())
    if total <= 0.0:
        return 0
    cum = torch.cumsum(energies, 0)
    return int((cum < energy * total).sum()) + 1


def deploy_rank(sigma: Tensor, energy: float = ENERGY) -> int:
    """Deployment rule (spec §3.7 step 1, ``operators.py``): ``#{j : cumsum(σ)_j / Σσ < e} + 1`` on σ itself (not σ²),
    at most ``len(σ)``; 0 when σ ≡ 0."""
    s = sigma.double()
    total = float(s.sum())
    if total <= 0.0:
        return 0
    return min(int((torch.cumsum(s, 0) / total < energy).sum()) + 1, len(s))


def svt(Z: Tensor, tau: float, energy: float = ENERGY, clamp: bool = True) -> tuple[Tensor, int, Tensor]:
    """Singular-value thresholding, the prox of ``τ‖·‖_*``: ``L = U diag(max(σ − τ, 0)) Vᵀ`` (spec §3.5 step 1).

    Returns ``(L, q, σ̃)``: the minimiser of ``τ‖L‖_* + ½‖L − Z‖_F²``, its effective rank and shrunk spectrum.
    ``clamp``: a negative τ counts as 0; ``clamp=False`` applies it as the official code does (every σ grows by |τ|)."""
    U, s, Vh = torch.linalg.svd(Z, full_matrices=False)
    s_shr = torch.clamp(s - (max(tau, 0.0) if clamp else tau), min=0.0)
    L = (U * s_shr) @ Vh
    return L, effective_rank(s_shr, energy), s_shr


def soft_threshold(Z: Tensor, tau: float, clamp: bool = True) -> Tensor:
    """The prox of ``τ‖·‖_1``: ``sign(z) · max(|z| − τ, 0)`` element-wise (spec §3.5 step 3). ``clamp``: a negative
    τ counts as 0; ``clamp=False`` applies it as the official code does (every nonzero entry grows by |τ|)."""
    return torch.sign(Z) * torch.clamp(Z.abs() - (max(tau, 0.0) if clamp else tau), min=0.0)


def hard_cut_threshold(Z: Tensor, density: float) -> float:
    """``beta.mode = hard_cut`` (spec §3.5 step 3): τ_S = the value at position ⌊d*·mn⌋ (0-based) of |Z| sorted
    descending, so that soft thresholding at τ_S keeps exactly ⌊d*·mn⌋ entries of a tie-free Z."""
    flat = Z.abs().flatten()
    keep = int(math.floor(density * flat.numel()))
    if keep >= flat.numel():
        return 0.0
    return float(torch.topk(flat, keep + 1).values[-1])


def project_rank(Z: Tensor, rank: int) -> Tensor:
    """The projection onto rank ≤ ``rank``: Z's truncated SVD, its singular values not shrunk (Eckart-Young). The
    low-rank projection of ``adhoc.AdHocStructure`` (``top_entries`` is the sparse one)."""
    if rank <= 0:
        return torch.zeros_like(Z)
    U, s, Vh = torch.linalg.svd(Z, full_matrices=False)
    return (U[:, :rank] * s[:rank]) @ Vh[:rank]


def penalty(X: Tensor, L: Tensor, S: Tensor, Y: Tensor, rho: float) -> Tensor:
    """The coupling term of one block, ``ρ/2 ‖X − L − S + Y/ρ‖_F²`` (spec §3.1); L, S, Y are constants."""
    return 0.5 * rho * (X - L - S + Y / rho).square().sum()


def penalty_grad(X: Tensor, L: Tensor, S: Tensor, Y: Tensor, rho: float) -> Tensor:
    """∂penalty/∂X = ``ρ (X − L − S + Y/ρ)`` (what coupled mode adds to X's gradient, decoupled mode to its step)."""
    return rho * (X - L - S) + Y


# ---- the threshold controller -----------------------------------------------------------------------------------
def controller_update(
    value: float,
    rate: float,
    prev_rate: float,
    target: float,
    rho: float,
    gain: float,
    gain_d: float = 0.0,
    count: int = 0,
    pd_after: int = 1500,
    clamp: bool = True,
) -> float:
    """One step of the integral controller on α (or β) (spec §3.5 steps 2 and 4)::

        Δα = ρ · k · (rate − r*)                                      updates 1 … pd_after − 1,
        Δα = ρ · k · (rate − r*) + ρ · k_d · max(0, rate − prev_rate)  from update number pd_after on;   α ← α + Δα

    i.e. the threshold τ = α/ρ integrates the tracking error (rank ratio or density above target ⇒ threshold
    grows). ``count``: controller updates made before this one, so this is update number ``count + 1``; the damped
    law starts at update ``pd_after`` as in the official ``PARAM.update`` (its counter is incremented before the
    ``nr_updates < start_epoch`` test). ``clamp``: α ← max(α + Δα, 0), the platform's anti-windup (a negative
    threshold would inflate singular values / entries); the official code does not clamp (``clamp=False``)."""
    delta = rho * gain * (rate - target)
    if count + 1 >= pd_after:
        delta += rho * gain_d * max(0.0, rate - prev_rate)
    return max(value + delta, 0.0) if clamp else value + delta


# ---- one block's ADMM state and update --------------------------------------------------------------------------
@config_part
class ADMMConfig:
    """Per-block settings (spec §3.2/§3.6): targets r* (rate_rank) and d* (rate_sparsity), penalty ρ, the
    controllers' gains (k_α, k_β; damping k_dα, k_dβ after ``pd_after`` updates), the energy e of the effective
    rank, the threshold modes and their starting values α₀, β₀, and which components the surrogate has: ``both``
    (SALAAD), ``low_rank`` (S ≡ 0) or ``sparse`` (L ≡ 0).

    ``clamp_thresholds``: keep α, β (hence τ_L, τ_S) at or above 0 (default). The authors' code
    (github.com/HaoMAFRLu/salaad, ``adaptive_param.py``) does not clamp (``False``): once the integral goes below 0
    the "SVT" / soft threshold inflates every singular value / entry by |τ|, the rank ratio jumps to 1 and the
    integral climbs back. The problem both describe, min ℓ(X) + α‖L‖_* + β‖S‖_1, penalises only for α, β ≥ 0, and
    the clamp is the card's recorded behaviour: on the quick card (seed 0) the unclamped controller would go below
    0 in 10 of its 840 updates and move SALAAD's deployed val/loss@0.25 by +0.05 nats (issue 30)."""

    rate_rank: float = 0.15
    rate_sparsity: float = 0.05
    rho: float = 2e-2
    k_alpha: float = 0.005
    k_beta: float = 0.002
    k_dalpha: float = 0.0
    k_dbeta: float = 0.0
    pd_after: int = 1500
    energy: float = ENERGY
    alpha_mode: Literal["adaptive", "fixed"] = "adaptive"
    beta_mode: Literal["hard_cut", "adaptive", "fixed"] = "hard_cut"
    components: Literal["both", "low_rank", "sparse"] = "both"
    alpha0: float = 0.0
    beta0: float = 0.0
    clamp_thresholds: bool = True

    def __post_init__(self) -> None:
        if self.rho <= 0:
            raise ValueError(f"rho={self.rho} must be positive")
        if not 0.0 <= self.rate_sparsity <= 1.0 or not 0.0 <= self.rate_rank <= 1.0:
            raise ValueError(
                f"rate_rank={self.rate_rank} and rate_sparsity={self.rate_sparsity} must lie in [0, 1]"
            )
        if self.components not in ("both", "low_rank", "sparse"):
            raise ValueError(f"components={self.components!r} must be 'both', 'low_rank' or 'sparse'")
        if self.alpha_mode not in ("adaptive", "fixed"):
            raise ValueError(f"alpha_mode={self.alpha_mode!r} must be 'adaptive' or 'fixed'")
        if self.beta_mode not in ("hard_cut", "adaptive", "fixed"):
            raise ValueError(f"beta_mode={self.beta_mode!r} must be 'hard_cut', 'adaptive' or 'fixed'")


STATE_TENSORS = ("L", "S", "Y")
STATE_SCALARS = ("rho", "alpha", "beta", "prev_rate", "prev_density", "count", "rate", "density", "residual")


class BlockADMM:
    """L, S, Y (fp32, no gradient) and the scalars ρ, α, β, previous rank ratio / density, update count k."""

    def __init__(self, shape: tuple[int, int], cfg: ADMMConfig, device=None) -> None:
        self.cfg = cfg
        self.m, self.n = shape
        z = torch.zeros(shape, dtype=torch.float32, device=device)
        self.L, self.S, self.Y = z.clone(), z.clone(), z.clone()
        self.rho, self.alpha, self.beta = float(cfg.rho), float(cfg.alpha0), float(cfg.beta0)
        self.prev_rate, self.prev_density = 0.0, 0.0  # the official PARAM's pre_rate starts at 0
        self.count = 0
        self.rate, self.density, self.residual = 0.0, 0.0, 1.0

    def init_low_rank(self, X: Tensor) -> None:
        """§3.3: L₀ = the rank-⌊r*·min(m, n)⌋ truncated SVD of X₀ (S₀ = Y₀ = 0)."""
        k = int(math.floor(self.cfg.rate_rank * min(self.m, self.n)))
        if self.cfg.components == "sparse" or k == 0:
            return
        U, s, Vh = torch.linalg.svd(X.detach().float(), full_matrices=False)
        self.L = (U[:, :k] * s[:k]) @ Vh[:k]

    @property
    def tau_L(self) -> float:
        tau = self.alpha / self.rho
        return max(tau, 0.0) if self.cfg.clamp_thresholds else tau

    @property
    def tau_S(self) -> float:
        tau = self.beta / self.rho
        return max(tau, 0.0) if self.cfg.clamp_thresholds else tau

    def penalty(self, X: Tensor) -> Tensor:
        return penalty(X, self.L, self.S, self.Y, self.rho)

    def penalty_grad(self, X: Tensor) -> Tensor:
        return penalty_grad(X, self.L, self.S, self.Y, self.rho)

    @torch.no_grad()
    def update(self, X: Tensor) -> None:
        """One ADMM / controller iteration (spec §3.5), in the official code's order."""
        cfg, rho = self.cfg, self.rho
        X = X.detach().float()
        mn = self.m * self.n
        # 1. L-update (SVT): L = SVT_{α/ρ}(X − S + Y/ρ); q = effective rank of σ̃ (σ² energy e)
        if cfg.components != "sparse":
            self.L, q, _ = svt(X - self.S + self.Y / rho, self.tau_L, cfg.energy, cfg.clamp_thresholds)
            rate = q / min(self.m, self.n)
            # 2. α-controller: integral on τ_L, damping of rank increases after pd_after updates
            if cfg.alpha_mode == "adaptive":
                self.alpha = controller_update(
                    self.alpha, rate, self.prev_rate, cfg.rate_rank, rho, cfg.k_alpha, cfg.k_dalpha,
                    self.count, cfg.pd_after, cfg.clamp_thresholds,
                )  # fmt: skip
            self.prev_rate, self.rate = rate, rate
        # 3. S-update (soft threshold) with the new L: S = shrink_{β/ρ}(X − L + Y/ρ); hard_cut sets β/ρ first
        if cfg.components != "low_rank":
            Z = X - self.L + self.Y / rho
            if cfg.beta_mode == "hard_cut":
                self.beta = rho * hard_cut_threshold(Z, cfg.rate_sparsity)
            self.S = soft_threshold(Z, self.tau_S, cfg.clamp_thresholds)
            density = float((self.S != 0).sum()) / mn
            # 4. β-controller (adaptive mode): the same law on the density
            if cfg.beta_mode == "adaptive":
                self.beta = controller_update(
                    self.beta, density, self.prev_density, cfg.rate_sparsity, rho, cfg.k_beta, cfg.k_dbeta,
                    self.count, cfg.pd_after, cfg.clamp_thresholds,
                )  # fmt: skip
            self.prev_density, self.density = density, density
        # 5. ρ-update: fixed (the code's default)
        # 6. dual ascent: Y ← Y + ρ (X − L − S)
        R = X - self.L - self.S
        self.Y = self.Y + rho * R
        self.residual = float(R.norm() / X.norm().clamp_min(1e-12))
        self.count += 1

    def state_dict(self) -> dict:
        return {
            **{k: getattr(self, k) for k in STATE_TENSORS},
            **{k: getattr(self, k) for k in STATE_SCALARS},
        }

    def load_state_dict(self, state: dict) -> None:
        for k in STATE_TENSORS:
            setattr(self, k, state[k].to(torch.float32).clone())
        for k in STATE_SCALARS:
            setattr(self, k, type(getattr(self, k))(state[k]))


# ---- deployment: Homomorphic Parameter Allocation ---------------------------------------------------------------
@dataclass
class Factors:
    """One block ready to deploy: the SVD of its low-rank part, its energy rank k and its sparse part."""

    U: Tensor  # m × r
    s: Tensor  # r
    Vh: Tensor  # r × n
    k: int  # energy rank (deploy_rank)
    S: Tensor  # m × n, mostly zeros

    @property
    def shape(self) -> tuple[int, int]:
        return self.U.shape[0], self.Vh.shape[1]

    @property
    def nnz(self) -> int:
        return int((self.S != 0).sum())


def factorize(L: Tensor, S: Tensor, energy: float = ENERGY) -> Factors:
    """SVD of a trained L and its deployment energy rank (spec §3.7 step 1)."""
    U, s, Vh = torch.linalg.svd(L.float(), full_matrices=False)
    return Factors(U, s, Vh, deploy_rank(s, energy), S.float())


def hpa_shrink(
    ks: list[int], dims: list[tuple[int, int]], nnzs: list[int], budget: float, n_rest: int = 0
) -> tuple[list[int], float]:
    """Homomorphic Parameter Allocation (spec §3.7 steps 2–3; reconstructed from the official evaluation script).

    ``N_full = N_rest + Σ_i [k_i (m_i + n_i) + nnz_i]``. If ``B ≥ N_full`` the ranks stay; else
    ``c = 1 − (N_full − B) / Σ_i k_i (m_i + n_i)`` clipped to [0, 1] and ``k_i' = ⌊c · k_i⌋`` — the same shrink
    factor for every block. Returns ``(k', c)``."""
    cost_l = sum(k * (m + n) for k, (m, n) in zip(ks, dims))
    n_full = n_rest + cost_l + sum(nnzs)
    if budget >= n_full:
        return list(ks), 1.0
    c = 0.0 if cost_l == 0 else min(max(1.0 - (n_full - budget) / cost_l, 0.0), 1.0)
    return [int(math.floor(c * k)) for k in ks], c


def top_entries(Z: Tensor, count: int) -> Tensor:
    """Z with all but its ``count`` largest-|·| entries set to 0."""
    flat = Z.flatten()
    out = torch.zeros_like(flat)
    count = max(0, min(int(count), flat.numel()))
    if count:
        idx = torch.topk(flat.abs(), count).indices
        out[idx] = flat[idx]
    return out.view_as(Z)


def surrogate(f: Factors, k: int, S: Tensor | None = None) -> Tensor:
    """``X̂ = U_{:k} diag(σ_{:k}) V_{:k}ᵀ + S`` (spec §3.7 step 4)."""
    return (f.U[:, :k] * f.s[:k]) @ f.Vh[:k] + (f.S if S is None else S)


def block_params(k: int, shape: tuple[int, int], nnz: int) -> int:
    """Parameters of a deployed block stored factored: ``k (m + n)`` + the nonzero values of S."""
    return k * (shape[0] + shape[1]) + nnz


Parts = dict[
    str, tuple[Tensor, Tensor, Tensor]
]  # name -> (U_k' diag(σ_k') [m × k'], V_k'ᵀ [k' × n], S [m × n])


def hpa_surrogates(
    factors: dict[str, Factors], budget: float, n_rest: int = 0
) -> tuple[dict[str, Tensor], dict[str, int], int, Parts]:
    """Every block's surrogate at ``budget`` parameters (N_rest included). Returns ``(X̂ by name, k' by name,
    counted parameters, the factored parts by name)``. Below ``N_rest + Σ nnz`` (c = 0 and still over budget) every S keeps the same fraction
    of its largest entries so that the count meets the budget (reconstructed: the spec's optional re-sparsification)."""
    names = list(factors)
    ks, c = hpa_shrink(
        [factors[n].k for n in names], [factors[n].shape for n in names], [factors[n].nnz for n in names],
        budget, n_rest,
    )  # fmt: skip
    total_nnz = sum(factors[n].nnz for n in names)
    keep = 1.0
    if c == 0.0 and total_nnz and n_rest + total_nnz > budget:
        keep = max(budget - n_rest, 0.0) / total_nnz
    out, ranks, count, parts = {}, {}, n_rest, {}
    for name, k in zip(names, ks):
        f = factors[name]
        S = f.S if keep >= 1.0 else top_entries(f.S, math.floor(keep * f.nnz))
        out[name], ranks[name] = surrogate(f, k, S), k
        parts[name] = (f.U[:, :k] * f.s[:k], f.Vh[:k], S)
        count += block_params(k, f.shape, int((S != 0).sum()))
    return out, ranks, count, parts


def posthoc_surrogates(
    weights: dict[str, Tensor], budget: float, density: float = 0.05, energy: float = ENERGY, n_rest: int = 0
) -> tuple[dict[str, Tensor], dict[str, int], int, Parts]:
    """Post-hoc compression of dense weights at ``budget`` (the baseline of spec §6 (A)): truncated SVD of X with the
    HPA shrink rule on X's deployment energy ranks, plus the top-``density`` entries (by |·|) of the residual
    ``X − L_{k'}``. Returns ``(X̂ by name, k' by name, counted parameters, the factored parts by name)``."""
    names = list(weights)
    svds = {n: torch.linalg.svd(weights[n].detach().float(), full_matrices=False) for n in names}
    dims = [tuple(weights[n].shape) for n in names]
    nnzs = [int(math.floor(density * m * k)) for m, k in dims]
    ks = [deploy_rank(svds[n][1], energy) for n in names]
    ks, c = hpa_shrink(ks, dims, nnzs, budget, n_rest)
    total_nnz = sum(nnzs)
    if c == 0.0 and total_nnz and n_rest + total_nnz > budget:
        nnzs = [int(math.floor(v * max(budget - n_rest, 0.0) / total_nnz)) for v in nnzs]
    out, ranks, count, parts = {}, {}, n_rest, {}
    for name, k, nnz, shape in zip(names, ks, nnzs, dims):
        U, s, Vh = svds[name]
        L = (U[:, :k] * s[:k]) @ Vh[:k]
        S = top_entries(weights[name].detach().float() - L, nnz)
        out[name], ranks[name] = L + S, k
        parts[name] = (U[:, :k] * s[:k], Vh[:k], S)
        count += block_params(k, shape, int((S != 0).sum()))
    return out, ranks, count, parts
