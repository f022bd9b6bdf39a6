"""Curvature of a loss at a point: Hessian-vector products by automatic differentiation (``torch.func``, no
hand-written second derivatives), Lanczos with full re-orthogonalisation for the top eigenpairs (Golub & Van Loan,
Matrix Computations, §10.1), power iteration for λ_max and Hutchinson's trace estimator; used by the lock-in
analysis (the curvature basis of its harm signal and soft-mode projection).

Parameters are handled as one flat vector ``θ`` over a fixed list of named tensors (``FlatParams``), so every
operator is a plain ``R^P → R^P`` map. Attention must run with a twice-differentiable kernel: ``hvp`` runs under
``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` (the fused CPU kernels have no double backward).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

Matvec = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class FlatParams:
    """A fixed ordering of named tensors, flattened to one vector and back."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    @classmethod
    def of(cls, tensors: Mapping[str, Tensor], names: Sequence[str] | None = None) -> FlatParams:
        names = tuple(names if names is not None else tensors)
        return cls(names, tuple(tensors[n].shape for n in names))

    @property
    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def flatten(self, tensors: Mapping[str, Tensor]) -> Tensor:
        return torch.cat([tensors[n].reshape(-1) for n in self.names])

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        out, i = {}, 0
        for n, s in zip(self.names, self.shapes):
            k = math.prod(s)
            out[n] = flat[i : i + k].view(s)
            i += k
        return out


def lm_loss_fn(
    model: nn.Module, batches: Sequence[Mapping[str, Tensor]], flat: FlatParams, fixed: Mapping[str, Tensor]
) -> Callable[[Tensor], Tensor]:
    """``θ ↦`` mean next-token CE of ``model`` over ``batches`` with the flat parameters ``θ`` (and the other
    tensors of ``fixed``: buffers, frozen weights)."""

    def loss(theta: Tensor) -> Tensor:
        state = {**fixed, **flat.unflatten(theta)}
        total = 0.0
        for b in batches:
            logits = functional_call(model, state, (b["input_ids"],))
            logits = logits if isinstance(logits, Tensor) else logits.logits
            total = total + F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten())
        return total / len(batches)

    return loss


def hvp(f: Callable[[Tensor], Tensor], theta: Tensor, v: Tensor) -> Tensor:
    """``H v = ∇_θ <∇_θ f(θ), v>`` (reverse over reverse, ``torch.func.grad``), under the MATH SDPA backend."""
    with sdpa_kernel(SDPBackend.MATH):
        return torch.func.grad(lambda t: torch.dot(torch.func.grad(f)(t), v))(theta)


def hessian_operator(f: Callable[[Tensor], Tensor], theta: Tensor) -> Matvec:
    theta = theta.detach()
    return lambda v: hvp(f, theta, v.to(theta.dtype)).detach()


@dataclass(frozen=True)
class Eigen:
    values: Tensor  # [k], descending
    vectors: Tensor  # [P, k], orthonormal columns
    residuals: Tensor  # [k]: ||H v - λ v|| / |λ|
    ritz_all: Tensor  # every Ritz value of T_m, descending (the spectrum plot)


def lanczos(
    matvec: Matvec, dim: int, k: int = 20, m: int | None = None, seed: int = 0, dtype=torch.float64
) -> Eigen:
    """Top-``k`` eigenpairs (largest algebraic) of a symmetric operator by ``m`` Lanczos steps (default 2.5 k)
    with full re-orthogonalisation (classical Gram-Schmidt, twice) against every earlier Lanczos vector; the
    tridiagonal ``T_m`` is solved in float64, Ritz vectors are ``Q_mᵀ y``, and each pair's residual
    ``||H v - λ v|| / |λ|`` is measured with one more product. The start vector comes from a private generator."""
    m = min(dim, m or int(math.ceil(2.5 * k)))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(dim, generator=g, dtype=dtype)
    q = q / q.norm()
    Q = torch.zeros(m, dim, dtype=dtype)
    alphas, betas = [], []
    q_prev, beta = torch.zeros_like(q), 0.0
    for j in range(m):
        Q[j] = q
        w = matvec(q).to(dtype)
        alpha = float(torch.dot(w, q))
        w = w - alpha * q - beta * q_prev
        for _ in range(2):  # full re-orthogonalisation, twice
            w = w - Q[: j + 1].T @ (Q[: j + 1] @ w)
        beta = float(w.norm())
        alphas.append(alpha)
        if j == m - 1 or beta < 1e-12 * max(1.0, abs(alpha)):
            break
        betas.append(beta)
        q_prev, q = q, w / beta
    n = len(alphas)
    T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if n > 1:
        off = torch.tensor(betas[: n - 1], dtype=torch.float64)
        T = T + torch.diag(off, 1) + torch.diag(off, -1)
    evals, evecs = torch.linalg.eigh(T)
    order = torch.argsort(evals, descending=True)
    evals, evecs = evals[order], evecs[:, order]
    k = min(k, n)
    V = Q[:n].T @ evecs[:, :k].to(dtype)
    res = torch.tensor(
        [float((matvec(V[:, i]).to(dtype) - evals[i] * V[:, i]).norm() / abs(evals[i])) for i in range(k)]
    )
    return Eigen(evals[:k], V, res, evals)


def power_iteration(matvec: Matvec, dim: int, iters: int = 100, seed: int = 0) -> float:
    """λ of largest magnitude (Rayleigh quotient after ``iters`` steps)."""
    v = torch.randn(dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    for _ in range(iters):
        w = matvec(v / v.norm()).double()
        v = w
    v = v / v.norm()
    return float(torch.dot(v, matvec(v).double()))


def hutchinson_trace(matvec: Matvec, dim: int, probes: int = 32, seed: int = 0) -> float:
    """``tr(H) ≈ mean_z zᵀ H z`` over Rademacher probes ``z``."""
    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(probes):
        z = torch.randint(0, 2, (dim,), generator=g).double() * 2 - 1
        total += float(torch.dot(z, matvec(z).double()))
    return total / probes


def rayleigh_check(
    matvec: Matvec, values: Tensor, vectors: Tensor, n: int | None = None
) -> dict[str, list[float]]:
    """An independent check of eigenpairs ``(λ_i, v_i)`` (columns of ``vectors``) with one fresh product each, for
    the first ``n`` pairs (default all): the Rayleigh quotient ``q_i = v_iᵀ H v_i / v_iᵀ v_i`` (a Ritz vector's
    quotient is its Ritz value), ``|q_i - λ_i| / |λ_i|`` and the residual ``||H v_i - λ_i v_i|| / (|λ_i| ||v_i||)``
    (the spec's acceptance test: below 1e-2), in float64."""
    n = vectors.shape[1] if n is None else min(n, vectors.shape[1])
    out: dict[str, list[float]] = {"value": [], "rayleigh": [], "rel_diff": [], "residual": []}
    for i in range(n):
        v, lam = vectors[:, i].double(), float(values[i])
        hv = matvec(v).double()
        q = float(torch.dot(v, hv) / torch.dot(v, v))
        out["value"].append(lam)
        out["rayleigh"].append(q)
        out["rel_diff"].append(abs(q - lam) / abs(lam) if lam != 0 else abs(q))
        out["residual"].append(float((hv - lam * v).norm() / (abs(lam) * v.norm())) if lam != 0 else math.inf)
    return out
