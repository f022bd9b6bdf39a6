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
      2. α ← α + ρ k_α (q/min(m,n) − r*)  [+ ρ k_dα max(0, rate − prev_rate) after pd_after updates]
      3. S ← shrink_{β/ρ}(X − L + Y/ρ)    (hard_cut: β/ρ = the ⌊d*·mn⌋-th largest |·|, exact density d*)
      4. β ← β + ρ k_β (density − d*) [+ damping]   (adaptive β mode)
      5. ρ fixed
      6. Y ← Y + ρ (X − L − S)

Platform choices (reconstructed or simplified, spec §8): the penalty gradient is added to X's gradient in
``on_before_optimizer_step`` (before Lightning clips) — exactly the gradient of the coupled loss, so the method works
as a Callback on any LightningModule with automatic optimisation; thresholds are clamped at 0; ρ is a tuned
hyper-parameter (CPU default by the spec's §6 rule); every rank computes every block (no block ownership).

CPU defaults (spec §6): ρ = 2e-2, F = 10, k_α = 0.005, k_dα = 0, L₀ by SVD, r* = 0.15 (attention) / 0.35 (MLP),
hard-cut S with d* = 0.05. Negative examples from the spec's calibration (do not use): ρ = 1e-2 without the SVD
init and k_α = 0.02–0.05 overshoot the threshold (ranks collapse to 1–3, residual ≈ 1); ρ = 5e-2 with k_α = 0.01
collapses some attention blocks.

State (L, S, Y and the controller scalars of every block) is the callback's ``state_dict``: Lightning saves it in
every checkpoint (``checkpoint["callbacks"]["SALAAD"]``), a resumed run continues the same refresh schedule, and
``litlab export`` deploys from it.
"""

from __future__ import annotations

import re
import time
from typing import Literal

import lightning as L
import torch
from torch import nn

from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.structured.lm import BLOCKS, DecoderLM, find_blocks, short_name
from litlab.lit_modules.structured.sparse_lowrank import ENERGY, ADMMConfig, BlockADMM


class SALAAD(L.Callback):
    """SALAAD's ADMM schedule on the linear layers of any LightningModule (automatic optimisation, one optimizer).

    ``rate_rank`` r* for every block, except blocks whose name matches a key of ``rate_rank_by_name`` (first match):
    the spec's 0.15 attention / 0.35 MLP is ``rate_rank=0.15, rate_rank_by_name={"mlp": 0.35}``. ``components``:
    ``both`` (SALAAD), ``low_rank`` (S ≡ 0: a trained low-rank-only baseline) or ``sparse`` (L ≡ 0)."""

    def __init__(
        self,
        blocks: str = BLOCKS,
        rate_rank: float = 0.15,
        rate_rank_by_name: dict[str, float] | None = None,
        rate_sparsity: float = 0.05,
        rho: float = 2e-2,
        num_freq: int = 10,
        k_alpha: float = 0.005,
        k_beta: float = 0.002,
        k_dalpha: float = 0.0,
        k_dbeta: float = 0.0,
        pd_after: int = 1500,
        energy: float = ENERGY,
        alpha_mode: Literal["adaptive", "fixed"] = "adaptive",
        beta_mode: Literal["hard_cut", "adaptive", "fixed"] = "hard_cut",
        alpha0: float = 0.0,
        beta0: float = 0.0,
        gradient_mode: Literal["coupled", "decoupled"] = "coupled",
        init_L: Literal["svd", "zero"] = "svd",
        components: Literal["both", "low_rank", "sparse"] = "both",
        log_blocks: bool = True,
    ) -> None:
        if num_freq <= 0 or rho <= 0:
            raise ValueError(f"num_freq={num_freq} and rho={rho} must be positive")
        if gradient_mode not in ("coupled", "decoupled"):
            raise ValueError(f"gradient_mode={gradient_mode!r} must be 'coupled' or 'decoupled'")
        if not 0.0 <= rate_sparsity <= 1.0 or not 0.0 <= rate_rank <= 1.0:
            raise ValueError(f"rate_rank={rate_rank} and rate_sparsity={rate_sparsity} must lie in [0, 1]")
        self.pattern, self.num_freq, self.gradient_mode, self.init_L = blocks, num_freq, gradient_mode, init_L
        self.rate_rank_by_name = dict(rate_rank_by_name or {})
        self.log_blocks = log_blocks
        self.base = ADMMConfig(
            rate_rank=rate_rank, rate_sparsity=rate_sparsity, rho=rho, k_alpha=k_alpha, k_beta=k_beta,
            k_dalpha=k_dalpha, k_dbeta=k_dbeta, pd_after=pd_after, energy=energy, alpha_mode=alpha_mode,
            beta_mode=beta_mode, components=components, alpha0=alpha0, beta0=beta0,
        )  # fmt: skip
        self.modules: dict[str, nn.Linear] = {}
        self.state: dict[str, BlockADMM] = {}
        self._pending: dict | None = None
        self._correction: dict[str, tuple[float, torch.Tensor]] = {}
        self.cpu_s = 0.0  # process time spent in this callback (the method's overhead over a dense step)

    @property
    def state_key(self) -> str:
        return "SALAAD"

    def block_config(self, name: str) -> ADMMConfig:
        for key, rate in self.rate_rank_by_name.items():
            if re.search(key, name):
                return ADMMConfig(**{**self.base.__dict__, "rate_rank": rate})
        return self.base

    # ---- set-up and checkpointed state ------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.state:
            return
        self.attach(pl_module)

    def attach(self, module: nn.Module) -> None:
        """Find the blocks and build their state (§3.3), then apply a state loaded before the blocks existed."""
        self.modules = find_blocks(module, self.pattern)
        for name, lin in self.modules.items():
            block = BlockADMM(tuple(lin.weight.shape), self.block_config(name), device=lin.weight.device)
            if self.init_L == "svd":
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
                if self.gradient_mode == "coupled":  # ∇(ℓ + penalty), before gradient clipping
                    if W.grad is None:
                        W.grad = g.to(W.dtype)
                    else:
                        W.grad.add_(g.to(W.grad.dtype))
                else:  # decoupled: applied after the step, from the pre-step X
                    self._correction[name] = (lr_of[id(W)], g)
        self.cpu_s += time.process_time() - t0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        t0 = time.process_time()
        with torch.no_grad():
            for name, (lr, g) in self._correction.items():  # decoupled: X ← X − η_t ρ(X_pre − L − S + Y/ρ)
                W = self.modules[name].weight
                W.sub_((lr * g).to(W.dtype))
            self._correction.clear()
            step = trainer.global_step
            if step > 0 and step % self.num_freq == 0:  # one ADMM / controller iteration every F steps (§3.5)
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
        if self.log_blocks:
            for name, b in blocks.items():
                s = short_name(name)
                metrics[f"salaad/rank/{s}"] = b.rate
                metrics[f"salaad/density/{s}"] = b.density
                metrics[f"salaad/residual/{s}"] = b.residual
                metrics[f"salaad/tau_L/{s}"] = b.tau_L
        pl_module.log_dict(metrics, on_step=True, on_epoch=False)


@config_part
class SALAADSetup:
    """SALAAD's settings as one typed group (``model.init_args.salaad.<field>``), the arguments of ``SALAAD``.
    ``components="none"`` trains the plain dense model (no ADMM: the baseline). CPU defaults of spec §6.

    Settings that collapse the ranks (spec §6 calibration, kept out of the defaults): ``rho=1e-2`` with
    ``init_L="zero"``, or ``k_alpha`` 0.02-0.05, overshoot the controller threshold and drive ranks to 1-3;
    ``rho=5e-2`` with ``k_alpha=0.01`` collapses some attention blocks. ``sweeps/salaad.yaml`` spans ρ and k_α
    around the defaults."""

    components: Literal["both", "low_rank", "sparse", "none"] = "both"
    blocks: str = BLOCKS
    rate_rank: float = 0.15
    rate_rank_by_name: dict[str, float] | None = None
    rate_sparsity: float = 0.05
    rho: float = 2e-2
    num_freq: int = 10
    k_alpha: float = 0.005
    k_beta: float = 0.002
    k_dalpha: float = 0.0
    k_dbeta: float = 0.0
    pd_after: int = 1500
    energy: float = ENERGY
    alpha_mode: Literal["adaptive", "fixed"] = "adaptive"
    beta_mode: Literal["hard_cut", "adaptive", "fixed"] = "hard_cut"
    alpha0: float = 0.0
    beta0: float = 0.0
    gradient_mode: Literal["coupled", "decoupled"] = "coupled"
    init_L: Literal["svd", "zero"] = "svd"
    log_blocks: bool = True


SETUP = SALAADSetup()


class SALAADLM(DecoderLM):
    """``DecoderLM`` trained under SALAAD: the module hands Lightning a ``SALAAD`` callback built from its
    ``salaad`` group (``configure_callbacks``), so the method's settings are part of the model's config (and of the
    run's identity) while the ADMM itself stays a Callback that any LightningModule can use directly."""

    def __init__(self, *args, salaad: SALAADSetup = SETUP, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.salaad = SALAADSetup(**salaad) if isinstance(salaad, dict) else salaad
        if self.salaad.components != "none":
            self.salaad_callback()  # check the settings at construction

    def salaad_callback(self) -> SALAAD:
        fields = {k: v for k, v in self.salaad.__dict__.items()}
        return SALAAD(**fields)

    def configure_callbacks(self):
        return [] if self.salaad.components == "none" else [self.salaad_callback()]
