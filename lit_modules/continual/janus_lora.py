"""Janus-LoRA — a balanced low-rank adaptation for continual learning (ICML 2026). Spec: shared/methods/janus_lora.md.

One LoRA (A, B) per target layer of a frozen pre-trained ViT, trained over the whole task sequence.
Stability: Online Estimation (OE) of an orthonormal basis V of the inputs old tasks used, and Gradient
Rectification (GR), a closed-form rewrite of every optimiser update so that the *composite* change
B'A' − BA is exactly zero on V. Plasticity: the Decoupled Margin Loss (DML) keeps current features away from
old-class prototypes.

RECONSTRUCTED (janus_lora.md §2, §8): the method section was not reachable and the code is unreleased. GR's
exact problem (default ``gr_mode="project"``: the factor update nearest the optimiser's with both first-order
terms orthogonal to V; ``"tangent"``: least-squares realisation of the projected composite update), OE's
energy threshold, the DML form, weight and margin are the spec's reconstruction. The CPU toy evaluates with NCM
prototypes (the spec's §6); the cosine head is still trained with masked CE.

Algorithm (§3.2), for t = 1..T:
    add classifier rows for C_t; every adapted layer: reset C_l, stats on           # OE is online (§3.3)
    for each batch (x, y) of task t:
        z = normalize(f(x))
        L = CE(s · cos(z, w)[C_t], y) + λ_dml · DML(z, y, prototypes)               # (§3.5), DML only if t > 1
        backward; snapshot (A0, B0); optimizer.step()
        if t > 1: (A, B) ← GR(A0, B0, A, B, V)                                      # (§3.4), exact for any optimiser
    stats off; V_l ← OE_expand(V_l, C_l, eps)                                        # GPM energy rule
    μ_c ← normalize(mean z) for c ∈ C_t                                              # prototype bank (NCM eval)

Ablations are switches: ``gr_enabled``, ``dml_enabled``, ``oe_source`` ("online" | "post"), and
``gr_enabled=false, project_A=true`` is LoRA-GPM (``litlab.lit_modules.continual.harness.LoRAGPM``).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from litlab.lit_modules.continual.harness import LoRAGPM
from litlab.lit_modules.continual.subspace import free_rank_directions, rectify_update
from torch import Tensor


def decoupled_margin_loss(
    z: Tensor, y: Tensor, old_prototypes: Tensor, head: Tensor, margin: float
) -> Tensor:
    """(§3.5) L = mean_i relu(max_{c old} cos(z_i, μ_c) − cos(z_i, ŵ_{y_i}) + m).

    Only old prototypes act as negatives and they are detached; the anchor is the true class's classifier row."""
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

    def on_task_start(self, t: int, dm) -> None:
        super().on_task_start(t, dm)
        self._free = {}

    def cl_state(self) -> dict:
        return {**super().cl_state(), "free": self._free}

    def load_cl_state(self, state: dict) -> None:
        super().load_cl_state(state)
        self._free = dict(state.get("free", {}))

    # L = L_ce + λ_dml L_dml  (§3.2)
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

    # (A, B) ← GR(A0, B0, A, B, V) after every optimizer step of tasks t > 1  (§3.4)
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


# ---- repro report: heatmaps of the accuracy matrices and the step-time overhead -----------------------------
def report(res: dict, out_dir) -> dict:
    """``report_hook`` of seeds/janus_lora.yaml: mean accuracy matrix per run, and time per training step of
    each method relative to plain LoRA, measured interleaved in this process on the quick model."""
    from litlab.callbacks.continual import accuracy_matrix_report

    return accuracy_matrix_report(res, out_dir, slug="janus_lora", timed=_timed_modules())


def _timed_modules() -> dict:
    from litlab.lit_modules.continual.harness import InfLoRA, LoRAGPM, OLoRA, SequentialLoRA

    return {
        "lora": SequentialLoRA(),
        "janus_lora": JanusLoRA(),
        "janus_lora_tangent": JanusLoRA(gr_mode="tangent"),
        "lora_gpm": LoRAGPM(),
        "inflora": InfLoRA(),
        "olora": OLoRA(),
    }
