"""SALAAD — "SALAAD: Sparse And Low-Rank Adaptation via ADMM for Large Language Model Inference" (ICML 2026,
arXiv 2602.00942; Ma, Bal, Zhang, Li, He, Zeilinger, Muehlebach).

Train the dense model as usual while coupling every selected weight matrix X_i to a structured surrogate L_i + S_i
(L low-rank, S sparse) by an augmented Lagrangian; refresh L, S and the dual Y in closed form every F steps, with an
integral controller per block that moves each threshold until the block's rank ratio / density tracks its target.
After training, one run deploys at any parameter budget (Homomorphic Parameter Allocation, ``sparse_lowrank``).

Algorithm (the paper's method section could not be read; this follows the official implementation, spec §3):

    problem (§3.1)      min ℓ(X) + Σ_i α_i‖L_i‖_* + β_i‖S_i‖_1   s.t.  X_i = L_i + S_i
    init (§3.3)         L₀ = rank-⌊r*·min(m,n)⌋ truncated SVD of X₀ (``init_L="svd"``) or 0; S₀ = Y₀ = 0
    every step (§3.4)   coupled:   ∇X ← ∇ℓ(X) + ρ(X − L − S + Y/ρ)          (= autograd of ρ/2‖X − L − S + Y/ρ‖²)
                        decoupled: after the optimizer step, X ← X − η_t ρ(X_pre − L − S + Y/ρ)
    every F steps (§3.5, code order)
      1. L ← SVT_{α/ρ}(X − S + Y/ρ);  q = min{k : Σ_{j≤k} σ̃_j² ≥ e Σ σ̃²}
      2. α ← α + ρ k_α (q/min(m,n) − r*)  [+ ρ k_dα max(0, rate − prev_rate) from update pd_after on]
      3. S ← shrink_{β/ρ}(X − L + Y/ρ)    (hard_cut: β/ρ = the ⌊d*·mn⌋-th largest |·|, exact density d*)
      4. β ← β + ρ k_β (density − d*) [+ damping]   (adaptive β mode)
      5. ρ fixed
      6. Y ← Y + ρ (X − L − S)

Platform choices (reconstructed or simplified, spec §8): the penalty gradient is added to X's gradient in
``on_before_optimizer_step`` (before Lightning clips) — exactly the gradient of the coupled loss, so the method works
as a Callback on any LightningModule with automatic optimisation; F counts optimiser steps, so gradient accumulation
does not repeat the refresh; thresholds are clamped at 0 by default (``ADMMConfig.clamp_thresholds``; the official
code does not clamp); ρ is a tuned hyper-parameter (CPU default by the spec's §6 rule); every rank computes every
block (no block ownership).

CPU defaults (spec §6): ρ = 2e-2, F = 10, k_α = 0.005, k_dα = 0, L₀ by SVD, r* = 0.15 (attention) / 0.35 (MLP),
hard-cut S with d* = 0.05. Negative examples from the spec's calibration (do not use): ρ = 1e-2 without the SVD
init and k_α = 0.02–0.05 overshoot the threshold (ranks collapse to 1–3, residual ≈ 1); ρ = 5e-2 with k_α = 0.01
collapses some attention blocks.

State (L, S, Y and the controller scalars of every block) is the callback's ``state_dict``: Lightning saves it in
every checkpoint (``checkpoint["callbacks"]["SALAAD"]``), a resumed run continues the same refresh schedule, and
``litlab export`` deploys from it.
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Literal

import lightning as L
import torch
from torch import nn

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.structured.adhoc import AdHocConfig, AdHocStructure
from litlab.lit_modules.structured.lm import (
    BLOCKS,
    NET,
    OPTIM,
    AdamWSchedule,
    DecoderLM,
    DecoderShape,
    find_blocks,
    short_name,
)
from litlab.lit_modules.structured.sparse_lowrank import ADMMConfig, BlockADMM


@config_part
class SALAADSchedule:
    """Where and when SALAAD couples (its per-block maths is ``ADMMConfig``): the linear layers whose names match
    ``blocks``; ``rate_rank_by_name`` r* for blocks whose name matches a key (first match), ``ADMMConfig.rate_rank``
    for the others (the spec's 0.15 attention / 0.35 MLP: ``rate_rank=0.15`` and ``{"mlp": 0.35}``); one ADMM /
    controller refresh every ``num_freq`` steps (F); the penalty's gradient ``coupled`` into X's gradient or
    ``decoupled`` (applied after the step); L₀ by ``svd`` of X₀ or ``zero``; per-block metrics when ``log_blocks``."""

    blocks: str = BLOCKS
    rate_rank_by_name: dict[str, float] | None = None
    num_freq: int = 10
    gradient_mode: Literal["coupled", "decoupled"] = "coupled"
    init_L: Literal["svd", "zero"] = "svd"
    log_blocks: bool = True

    def __post_init__(self) -> None:
        if self.num_freq <= 0:
            raise ValueError(f"num_freq={self.num_freq} must be positive")
        if self.gradient_mode not in ("coupled", "decoupled"):
            raise ValueError(f"gradient_mode={self.gradient_mode!r} must be 'coupled' or 'decoupled'")
        if self.init_L not in ("svd", "zero"):
            raise ValueError(f"init_L={self.init_L!r} must be 'svd' or 'zero'")


ADMM, SCHEDULE = ADMMConfig(), SALAADSchedule()  # the spec's CPU defaults (§6)


class SALAAD(L.Callback):
    """SALAAD's ADMM schedule on the linear layers of any LightningModule (automatic optimisation, one optimizer):
    ``admm`` is every block's ADMM and controller settings, ``schedule`` which blocks and how often."""

    def __init__(self, admm: ADMMConfig = ADMM, schedule: SALAADSchedule = SCHEDULE) -> None:
        self.admm = as_config(ADMMConfig, admm, "SALAAD admm")
        self.schedule = as_config(SALAADSchedule, schedule, "SALAAD schedule")
        self.modules: dict[str, nn.Linear] = {}
        self.state: dict[str, BlockADMM] = {}
        self._pending: dict | None = None
        self._correction: dict[str, tuple[float, torch.Tensor]] = {}
        self._step_at_batch_start = -1  # the optimiser steps done when the current (micro-)batch began
        self.cpu_s = 0.0  # process time spent in this callback (the method's overhead over a dense step)

    @property
    def state_key(self) -> str:
        return "SALAAD"

    def block_config(self, name: str) -> ADMMConfig:
        for key, rate in (self.schedule.rate_rank_by_name or {}).items():
            if re.search(key, name):
                return dataclasses.replace(self.admm, rate_rank=rate)
        return self.admm

    # ---- set-up and checkpointed state ------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.state:
            return
        self.attach(pl_module)

    def attach(self, module: nn.Module) -> None:
        """Find the blocks and build their state (§3.3), then apply a state loaded before the blocks existed."""
        self.modules = find_blocks(module, self.schedule.blocks)
        for name, lin in self.modules.items():
            block = BlockADMM(tuple(lin.weight.shape), self.block_config(name), device=lin.weight.device)
            if self.schedule.init_L == "svd":
                block.init_low_rank(lin.weight)
            self.state[name] = block
        if self._pending is not None:
            self.load_state_dict(self._pending)

    def on_train_start(self, trainer, pl_module) -> None:
        for name, b in self.state.items():  # the Trainer moved the model after setup: the state follows it
            device = self.modules[name].weight.device
            b.L, b.S, b.Y = b.L.to(device), b.S.to(device), b.Y.to(device)

    def state_dict(self) -> dict:
        return {"blocks": {name: b.state_dict() for name, b in self.state.items()}}

    def load_state_dict(self, state_dict: dict) -> None:
        if not self.state:  # restored before setup: keep it until the blocks exist
            self._pending = state_dict
            return
        missing = set(self.state) ^ set(state_dict["blocks"])
        if missing:
            raise ValueError(f"SALAAD checkpoint state does not match the model's blocks: {sorted(missing)}")
        for name, b in self.state.items():
            b.load_state_dict(state_dict["blocks"][name])
        self._pending = None

    def structured_blocks(self) -> dict[str, tuple[nn.Linear, torch.Tensor, torch.Tensor]]:
        """name -> (layer, L, S): what ``CapacitySweep`` and ``litlab export`` deploy."""
        return {n: (self.modules[n], b.L, b.S) for n, b in self.state.items()}

    # ---- every step: the coupling (§3.4) ----------------------------------------------------------------------
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        t0 = time.process_time()
        lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
        with torch.no_grad():
            for name, lin in self.modules.items():
                W = lin.weight
                g = self.state[name].penalty_grad(W.detach().float())  # ρ(X − L − S + Y/ρ)
                if self.schedule.gradient_mode == "coupled":  # ∇(ℓ + penalty), before gradient clipping
                    if W.grad is None:
                        W.grad = g.to(W.dtype)
                    else:
                        W.grad.add_(g.to(W.grad.dtype))
                else:  # decoupled: applied after the step, from the pre-step X
                    self._correction[name] = (lr_of[id(W)], g)
        self.cpu_s += time.process_time() - t0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        t0 = time.process_time()
        with torch.no_grad():
            for name, (lr, g) in self._correction.items():  # decoupled: X ← X − η_t ρ(X_pre − L − S + Y/ρ)
                W = self.modules[name].weight
                W.sub_((lr * g).to(W.dtype))
            self._correction.clear()
            step = trainer.global_step
            # One ADMM / controller iteration after every F-th optimiser step (§3.5; the official trainer's
            # ``num_it % num_freq == 0``). This hook runs after every micro-batch: under gradient accumulation the
            # step counter stays the same for the micro-batches that did not step, which must not repeat it.
            stepped = step != self._step_at_batch_start
            if stepped and step % self.schedule.num_freq == 0:
                for name, lin in self.modules.items():
                    self.state[name].update(lin.weight)
                self._log(pl_module)
        self.cpu_s += time.process_time() - t0

    def _log(self, pl_module: L.LightningModule) -> None:
        blocks = self.state
        residuals = torch.tensor([b.residual for b in blocks.values()])
        metrics = {
            "salaad/residual_median": float(residuals.median()),
            "salaad/residual_max": float(residuals.max()),
            "salaad/rank_ratio_mean": sum(b.rate for b in blocks.values()) / len(blocks),
            "salaad/density_mean": sum(b.density for b in blocks.values()) / len(blocks),
            "salaad/penalty": float(
                sum(b.penalty(self.modules[n].weight.detach().float()) for n, b in blocks.items())
            ),
            "salaad/updates": float(next(iter(blocks.values())).count),
            "salaad/cpu_s": self.cpu_s,
        }
        if self.schedule.log_blocks:
            for name, b in blocks.items():
                s = short_name(name)
                metrics[f"salaad/rank/{s}"] = b.rate
                metrics[f"salaad/density/{s}"] = b.density
                metrics[f"salaad/residual/{s}"] = b.residual
                metrics[f"salaad/tau_L/{s}"] = b.tau_L
        pl_module.log_dict(metrics, on_step=True, on_epoch=False)


class SALAADLM(DecoderLM):
    """``DecoderLM`` trained under SALAAD: the module hands Lightning a ``SALAAD`` callback built from its ``admm``
    and ``schedule`` groups (``configure_callbacks``), so the method's settings are part of the model's config (and
    of the run's identity) while the ADMM itself stays a Callback that any LightningModule can use directly.
    ``admm=None`` trains the plain dense model (no ADMM: the card's dense baseline); ``admm=None`` with ``adhoc``
    set trains the ad-hoc baseline for one budget instead (``adhoc.AdHocStructure``: projected gradient descent onto
    a rank or sparsity constraint).

    Settings that collapse the ranks (spec §6 calibration, kept out of the defaults): ``rho=1e-2`` with
    ``init_L="zero"``, or ``k_alpha`` 0.02-0.05, overshoot the controller threshold and drive ranks to 1-3;
    ``rho=5e-2`` with ``k_alpha=0.01`` collapses some attention blocks. ``sweeps/salaad.yaml`` spans ρ and k_α
    around the defaults."""

    def __init__(
        self,
        net: DecoderShape = NET,
        optim: AdamWSchedule = OPTIM,
        admm: ADMMConfig | None = ADMM,
        schedule: SALAADSchedule = SCHEDULE,
        adhoc: AdHocConfig | None = None,
    ) -> None:
        super().__init__(net=net, optim=optim)
        if admm is not None and adhoc is not None:
            raise ValueError(
                f"admm={admm} and adhoc={adhoc} are both set: a run trains SALAAD (admm) or an ad-hoc baseline "
                "(adhoc, with admm: null), not both"
            )
        self.admm = None if admm is None else as_config(ADMMConfig, admm, "admm")
        self.schedule = as_config(SALAADSchedule, schedule, "schedule")
        self.adhoc = None if adhoc is None else as_config(AdHocConfig, adhoc, "adhoc")

    def salaad_callback(self) -> SALAAD:
        if self.admm is None:
            raise ValueError("admm=None trains the dense model: there is no SALAAD callback")
        return SALAAD(self.admm, self.schedule)

    def configure_callbacks(self):
        if self.adhoc is not None:
            return [AdHocStructure(self.adhoc, self.schedule.blocks)]
        return [] if self.admm is None else [self.salaad_callback()]
