"""Shared subspace bookkeeping for continual LoRA methods (_lora_core.md §3, janus_lora.md §3.3–3.4, loda.md §3.3–3.5).

Everything here is a pure function of tensors (or a small stateful basis), so Janus-LoRA, LoDA and the
GPM / InfLoRA / O-LoRA baselines share one implementation:

* ``SubspaceMemory``      an orthonormal basis V (d_in × k) of protected input directions, grown by the
                          GPM energy rule (``expand``), with ``project_out`` and ``captured_energy``.
* ``top_eigvecs``         descending eigenvectors of a symmetric matrix.
* ``general_basis`` / ``isolated_basis`` / ``recalibration_coeff``   LoDA's two energy objectives and its
                          closed-form merge coefficient.
* ``rectify_update``      Janus-LoRA's gradient rectification: rewrite an optimiser's (ΔA, ΔB) so that the
                          *composite* change B'A' − BA annihilates V (modes ``project`` and ``tangent``).
* ``violation_ratio``     ‖ΔW V‖ / ‖ΔW‖, the witness logged by every protected method.

Computations run in float64 and return the caller's dtype.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from torch import Tensor


def _sym(M: Tensor) -> Tensor:
    return 0.5 * (M + M.T)


def top_eigvecs(M: Tensor, r: int) -> tuple[Tensor, Tensor]:
    """The ``r`` largest eigenpairs of a symmetric matrix, descending: (values (r,), vectors (d, r))."""
    if r < 1 or r > M.shape[0]:
        raise ValueError(f"need 1 <= r <= {M.shape[0]} eigenvectors, got r={r}")
    vals, vecs = torch.linalg.eigh(_sym(M.double()))
    return vals.flip(0)[:r], vecs.flip(1)[:, :r]


class SubspaceMemory:
    """Orthonormal basis ``V`` (d_in × k, k may be 0) of the input subspace used by past tasks (GPM)."""

    def __init__(self, d_in: int, min_free: int = 8):
        if d_in < 1 or min_free < 0:
            raise ValueError(f"SubspaceMemory needs d_in >= 1 and min_free >= 0, got {d_in}, {min_free}")
        self.d_in, self.min_free = d_in, min_free
        self.V = torch.zeros(d_in, 0, dtype=torch.float64)

    @property
    def k(self) -> int:
        return self.V.shape[1]

    def project_out(self, G: Tensor) -> Tensor:
        """G − (G V) Vᵀ for any G whose last dim is d_in: the part of G that reads no protected direction."""
        if self.k == 0:
            return G
        V = self.V.to(G)
        return G - (G @ V) @ V.T

    def captured_energy(self, C: Tensor) -> float:
        """trace(Vᵀ C V) / trace(C): the fraction of C's energy inside the protected subspace."""
        C = C.double()
        return float(torch.trace(self.V.T @ C @ self.V) / torch.trace(C).clamp_min(1e-300))

    def expand(self, C: Tensor, threshold: float) -> int:
        """GPM growth: append the fewest eigenvectors u_i of P C P (P = I − V Vᵀ) with
        trace(Vᵀ C V) + Σ_{i≤m} λ_i ≥ threshold · trace(C). Existing columns are kept as they are.
        Returns m, the number of columns added (capped so that k ≤ d_in − min_free)."""
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"energy threshold must be in (0, 1], got {threshold}")
        C = _sym(C.double())
        if C.shape != (self.d_in, self.d_in):
            raise ValueError(f"second moment of shape {tuple(C.shape)} does not match d_in={self.d_in}")
        total = torch.trace(C)
        have = torch.trace(self.V.T @ C @ self.V)
        room = self.d_in - self.min_free - self.k
        if total <= 0 or have >= threshold * total or room <= 0:
            return 0
        P = torch.eye(self.d_in, dtype=torch.float64) - self.V @ self.V.T
        vals, vecs = torch.linalg.eigh(_sym(P @ C @ P))
        vals, vecs = vals.flip(0).clamp_min(0), vecs.flip(1)
        reached = have + torch.cumsum(vals, 0) >= threshold * total
        m = int(reached.nonzero()[0]) + 1 if reached.any() else self.d_in
        m = min(m, room)
        new = P @ vecs[:, :m]  # re-project (eigh leaves O(eps) overlap with V), then orthonormalise
        new = new - self.V @ (self.V.T @ new)
        q, _ = torch.linalg.qr(new)
        self.V = torch.cat([self.V, q], dim=1)
        return m

    def state(self) -> dict:
        return {"V": self.V.clone(), "min_free": self.min_free}

    def load(self, state: dict) -> None:
        self.V = state["V"].double().clone()
        self.min_free = int(state.get("min_free", self.min_free))


