"""LoDA: "Task-Driven Subspace Decomposition for Knowledge Sharing and Isolation in LoRA-based Continual
Learning" (He, Cheng, Wang, Yang, Wang & Gao, ICML 2026, arXiv 2603.00191). Only the paper's abstract could be
read; this follows its official code (github.com/HHHLF/LoDA_ICML2026), and where the two could differ the code
wins.

For every task, two fresh branches per adapted layer with *fixed* down-projections:
general  S_t: A_S = top-r eigenvectors of M_prev + M_cur             (energy of old and new inputs, obj. 1)
isolated P_t: A_P = top-r generalized eigenvectors of (M_cur, M_prev)   (new energy per unit of old, obj. 2)
Only the up-projections train (plus A_S on the first task), with Gradient-Aligned Optimisation; at the task
end the general update is shrunk per direction by a closed-form coefficient and both branches are merged.

Our additions: an optional ``ridge`` on M_prev in objective 2 (default 0.0, the released code, which has none;
the card's recorded numbers were made with 1e-3); the CPU toy's NCM-prototype
evaluation; one cosine head with the logits of other tasks masked instead of one head per task (the same
function: each task's CosFace sees only its own classes).

Algorithm (the official code's order), t = 0..T-1:
    (1) M_cur ← E[x xᵀ] over task-t data (current merged model)
    (2) A_S = U_r(M_prev + M_cur)ᵀ/√3, B_S = 0;  A_P = t ? isolated(M_cur, M_prev)ᵀ/√3 : 0, B_P = 0
    (3) train B_S, B_P (and A_S at t = 0) with CosFace on the task's head, one GAO update per group
    (4) M_cur ← E[x xᵀ] with the trained, unmerged model
    (5) W ← W + g_S B_S diag(c) A_S + g_P B_P A_P,  c_i = 1 − η_i             (c = 1 at t = 0)
    (6) M_prev ← M_prev + M_cur(4)                                            (``prev_stat_double_count``)
    (7) M_prev ← M_prev + E[x xᵀ] with the merged model
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from litlab.lit_modules.continual.contract import ContinualData
from litlab.lit_modules.continual.harness import SequentialLoRA
from litlab.lit_modules.continual.report import accuracy_matrix_report
from litlab.lit_modules.continual.subspace import symmetric_part, top_eigvecs
from litlab.lit_modules.core.adapters import AdapterLinear, inject_adapters, transform_adapter_grads
from litlab.lit_modules.core.results import CardResult, ReportExtras


# ---- the two energy objectives and the closed-form recalibration ------------------------------------------
def general_basis(M_cur: Tensor, M_prev: Tensor, r: int) -> Tensor:
    """Objective 1: argmax_{UᵀU=I} trace(Uᵀ(M_prev + M_cur)U) = top-r eigenvectors, (d, r)."""
    return top_eigvecs(M_prev.double() + M_cur.double(), r)[1]


def ridged(M_prev: Tensor, ridge: float) -> Tensor:
    """M_prev + ridge · trace(M_prev)/d · I. Our addition; ridge = 0 (the default) is the official code, which
    regularises M_prev only by the Cholesky retry (+1e-12 I, ×10 per failure). With ridge 0 on the CPU toy
    objective 2 was maximised by near-null directions of M_prev (e.g. the constant direction LayerNorm removes),
    whose current-task energy was about 0, and the isolated branch stayed inactive; 1e-3 keeps it active."""
    M = M_prev.double()
    d = M.shape[0]
    return M + ridge * torch.trace(M) / d * torch.eye(d, dtype=M.dtype)


def isolated_basis(
    M_cur: Tensor, M_prev: Tensor, r: int, ridge: float = 0.0, return_unorthogonalised: bool = False
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """Objective 2: max trace(Uᵀ M_cur U) s.t. Uᵀ M_prev U = I — the top-r generalized eigenvectors of
    (M_cur, M_prev), computed as the official code does: Cholesky M_prev = L Lᵀ (retrying with +eps I),
    S = L⁻¹ M_cur L⁻ᵀ, U = L⁻ᵀ V_r, then QR. Returns Q (d, r); optionally also U and the eigenvalues."""
    M_prev, M_cur = symmetric_part(ridged(M_prev, ridge)), symmetric_part(M_cur.double())
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
    """c_i = 1 − η_i, η_i = a_iᵀM_prev a_i / (a_iᵀM_prev a_i + γ_m a_iᵀM_cur a_i + 1e-12), for the rows a_i
    of A: the minimiser of c² a_iᵀM_prev a_i + γ_m (c − 1)² a_iᵀM_cur a_i, i.e. of
    E_old‖c Δ_i x‖² + γ_m E_cur‖(c − 1) Δ_i x‖² for the rank-1 piece Δ_i = g_S b_i a_iᵀ: the feature-level
    joint optimum along a shared direction."""
    A = A.double()
    old = torch.einsum("ij,jk,ik->i", A, M_prev.double(), A)
    new = torch.einsum("ij,jk,ik->i", A, M_cur.double(), A)
    return 1.0 - old / (old + gamma_m * new + 1e-12)


class LoDA(SequentialLoRA):
    """General + isolated branches with fixed down-projections, GAO, recalibrated merge (ablations by
    switch)."""

    def __init__(
        self,
        gamma_general: float = 0.5,
        gamma_isolated: float = 1.0,
        avg_halving: bool = True,
        a_scale: float = 0.57735,
        merge_gamma: float = 3.0,
        ridge: float = 0.0,
        prev_stat_double_count: bool = True,
        use_general: bool = True,
        use_isolated: bool = True,
        recalibrate: bool = True,
        gao_enabled: bool = True,
        gao_rho_max: float = 0.3,
        cosface_m: float = 0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not (use_general or use_isolated):
            raise ValueError("LoDA needs at least one of use_general / use_isolated")
        if gao_rho_max < 0 or ridge < 0 or merge_gamma <= 0:
            raise ValueError(
                "need gao_rho_max >= 0, ridge >= 0, merge_gamma > 0; "
                f"got {gao_rho_max}, {ridge}, {merge_gamma}"
            )
        half = 0.5 if avg_halving and use_general and use_isolated else 1.0  # the config's `avg: true`
        self.g_S, self.g_P = gamma_general * half, gamma_isolated * half
        self.M_prev: dict[str, Tensor] = {}

    def inject(self, backbone) -> dict[str, AdapterLinear]:
        hp = self.hparams
        targets = hp.targets if isinstance(hp.targets, str) else list(hp.targets)
        inject_adapters(
            backbone, targets, rank=hp.rank, alpha=self.g_S * hp.rank, branch="general", init="zeros"
        )
        adapted = inject_adapters(
            backbone,
            targets,
            rank=hp.rank,
            alpha=self.g_P * hp.rank,
            branch="isolated",
            init="zeros",
            train_A=False,
        )
        self.M_prev = {
            n: torch.zeros(m.in_features, m.in_features, dtype=torch.float64) for n, m in adapted.items()
        }
        return dict(adapted)

    # (1)–(2): fixed down-projections from the two energy objectives
    def on_task_start(self, t: int, dm: ContinualData) -> None:
        super().on_task_start(t, dm)
        hp = self.hparams
        M_cur = self.collect_stats(dm.task_train_loader(t))  # (1)
        with torch.no_grad():
            for n, layer in self.adapted.items():
                S, P = layer.branches["general"], layer.branches["isolated"]
                A_S = general_basis(M_cur[n], self.M_prev[n], hp.rank).T * hp.a_scale  # objective 1
                S.A.copy_(A_S.to(S.A) if hp.use_general else torch.zeros_like(S.A))
                if t > 0 and hp.use_isolated:
                    A_P = (
                        isolated_basis(M_cur[n], self.M_prev[n], hp.rank, hp.ridge).T * hp.a_scale
                    )  # objective 2
                    P.A.copy_(A_P.to(P.A))
                else:
                    P.A.zero_()
                S.B.zero_()
                P.B.zero_()

    def transform_grads(self) -> None:
        if self.task > 0:  # A_S trains on the first task only; A_P never
            transform_adapter_grads(self.adapted, lambda mn, bn, b, g: {"A": None})

    # (3) CosFace on the current task's classes: s · (cos − m·1[y]), other classes masked
    def loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        hp = self.hparams
        cos = self.cosine_logits(self.features(x)) - hp.cosface_m * F.one_hot(y, self.head.shape[0])
        loss = F.cross_entropy((hp.head_scale * cos).masked_fill(~self.class_mask, float("-inf")), y)
        return loss, {"loss_cosface": loss.detach()}

    def _shifted_params(self) -> list[torch.nn.Parameter]:
        """The LoRA tensors GAO perturbs: B_S, B_P (and A_S on the first task); the head is not shifted."""
        return [
            p
            for layer in self.adapted.values()
            for b in layer.branches.values()
            for k, p in b.factors().items()
            if p.requires_grad and (k == "B" or self.task == 0)
        ]

    # (3) GAO: each group's update is its gradient at a point moved along the other group's descent
    def cl_step(self, batch, opt, backward) -> dict[str, Tensor]:
        x, y = batch
        classes = y.unique()
        if not self.hparams.gao_enabled or len(classes) < 2:
            return super().cl_step(batch, opt, backward)
        classes = classes[torch.randperm(len(classes))]
        in_first = torch.isin(y, classes[: max(1, len(classes) // 2)])
        g1, g2 = (x[in_first], y[in_first]), (x[~in_first], y[~in_first])
        rho = -self.hparams.gao_rho_max * float(torch.rand(()))  # one scalar per batch, negative
        for src, tgt in ((g1, g2), (g2, g1)):
            loss, logs = self.gao_half_step(src, tgt, rho, opt, backward)
        return {"loss": loss.detach(), **logs, "gao_rho": torch.tensor(rho)}

    def gao_half_step(self, src, tgt, rho: float, opt, backward) -> tuple[Tensor, dict[str, Tensor]]:
        """θ += e = ρ·g_src/‖g_src‖ (per tensor); one optimizer step on L_tgt(θ + e); θ −= e (the step is
        kept)."""
        params = self._shifted_params()
        grads = torch.autograd.grad(self.loss(*src)[0], params, allow_unused=True)
        shifts = [
            torch.zeros_like(p) if g is None else rho * g / (g.norm() + 1e-12) for p, g in zip(params, grads)
        ]
        with torch.no_grad():
            for p, e in zip(params, shifts):
                p.add_(e)
        loss, logs = self.loss(*tgt)
        opt.zero_grad()
        backward(loss)
        self.transform_grads()
        opt.step()
        with torch.no_grad():
            for p, e in zip(params, shifts):
                p.sub_(e)
        return loss, logs

    # (4)–(7): recalibrate, merge, bookkeeping
    def on_task_end(self, t: int, dm: ContinualData) -> dict[str, float]:
        hp = self.hparams
        M_cur = self.collect_stats(dm.task_train_loader(t))  # (4)
        coeffs, activity = [], []
        for n, layer in self.adapted.items():
            S, P = layer.branches["general"], layer.branches["isolated"]
            c = (
                recalibration_coeff(S.A.detach(), self.M_prev[n], M_cur[n], hp.merge_gamma)
                if t > 0 and hp.recalibrate
                else torch.ones(hp.rank, dtype=torch.float64)
            )  # c_i = 1 − η_i
            layer.fold_in("general", coeff=c.float())  # (5)
            layer.fold_in("isolated")
            coeffs.append(c)
            if t > 0:  # share of the task's input energy the isolated directions read, vs the general ones
                activity.append(_energy(P.A, M_cur[n]) / max(_energy(S.A, M_cur[n]), 1e-30))
            if hp.prev_stat_double_count:
                self.M_prev[n] = self.M_prev[n] + M_cur[n]  # (6)
        for n, M in self.collect_stats(dm.task_train_loader(t)).items():  # (7)
            self.M_prev[n] = self.M_prev[n] + M
        logs = {"loda/recal_coeff_mean": float(torch.cat(coeffs).mean())}
        if activity:
            logs["loda/isolated_energy_ratio"] = sum(activity) / len(activity)
        return {**super().on_task_end(t, dm), **logs}

    def cl_state(self) -> dict:
        return {**super().cl_state(), "M_prev": self.M_prev}

    def load_cl_state(self, state: dict) -> None:
        super().load_cl_state(state)
        self.M_prev = {n: M.double() for n, M in state["M_prev"].items()}


def _energy(A: Tensor, M: Tensor) -> float:
    """trace(A M Aᵀ): the input energy the rows of A read."""
    A = A.detach().double()
    return float(torch.trace(A @ M @ A.T))


def report(result: CardResult, out_dir) -> ReportExtras:
    """``report_hook`` of seeds/loda.yaml: the mean accuracy matrix of every run and a table of ACC / BWT /
    forgetting / MAA. Step times against plain LoRA: ``litlab bench continual_steps``."""
    return accuracy_matrix_report(result, out_dir, slug="loda")
