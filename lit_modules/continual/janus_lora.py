"""Janus-LoRA: "JANUS-LoRA: A Balanced Low-Rank Adaptation for Continual Learning" (Chen, Zeng, Guo, Gao,
Shen & Song, ICML 2026, arXiv 2605.28495).

One LoRA (A, B) per target layer of a frozen pre-trained ViT, trained over the whole task sequence.
Stability: Online Estimation (OE) of an orthonormal basis V of the inputs old tasks used, and Gradient
Rectification (GR), a closed-form rewrite of every optimiser update so that the *composite* change
B'A' − BA is exactly zero on V. Plasticity: the Decoupled Margin Loss (DML) keeps current features away from
old-class prototypes.

RECONSTRUCTED: the paper's method section could not be read and its code is unreleased; what is certain
(abstract, project page) is one LoRA per layer, an orthonormal protected basis estimated without stored data
(the condition ΔW X_past = 0 with ΔW = B ΔA + ΔB A), a closed-form rewrite of (ΔA, ΔB) from a projected safe
update, and a prototype-based margin loss. Chosen here: GR's exact problem (default ``gr_mode="project"``: the
factor update nearest the optimiser's with both first-order terms orthogonal to V; ``"tangent"``:
least-squares realisation of the projected composite update on the tangent space of rank-r matrices), OE's
energy threshold (GPM's rule, "Gradient Projection Memory for Continual Learning", Saha et al., ICLR 2021),
the DML form, weight and margin. The CPU toy evaluates with NCM prototypes; the cosine head is still trained
with masked CE.

Algorithm, for t = 1..T:
    add classifier rows for C_t; every adapted layer: reset C_l, stats on       # OE is online
    for each batch (x, y) of task t:
        z = normalize(f(x))
        L = CE(s · cos(z, w)[C_t], y) + λ_dml · DML(z, y, prototypes)           # DML only if t > 1
        backward; snapshot (A0, B0); optimizer.step()
        if t > 1: (A, B) ← GR(A0, B0, A, B, V)                                  # exact for any optimiser
    stats off; V_l ← OE_expand(V_l, C_l, eps)                                    # GPM energy rule
    μ_c ← normalize(mean z) for c ∈ C_t                                          # prototype bank (NCM eval)

Ablations are switches: ``gr_enabled``, ``dml_enabled``, ``oe_source`` ("online" | "post"), and
``gr_enabled=false, project_A=true`` is LoRA-GPM (``litlab.lit_modules.continual.baselines.LoRAGPM``).

Where GR leaves the plasticity. Exact safety with one shared rank-r adapter is strong: once every row of A
reads the protected subspace (A V of full rank r, which a trained adapter reaches after task 1), the rank
directions where B may move are none (``janus/free_rank_dims`` = 0, logged per task), B is frozen, and A moves
only inside the complement of V. On the CPU toy (eps 0.99) that complement carries about 1 % of the input
energy: the features drift by ~2e-3 after task 1, so neither CE nor DML can change many NCM predictions
(DML's loss is non-zero and changes A, see tests/test_janus_lora.py, yet the ACC of OE+GR and OE+GR+DML
coincide on most seeds). DML on a plastic model (``gr_enabled=false``) does change the results.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from litlab.lit_modules.continual.baselines import LoRAGPM
from litlab.lit_modules.continual.contract import ContinualData
from litlab.lit_modules.continual.report import accuracy_matrix_report
from litlab.lit_modules.core.results import CardResult, ReportExtras

# ---- Gradient Rectification (GR), closed form (reconstructed) -------------------------------------------
GRMode = Literal["project", "tangent"]


def _read_directions(A0: Tensor, V: Tensor) -> Tensor:
    """P_M = U_keep U_keepᵀ (r × r) for the rank directions of the adapter that read V (M = A0 V).
    The tolerance is relative to ‖A0‖₂, not to max(S): with A0 V ≈ 0 a max(S)-relative test would keep
    every direction and freeze B entirely."""
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


def decoupled_margin_loss(
    z: Tensor, y: Tensor, old_prototypes: Tensor, head: Tensor, margin: float
) -> Tensor:
    """DML (reconstructed form): L = mean_i relu(max_{c old} cos(z_i, μ_c) − cos(z_i, ŵ_{y_i}) + m).

    Only old prototypes act as negatives and they are detached; the anchor is the true class's classifier
    row."""
    if old_prototypes.shape[0] == 0:
        return z.new_zeros(())
    nearest_old = (z @ old_prototypes.detach().T).max(-1).values
    anchor = (z * F.normalize(head[y], dim=-1)).sum(-1)
    return F.relu(nearest_old - anchor + margin).mean()


class JanusLoRA(LoRAGPM):
    """OE + GR + DML on one shared LoRA per layer; inherits the basis memory and OE from ``LoRAGPM``."""

    def __init__(
        self,
        gr_enabled: bool = True,
        gr_mode: Literal["project", "tangent"] = "project",
        gr_delta: float = 0.1,
        dml_enabled: bool = True,
        dml_weight: float = 1.0,
        dml_margin: float = 0.1,
        oe_eps: float = 0.99,
        oe_source: Literal["online", "post"] = "online",
        project_A: bool = False,
        **kwargs,
    ):
        super().__init__(oe_eps=oe_eps, oe_source=oe_source, project_A=project_A, **kwargs)
        if gr_mode not in ("project", "tangent"):
            raise ValueError(f"gr_mode must be 'project' or 'tangent', got {gr_mode!r}")
        if dml_weight < 0 or dml_margin < 0:
            raise ValueError(f"dml_weight and dml_margin must be >= 0, got {dml_weight}, {dml_margin}")
        self.rectifies_updates = gr_enabled
        self._free: dict[str, torch.Tensor] = {}  # I − P_M per layer, fixed within a task since A V is

    def on_task_start(self, t: int, dm: ContinualData) -> None:
        super().on_task_start(t, dm)
        self._free = {}

    def on_task_end(self, t: int, dm: ContinualData) -> dict[str, float]:
        """Also logs ``janus/free_rank_dims``: the mean over layers of the rank directions in which B could
        move during the task (trace(I − P_M); r on task 1). Once every row of A reads the protected subspace
        (A V of full rank r, which a trained shared adapter reaches after task 1), exact safety leaves B
        frozen and only A moves, inside the complement of V: the plasticity left to CE and DML alike."""
        free = [
            float(torch.trace(self._free[n])) if n in self._free else float(layer.branches["default"].rank)
            for n, layer in self.adapted.items()
        ]
        logs = super().on_task_end(t, dm)
        return {**logs, "janus/free_rank_dims": sum(free) / max(len(free), 1)}

    def cl_state(self) -> dict:
        return {**super().cl_state(), "free": self._free}

    def load_cl_state(self, state: dict) -> None:
        super().load_cl_state(state)
        self._free = dict(state.get("free", {}))

    # L = L_ce + λ_dml L_dml
    def loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        hp = self.hparams
        loss, logs = self.task_loss(x, y)
        z = logs.pop("z")
        if hp.dml_enabled and self.task > 0:
            old = self.proto_means[~self.class_mask[self.proto_labels]]  # prototypes of old classes only
            dml = decoupled_margin_loss(z, y, old, self.head, hp.dml_margin)
            loss = loss + hp.dml_weight * dml
            logs["loss_dml"] = dml.detach()
        return loss, logs

    # (A, B) ← GR(A0, B0, A, B, V) after every optimizer step of tasks t > 1
    def update_transform(self, module: str, branch_name: str, branch, old: dict, new: dict) -> dict:
        V = self.memories[module].V
        if V.shape[1] == 0:
            return {}
        if module not in self._free:
            self._free[module] = free_rank_directions(old["A"], V)
        A, B = rectify_update(
            old["A"],
            old["B"],
            new["A"],
            new["B"],
            V,
            self.hparams.gr_mode,
            self.hparams.gr_delta,
            free=self._free[module],
        )
        return {"A": A, "B": B}


# ---- repro report --------------------------------------------------------------------------------------
def report(result: CardResult, out_dir) -> ReportExtras:
    """``report_hook`` of seeds/janus_lora.yaml: the mean accuracy matrix of every run and a table of ACC /
    BWT / forgetting / MAA. Step times against plain LoRA: ``litlab bench continual_steps``."""
    return accuracy_matrix_report(result, out_dir, slug="janus_lora")
