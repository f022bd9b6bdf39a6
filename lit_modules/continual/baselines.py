"""The continual baselines, built from the same harness as the methods (``harness.SequentialLoRA``).

* ``LoRAGPM``  one LoRA per layer with online input bases V_l grown by the energy rule of GPM ("Gradient
               Projection Memory for Continual Learning", Saha, Garg & Roy, ICLR 2021) and the naive rule
               G_A ← G_A (I − V Vᵀ), B free: the LoRA-GPM baseline of the Janus-LoRA paper (arXiv 2605.28495).
* ``InfLoRA``  after "InfLoRA: Interference-Free Low-Rank Adaptation for Continual Learning" (Liang & Li,
               CVPR 2024): per task, A = top eigenvectors of P M_cur P (P the complement of the GPM basis),
               frozen; B trained from 0; folded into W₀ at the task end.
* ``OLoRA``    after O-LoRA, "Orthogonal Subspace Learning for Language Model Continual Learning" (Wang et
               al., EMNLP Findings 2023): a fresh LoRA per task with the penalty Σ|A_old A_tᵀ|, folded in.

These are "-style" re-implementations on the project's protocol (one cosine head, NCM evaluation on the CPU
toy), not the authors' code.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from litlab.lit_modules.continual.contract import ContinualData
from litlab.lit_modules.continual.harness import SequentialLoRA
from litlab.lit_modules.continual.subspace import SubspaceMemory, top_eigvecs, violation_ratio
from litlab.lit_modules.core.adapters import AdapterLinear, transform_adapter_grads


def _delta64(layer: AdapterLinear) -> Tensor:
    """Σ_k s_k B_k A_k in float64 (the core's delta_weight rounds to the base weight's dtype)."""
    return sum(b.delta_weight().detach().double() for b in layer.branches.values())


class LoRAGPM(SequentialLoRA):
    """Online input bases V_l (GPM energy rule) and the naive rule G_A ← G_A (I − V Vᵀ), B free.

    Also the bookkeeping Janus-LoRA builds on: the basis memory per layer, its online (or post-hoc)
    estimation, and the null-space violation ν_l = ‖ΔW_task V_l‖ / ‖ΔW_task‖: ``cl/violation_task`` is the max
    over layers for the task that just ended, ``cl/violation_max`` the max over layers and all tasks so far."""

    def __init__(
        self,
        oe_eps: float = 0.99,
        oe_source: Literal["online", "post"] = "online",
        project_A: bool = True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if oe_source not in ("online", "post"):
            raise ValueError(f"oe_source must be 'online' or 'post', got {oe_source!r}")
        self.memories: dict[str, SubspaceMemory] = {}
        self._w_start: dict[str, Tensor] = {}
        self._violation_max = 0.0  # max over the tasks so far (and layers) of ν_l

    def build(self, dm: ContinualData) -> None:
        super().build(dm)
        self.memories = {n: SubspaceMemory(m.in_features) for n, m in self.adapted.items()}

    def on_task_start(self, t: int, dm: ContinualData) -> None:
        super().on_task_start(t, dm)
        self.set_stats("accumulate" if self.hparams.oe_source == "online" else "off", reset=True)
        self._w_start = {n: _delta64(m) for n, m in self.adapted.items()}

    def transform_grads(self) -> None:
        if self.hparams.project_A:
            transform_adapter_grads(
                self.adapted,
                lambda mn, bn, b, g: {"A": self.memories[mn].project_out(g["A"])} if "A" in g else {},
            )

    def on_task_end(self, t: int, dm: ContinualData) -> dict[str, float]:
        self.set_stats("off")
        task_worst = max(
            (
                violation_ratio(_delta64(m) - self._w_start.get(n, 0), self.memories[n].V)
                for n, m in self.adapted.items()
            ),
            default=0.0,
        )
        # the witness is the max over layers AND tasks: the last logged value of a run covers its whole sequence
        self._violation_max = max(self._violation_max, task_worst)
        logs = {"cl/violation_task": task_worst, "cl/violation_max": self._violation_max}
        stats = (
            self.collect_stats(dm.task_train_loader(t))
            if self.hparams.oe_source == "post"
            else {n: m.input_second_moment for n, m in self.adapted.items()}
        )
        for n, C in stats.items():
            self.memories[n].expand(C, self.hparams.oe_eps)
        logs["cl/basis_dim_mean"] = sum(mem.k for mem in self.memories.values()) / len(self.memories)
        return {**super().on_task_end(t, dm), **logs}

    def cl_state(self) -> dict:
        return {
            **super().cl_state(),
            "memories": {n: m.state() for n, m in self.memories.items()},
            "w_start": self._w_start,
            "violation_max": self._violation_max,
        }

    def load_cl_state(self, state: dict) -> None:
        super().load_cl_state(state)
        for n, s in state["memories"].items():
            self.memories[n].load(s)
        self._w_start = dict(state.get("w_start", {}))
        self._violation_max = float(state.get("violation_max", 0.0))


class InfLoRA(SequentialLoRA):
    """InfLoRA-style (Liang & Li, CVPR 2024): per task, A = top-r eigenvectors of P M_cur P (P the complement
    of the GPM basis of old inputs), frozen; B trained from 0; folded into W₀ at the task end; basis grown on
    the merged model's inputs of the task (energy threshold ``gpm_eps``)."""

    def __init__(self, gpm_eps: float = 0.99, **kwargs):
        super().__init__(**kwargs)
        self.memories: dict[str, SubspaceMemory] = {}

    def build(self, dm: ContinualData) -> None:
        super().build(dm)
        self.memories = {n: SubspaceMemory(m.in_features) for n, m in self.adapted.items()}

    def on_task_start(self, t: int, dm: ContinualData) -> None:
        super().on_task_start(t, dm)
        M_cur = self.collect_stats(dm.task_train_loader(t))
        with torch.no_grad():
            for n, layer in self.adapted.items():
                P = (
                    torch.eye(layer.in_features, dtype=torch.float64)
                    - self.memories[n].V @ self.memories[n].V.T
                )
                b = layer.branches["default"]
                U = top_eigvecs(P @ M_cur[n] @ P, b.rank)[1]
                b.A.copy_(U.T.to(b.A))
                b.B.zero_()

    def transform_grads(self) -> None:
        transform_adapter_grads(self.adapted, lambda mn, bn, b, g: {"A": None})  # down-projections stay fixed

    def on_task_end(self, t: int, dm: ContinualData) -> dict[str, float]:
        for layer in self.adapted.values():
            layer.fold_in("default")
        for n, C in self.collect_stats(dm.task_train_loader(t)).items():
            self.memories[n].expand(C, self.hparams.gpm_eps)
        return super().on_task_end(t, dm)

    def cl_state(self) -> dict:
        return {**super().cl_state(), "memories": {n: m.state() for n, m in self.memories.items()}}

    def load_cl_state(self, state: dict) -> None:
        super().load_cl_state(state)
        for n, s in state["memories"].items():
            self.memories[n].load(s)


