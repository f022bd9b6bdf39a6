"""Subspace algebra shared by the continual methods and baselines: the harness, LoRA-GPM, InfLoRA, Janus-LoRA
and LoDA all keep a basis of the input directions old tasks used, in the manner of GPM ("Gradient Projection
Memory for Continual Learning", Saha, Garg & Roy, ICLR 2021).

* ``SubspaceMemory``   an orthonormal basis V (d_in × k) of protected input directions, grown by GPM's energy
                       rule (``expand``), with ``project_out`` and ``captured_energy``.
* ``top_eigvecs``      descending eigenvectors of a symmetric matrix.
* ``violation_ratio``  ‖ΔW V‖ / ‖ΔW‖, the witness logged by every protected method.

Maths that one method alone uses lives in that method's file: Janus-LoRA's rectification in ``janus_lora.py``,
LoDA's energy objectives and recalibration in ``loda.py``. Computations run in float64.
"""

from __future__ import annotations

import torch
from torch import Tensor


def symmetric_part(M: Tensor) -> Tensor:
    """(M + Mᵀ) / 2."""
    return 0.5 * (M + M.T)


def top_eigvecs(M: Tensor, r: int) -> tuple[Tensor, Tensor]:
    """The ``r`` largest eigenpairs of a symmetric matrix, descending: (values (r,), vectors (d, r))."""
    if r < 1 or r > M.shape[0]:
        raise ValueError(f"need 1 <= r <= {M.shape[0]} eigenvectors, got r={r}")
    vals, vecs = torch.linalg.eigh(symmetric_part(M.double()))
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
        C = symmetric_part(C.double())
        if C.shape != (self.d_in, self.d_in):
            raise ValueError(f"second moment of shape {tuple(C.shape)} does not match d_in={self.d_in}")
        total = torch.trace(C)
        have = torch.trace(self.V.T @ C @ self.V)
        room = self.d_in - self.min_free - self.k
        if total <= 0 or have >= threshold * total or room <= 0:
            return 0
        P = torch.eye(self.d_in, dtype=torch.float64) - self.V @ self.V.T
        vals, vecs = torch.linalg.eigh(symmetric_part(P @ C @ P))
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


def violation_ratio(dW: Tensor, V: Tensor) -> float:
    """ν = ‖ΔW V‖_F / ‖ΔW‖_F (0 when ΔW = 0 or V is empty)."""
    if V.shape[1] == 0:
        return 0.0
    dW, V = dW.double(), V.double()
    n = torch.linalg.matrix_norm(dW)
    return 0.0 if n == 0 else float(torch.linalg.matrix_norm(dW @ V) / n)
