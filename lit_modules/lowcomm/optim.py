"""Low-rank quasi-hyperbolic AdamW (LoRDO's local optimizer; GaLore when ω = 1 and error feedback is off).

LoRDO: "LoRDO: Distributed Low-Rank Optimization with Infrequent Communication" (arXiv 2602.04396); GaLore:
"GaLore: Memory-Efficient LLM Training by Gradient Low-Rank Projection" (arXiv 2403.03507); the QH mix:
quasi-hyperbolic momentum (Ma & Yarats, ICLR 2019); the error feedback of the projection as in LDAdam.
For a projected ("low-rank") matrix W ∈ R^{p×q} the Adam moments live in r dimensions:

    G ← G + E                                   # error feedback
    g = P(G);  E ← G − Pᵀ(g)                    # P(G) = QᵀG (left, p < q) or G Qᵀ (right, p ≥ q)
    u ← β₁u + (1−β₁)g;  v ← β₂v + (1−β₂)g²;  s ← s+1
    den = √(v/(1−β₂ˢ)) + ε;  μ = mean(den)      # μ: one scalar per matrix (reconstructed normaliser)
    W ← W − η[ω·Pᵀ(û/den) + (1−ω)·G/(μ+ε)];  W ← W − ηλW

Every other parameter gets AdamW (with ``qh_full_rank`` the QH mix ``(1−ω)G + ω m̂`` inside the ratio).
Parameter groups carry ``low_rank: bool``. The projector Q is optimizer state (checkpointed with it); who
sets it is the caller's choice: ``init_projectors``/``refresh_projectors`` (LoRDO's strategy, from the
all-reduced gradient / pseudo-gradient), or ``update_proj_gap > 0`` (GaLore: from the current — under DDP,
averaged — gradient every ``update_proj_gap`` steps). It provides what ``LoRDOStrategy`` needs from an optimizer,
``litlab.lit_modules.lowcomm.contract.LowRankSyncOptimizer``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor


def is_left(shape: torch.Size) -> bool:
    """GaLore's "std" rule: project the smaller side; p < q uses a left projector Q ∈ R^{p×r}."""
    return shape[0] < shape[1]


def top_singular_basis(M: Tensor, rank: int) -> Tensor:
    """Q from the top-``rank`` singular vectors of ``M`` (fp32): p×r (left case) or r×q (right case)."""
    U, _, Vh = torch.linalg.svd(M.to(_compute_dtype(M)), full_matrices=False)
    return U[:, :rank].contiguous() if is_left(M.shape) else Vh[:rank].contiguous()


def _compute_dtype(t: Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)  # bf16/fp16 -> fp32; fp64 stays fp64


def project(G: Tensor, Q: Tensor) -> Tensor:
    return Q.T @ G if is_left(G.shape) else G @ Q.T


def project_back(g: Tensor, Q: Tensor, shape: torch.Size) -> Tensor:
    return Q @ g if is_left(shape) else g @ Q


def subspace_similarity(Q_new: Tensor, Q_old: Tensor, left: bool) -> float:
    """Mean squared cosine of the principal angles between span(Q_new) and span(Q_old), in [0, 1]."""
    overlap = Q_new.T @ Q_old if left else Q_new @ Q_old.T
    return float(overlap.pow(2).sum() / overlap.shape[0])


class LowRankQHAdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable,
        lr: float = 3e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 1e-5,
        rank: int = 8,
        qh_omega: float = 0.97,
        error_feedback: bool = True,
        qh_full_rank: bool = False,
        update_proj_gap: int = 0,
    ) -> None:
        if lr <= 0:
            raise ValueError(f"lr={lr} must be positive")
        if not 0.0 <= qh_omega <= 1.0:
            raise ValueError(f"qh_omega={qh_omega} must be in [0, 1]")
        if rank <= 0:
            raise ValueError(f"rank={rank} must be positive")
        if update_proj_gap < 0:
            raise ValueError(
                f"update_proj_gap={update_proj_gap} must be >= 0 (0: projectors set by the caller)"
            )
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            rank=rank,
            qh_omega=qh_omega,
            error_feedback=error_feedback,
            qh_full_rank=qh_full_rank,
            update_proj_gap=update_proj_gap,
            low_rank=False,
        )
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if group["low_rank"] and p.dim() != 2:
                    raise ValueError(
                        f"a low_rank group holds a parameter of shape {tuple(p.shape)}; only 2-D "
                        "matrices can be projected"
                    )

    # ---- which tensors are projected ---------------------------------------------------------------
    def low_rank_params(self) -> list[Tensor]:
        return [p for g in self.param_groups if g["low_rank"] for p in g["params"]]

    def _rank_of(self, p: Tensor) -> int:
        group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
        return min(group["rank"], *p.shape)

    def projectors_ready(self) -> bool:
        return all("projector" in self.state[p] for p in self.low_rank_params())

    def init_projectors(self, grads: Mapping[Tensor, Tensor]) -> None:
        """The first projector of each low-rank matrix, from a (usually all-reduced) gradient."""
        for p, G in grads.items():
            self.state[p]["projector"] = top_singular_basis(G, self._rank_of(p)).to(_compute_dtype(p))

    def projectors(self) -> list[Tensor]:
        """Each low-rank matrix's Q (the state tensors themselves), in ``low_rank_params`` order."""
        return [self.state[p]["projector"] for p in self.low_rank_params()]

    # ---- the local step ----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if group["low_rank"]:
                    self._low_rank_step(p, p.grad, group)
                else:
                    self._adamw_step(p, p.grad, group)
        return loss

    def _low_rank_step(self, p: Tensor, grad: Tensor, group: dict) -> None:
        beta1, beta2 = group["betas"]
        eps, omega, lr = group["eps"], group["qh_omega"], group["lr"]
        state = self.state[p]
        G = grad.to(_compute_dtype(grad))
        if group["error_feedback"]:
            G = G + state.setdefault("error", torch.zeros_like(G))  # G ← G + E
        gap = group["update_proj_gap"]
        if "projector" not in state or (gap > 0 and int(state.get("step", 0)) % gap == 0):
            state["projector"] = top_singular_basis(G, self._rank_of(p)).to(
                G.dtype
            )  # GaLore / local fallback
        Q = state["projector"]
        g = project(G, Q)  # g = P(G)
        if group["error_feedback"]:
            state["error"] = G - project_back(g, Q, G.shape)  # E ← G − Pᵀ(g)
        if "exp_avg" not in state:
            state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(g), torch.zeros_like(g)
        state["step"] = int(state.get("step", 0)) + 1
        u, v, s = state["exp_avg"], state["exp_avg_sq"], state["step"]
        u.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        u_hat = u / (1 - beta1**s)
        den = (v / (1 - beta2**s)).sqrt_().add_(eps)
        mu = den.mean()  # one scalar per matrix
        update = omega * project_back(u_hat / den, Q, G.shape)  # ω Δ_low
        if omega < 1.0:
            update = update + (1 - omega) * G / (mu + eps)  # (1−ω) Δ_full, incl. E
        p.add_(update.to(p.dtype), alpha=-lr)
        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])  # decoupled decay

    def _adamw_step(self, p: Tensor, grad: Tensor, group: dict) -> None:
        beta1, beta2 = group["betas"]
        eps, omega, lr = group["eps"], group["qh_omega"], group["lr"]
        state = self.state[p]
        if "exp_avg" not in state:
            state["exp_avg"], state["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
        state["step"] = int(state.get("step", 0)) + 1
        m, v, s = state["exp_avg"], state["exp_avg_sq"], state["step"]
        p.mul_(1 - lr * group["weight_decay"])
        m.mul_(beta1).add_(grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        numer = m / (1 - beta1**s)
        if group["qh_full_rank"]:
            numer = omega * numer + (1 - omega) * grad  # QH mix inside the ratio
        p.addcdiv_(numer, (v / (1 - beta2**s)).sqrt_().add_(eps), value=-lr)

    # ---- what a sync touches ------------------------------------------------------------------------
    def state_tensors_for_sync(self, include_error_feedback: bool = True) -> list[Tensor]:
        """u, v of every low-rank matrix, then m, v of every full-rank parameter, then E: a fixed order that is
        identical on every rank (parameter order). Tensors not created yet (before the first step) are created
        as zeros so every rank contributes the same shapes."""
        low, full, errors = [], [], []
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if group["low_rank"]:
                    r = self._rank_of(p)
                    shape = (r, p.shape[1]) if is_left(p.shape) else (p.shape[0], r)
                    for key in ("exp_avg", "exp_avg_sq"):
                        state.setdefault(key, torch.zeros(shape, device=p.device, dtype=_compute_dtype(p)))
                    low += [state["exp_avg"], state["exp_avg_sq"]]
                    if include_error_feedback and group["error_feedback"]:
                        errors.append(state.setdefault("error", torch.zeros_like(p, dtype=_compute_dtype(p))))
                else:
                    for key in ("exp_avg", "exp_avg_sq"):
                        state.setdefault(key, torch.zeros_like(p))
                    full += [state["exp_avg"], state["exp_avg_sq"]]
        return low + full + errors

    @torch.no_grad()
    def refresh_projectors(self, deltas: Mapping[Tensor, Tensor], rotate: bool = True) -> list[float]:
        """Sync steps 4–5: Q_new from the top-r singular vectors of each Δ_W; optionally rotate the moments
        into the new basis. Returns the subspace similarity (mean σ² of Q_newᵀQ_old) of each matrix."""
        sims = []
        for p, delta in deltas.items():
            state = self.state[p]
            Q_new = top_singular_basis(delta, self._rank_of(p)).to(_compute_dtype(p))
            Q_old = state.get("projector")
            if Q_old is not None:
                left = is_left(p.shape)
                sims.append(subspace_similarity(Q_new, Q_old, left))
                if rotate and int(state.get("step", 0)) > 0 and "exp_avg" in state:
                    self._rotate_moments(state, Q_new, Q_old, left, p)
            state["projector"] = Q_new
        return sims

    def _rotate_moments(self, state: dict, Q_new: Tensor, Q_old: Tensor, left: bool, p: Tensor) -> None:
        group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
        beta1, beta2 = group["betas"]
        s = int(state["step"])
        R = Q_new.T @ Q_old if left else Q_new @ Q_old.T  # r×r, new ← old coordinates
        rot = (lambda x, M: M @ x) if left else (lambda x, M: x @ M.T)
        u, v = state["exp_avg"], state["exp_avg_sq"]
        m_hat, v_hat = u / (1 - beta1**s), v / (1 - beta2**s)
        var = (v_hat - m_hat**2).clamp_min(0)
        var_new = rot(var, R * R)
        state["exp_avg"] = rot(u, R)
        state["exp_avg_sq"] = (var_new + rot(m_hat, R) ** 2).abs() * (1 - beta2**s)