class OLoRA(SequentialLoRA):
    """O-LoRA-style (Wang et al., EMNLP Findings 2023): a fresh LoRA per task, L = CE + λ Σ_l Σ_old
    |A_old A_tᵀ| (orthogonal to the old tasks' down-projections), the finished task folded into W₀ and its A
    kept for the penalty."""

    def __init__(self, orth_lambda: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.past_A: dict[str, Tensor] = {}

    def on_task_start(self, t: int, dm: ContinualData) -> None:
        super().on_task_start(t, dm)
        if t > 0:
            with torch.no_grad():
                for layer in self.adapted.values():
                    b = layer.branches["default"]
                    nn.init.kaiming_uniform_(b.A, a=math.sqrt(5))
                    b.B.zero_()

    def loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        loss, logs = super().loss(x, y)
        if self.past_A:
            orth = sum(
                (self.past_A[n].to(m.branches["default"].A) @ m.branches["default"].A.T).abs().sum()
                for n, m in self.adapted.items()
            )
            loss = loss + self.hparams.orth_lambda * orth
            logs["loss_orth"] = orth.detach()
        return loss, logs

    def on_task_end(self, t: int, dm: ContinualData) -> dict[str, float]:
        for n, layer in self.adapted.items():
            A = layer.branches["default"].A.detach().clone()
            self.past_A[n] = A if n not in self.past_A else torch.cat([self.past_A[n], A])
            layer.fold_in("default")
        return super().on_task_end(t, dm)

    def cl_state(self) -> dict:
        return {**super().cl_state(), "past_A": self.past_A}

    def load_cl_state(self, state: dict) -> None:
        super().load_cl_state(state)
        self.past_A = dict(state["past_A"])