# ---- LoDA: the two energy objectives and the recalibration (loda.md §3.3, §3.5) --------------------
def general_basis(M_cur: Tensor, M_prev: Tensor, r: int) -> Tensor:
    """Objective 1: argmax_{UᵀU=I} trace(Uᵀ(M_prev + M_cur)U) = top-r eigenvectors, (d, r)."""
    return top_eigvecs(M_prev.double() + M_cur.double(), r)[1]


def ridged(M_prev: Tensor, ridge: float) -> Tensor:
    """M_prev + ridge · trace(M_prev)/d · I (our addition, loda.md §3.3; ridge=0 is the official code)."""
    M = M_prev.double()
    d = M.shape[0]
    return M + ridge * torch.trace(M) / d * torch.eye(d, dtype=M.dtype)


def isolated_basis(
    M_cur: Tensor, M_prev: Tensor, r: int, ridge: float = 1e-3, return_unorthogonalised: bool = False
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Objective 2: max trace(Uᵀ M_cur U) s.t. Uᵀ M_prev U = I — the top-r generalized eigenvectors of
    (M_cur, M_prev), computed as the official code does: Cholesky M_prev = L Lᵀ (retrying with +eps I),
    S = L⁻¹ M_cur L⁻ᵀ, U = L⁻ᵀ V_r, then QR. Returns Q (d, r); optionally also U and the eigenvalues."""
    M_prev, M_cur = _sym(ridged(M_prev, ridge)), _sym(M_cur.double())
    eye = torch.eye(M_prev.shape[0], dtype=torch.float64)
    L, info = torch.linalg.cholesky_ex(M_prev)
    eps = 1e-12
    while int(info) != 0:  # the official retry: + eps I, eps = 1e-12, 1e-11, ...
        if eps > 1e2:
            raise RuntimeError("isolated_basis: M_prev is not positive definite even with a 1e2 ridge")
        L, info = torch.linalg.cholesky_ex(M_prev + eps * eye)
        eps *= 10
    Linv = torch.linalg.solve_triangular(L, eye, upper=False)
    vals, Vr = top_eigvecs(Linv @ M_cur @ Linv.T, r)
    U = Linv.T @ Vr
    Q, _ = torch.linalg.qr(U)
    return (Q, U, vals) if return_unorthogonalised else Q


def recalibration_coeff(A: Tensor, M_prev: Tensor, M_cur: Tensor, gamma_m: float) -> Tensor:
    """c_i = 1 − η_i, η_i = a_iᵀM_prev a_i / (a_iᵀM_prev a_i + γ_m a_iᵀM_cur a_i + 1e-12), for the rows a_i of A:
    the minimiser of c² a_iᵀM_prev a_i + γ_m (c − 1)² a_iᵀM_cur a_i (loda.md §3.5)."""
    A = A.double()
    old = torch.einsum("ij,jk,ik->i", A, M_prev.double(), A)
    new = torch.einsum("ij,jk,ik->i", A, M_cur.double(), A)
    return 1.0 - old / (old + gamma_m * new + 1e-12)


# ---- Janus-LoRA: gradient rectification (janus_lora.md §3.4) ---------------------------------------
GRMode = Literal["project", "tangent"]


def _read_directions(A0: Tensor, V: Tensor) -> Tensor:
    """P_M = U_keep U_keepᵀ (r × r) for the rank directions of the adapter that read V (M = A0 V).
    The tolerance is relative to ‖A0‖₂, not to max(S): with A0 V ≈ 0 a max(S)-relative test would keep
    every direction and freeze B entirely (janus_lora.md §3.4)."""
    U, S, _ = torch.linalg.svd(A0 @ V, full_matrices=False)
    keep = S > 1e-6 * torch.linalg.matrix_norm(A0, ord=2)
    Uk = U[:, keep]
    return Uk @ Uk.T


def free_rank_directions(A0: Tensor, V: Tensor) -> Tensor:
    """I_r − P_M: the rank directions of the adapter that read nothing of V (where B may still move)."""
    A0, V = A0.double(), V.double()
    return torch.eye(A0.shape[0], dtype=torch.float64) - _read_directions(A0, V)


def rectify_update(
    A0: Tensor,
    B0: Tensor,
    A1: Tensor,
    B1: Tensor,
    V: Tensor,
    mode: GRMode = "project",
    delta: float = 0.1,
    free: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Rewrite one optimiser step (A0, B0) → (A1, B1) so that B A − B0 A0 annihilates V exactly.

    ``project`` (default): ΔA* = ΔA P, ΔB* = ΔB (I − P_M) — the factor update nearest the optimiser's whose
    two first-order terms are each orthogonal to V. ``tangent``: least-squares realisation of the projected
    composite update Z = (B0 ΔA + ΔB A0) P on the tangent space at (B0, A_free), damped by ``delta``; falls
    back to ``project`` (with a warning) if the solve is not finite. Both give ΔA* V = 0 and ΔB* A0 V = 0,
    hence (B A − B0 A0) V = 0 to all orders. Identity when V has no columns (task 1).
    ``free`` = I − P_M may be passed in: since ΔA* V = 0, A V (and so P_M) is constant during a task, and a
    caller can compute it once per task with ``free_rank_directions`` instead of one SVD per step.
    """
    if V.shape[1] == 0:
        return A1, B1
    dtype = A1.dtype
    A0, B0, A1, B1, V = (t.double() for t in (A0, B0, A1, B1, V))
    dA, dB = A1 - A0, B1 - B0
    r = A0.shape[0]
    I_r = torch.eye(r, dtype=torch.float64)
    free = I_r - _read_directions(A0, V) if free is None else free.double()
    if mode == "tangent":
        dAs, dBs = _tangent(A0, B0, dA, dB, V, free, delta)
        if not (torch.isfinite(dAs).all() and torch.isfinite(dBs).all()):
            warnings.warn(
                "rectify_update: tangent solve not finite, using mode='project' for this step", stacklevel=2
            )
            mode = "project"
    elif mode != "project":
        raise ValueError(f"gr mode must be 'project' or 'tangent', got {mode!r}")
    if mode == "project":
        dAs = dA - (dA @ V) @ V.T  # ΔA* = ΔA P
        dBs = dB @ free  # ΔB* = ΔB (I − P_M)
    return (A0 + dAs).to(dtype), (B0 + dBs).to(dtype)


def _tangent(A0, B0, dA, dB, V, free, delta):
    r = A0.shape[0]
    I_r = torch.eye(r, dtype=torch.float64)
    Z = B0 @ dA + dB @ A0
    Z = Z - (Z @ V) @ V.T  # the safe composite update, Z V = 0
    A_free = free @ A0
    lam_B = delta * torch.trace(B0.T @ B0) / r + 1e-12
    lam_A = delta * torch.trace(A0 @ A0.T) / r + 1e-12
    H_B = B0.T @ B0 + lam_B * I_r
    H_A = A_free @ A_free.T + lam_A * I_r
    dAs = torch.linalg.solve(H_B, B0.T @ Z)  # ΔA* = H_B⁻¹ B0ᵀ Z
    ZAt = Z @ A_free.T
    dBs = (ZAt - B0 @ torch.linalg.solve(H_B, B0.T @ ZAt)) @ torch.linalg.inv(H_A) @ free
    return dAs, dBs


def violation_ratio(dW: Tensor, V: Tensor) -> float:
    """ν = ‖ΔW V‖_F / ‖ΔW‖_F (0 when ΔW = 0 or V is empty)."""
    if V.shape[1] == 0:
        return 0.0
    dW, V = dW.double(), V.double()
    n = torch.linalg.matrix_norm(dW)
    return 0.0 if n == 0 else float(torch.linalg.matrix_norm(dW @ V) / n)
