"""LoRDO as a Lightning strategy: DDP, low-rank DDP (GaLore), DiLoCo and LoRDO behind one byte ledger.

LoRDO: "LoRDO: Distributed Low-Rank Optimization with Infrequent Communication" (Jovanović et al., arXiv
2602.04396; only its abstract and introduction could be read); DiLoCo: Douillard et al., arXiv 2311.08105;
GaLore: Zhao et al., arXiv 2403.03507.

    mode          per step                                  every K steps (sync_every)
    ddp           all-reduce mean of the gradient (b·P)     —
    lowrank_ddp   same; the optimizer refreshes its         —
                  projectors from the averaged gradient
    diloco        nothing                                   Δ = mean(θ̄ − θᵐ); outer step (average/Nesterov)
    lordo         nothing                                   Δ as DiLoCo; average u, v, m, v (and E);
                                                            Q ← top-r SVD of Δ (same on every rank)

The model is never wrapped in ``DistributedDataParallel``: every collective is issued here, through
``_all_reduce_mean``, so the ledger counts all training traffic (metric logging is not counted). Ranks start
from rank 0's parameters and buffers (broadcast in ``configure_ddp``). Between syncs the ranks hold different
θᵐ, so validate and checkpoint at multiples of K. The strategy's own state (anchor θ̄, step counters, ledger,
outer momentum) travels in the checkpoint under ``"lowcomm"`` (``save_checkpoint`` / ``load_checkpoint``).
What it needs from the optimizer in mode ``"lordo"`` is ``litlab.lit_modules.lowcomm.contract
.LowRankSyncOptimizer``, checked once in ``setup``.
Reconstructed (the paper's exact rules could not be read): the outer rule (chosen: plain averaging by default),
which states are synced (chosen: all Adam moments and the error feedback), the QH normaliser (chosen: the mean
low-rank Adam denominator); ``warmup_ddp_steps`` runs DDP with the same local optimizer (not a separate AdamW).
Works unchanged on CPU/gloo, GPU/NCCL, one or many nodes (Lightning's cluster environments set the ranks).
The few Lightning internals it relies on, where no public hook exists, sit together at the end of this file.
"""

from __future__ import annotations

import io
import threading
from typing import Any, Literal

import torch
import torch.distributed as dist
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.nn.utils import parameters_to_vector

from litlab.lit_modules.lowcomm.contract import LowRankSyncOptimizer, check_sync_optimizer

Mode = Literal["ddp", "lowrank_ddp", "diloco", "lordo"]
LOCAL_MODES = ("diloco", "lordo")


class CommLedger:
    """Payload bytes per worker of every collective, by tag; ring all-reduce wire bytes = payload·2(M−1)/M."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self.calls: dict[str, int] = {}

    def add(self, tag: str, tensor: Tensor) -> None:
        self.bytes[tag] = self.bytes.get(tag, 0) + tensor.numel() * tensor.element_size()
        self.calls[tag] = self.calls.get(tag, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.bytes.values())

    def state_dict(self) -> dict[str, Any]:
        return {"bytes": dict(self.bytes), "calls": dict(self.calls)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bytes, self.calls = dict(state["bytes"]), dict(state["calls"])


class LoRDOStrategy(DDPStrategy):
    strategy_name = "lordo"

    def __init__(
        self,
        mode: Mode = "lordo",
        sync_every: int = 8,
        outer: Literal["average", "nesterov"] = "average",
        outer_lr: float = 0.7,
        outer_momentum: float = 0.9,
        sync_states: bool = True,
        sync_error_feedback: bool = True,
        projector_source: Literal["pseudo_grad", "local_pseudo_grad"] = "pseudo_grad",
        rotate_moments: bool = True,
        broadcast_projector: bool = False,
        warmup_ddp_steps: int = 0,
        process_group_backend: str | None = None,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
    ) -> None:
        """``start_method="spawn"`` for tests and in-process runs (``litlab repro``); under SLURM or torchrun the
        processes exist already and it is ignored. ``projector_source="local_pseudo_grad"`` is the local-projector
        ablation: each worker's Q from its own Δᵐ (no agreement across workers)."""
        super().__init__(process_group_backend=process_group_backend, start_method=start_method)
        if mode not in ("ddp", "lowrank_ddp", "diloco", "lordo"):
            raise ValueError(f"mode={mode!r} must be one of 'ddp', 'lowrank_ddp', 'diloco', 'lordo'")
        if sync_every < 1:
            raise ValueError(f"sync_every={sync_every} must be >= 1")
        if outer not in ("average", "nesterov"):
            raise ValueError(f"outer={outer!r} must be 'average' or 'nesterov'")
        if projector_source not in ("pseudo_grad", "local_pseudo_grad"):
            raise ValueError(
                f"projector_source={projector_source!r} must be 'pseudo_grad' or 'local_pseudo_grad'"
            )
        if warmup_ddp_steps < 0:
            raise ValueError(f"warmup_ddp_steps={warmup_ddp_steps} must be >= 0")
        self.mode, self.sync_every, self.outer = mode, sync_every, outer
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.sync_states, self.sync_error_feedback = sync_states, sync_error_feedback
        self.projector_source, self.rotate_moments = projector_source, rotate_moments
        self.broadcast_projector, self.warmup_ddp_steps = broadcast_projector, warmup_ddp_steps
        self.ledger = CommLedger()
        self.inner_step = 0  # optimizer steps taken (all modes)
        self.num_syncs = 0
        self.similarities: list[float] = []  # mean subspace similarity at each projector refresh
        self._anchor: Tensor | None = None  # θ̄, fp32 flat
        self._outer_buf: Tensor | None = None  # Nesterov momentum
        self._pending_state: dict[str, Any] | None = None
        self._rank_module_state: dict[str, Tensor] | None = (
            None  # this rank's own θ from a resumed checkpoint
        )

    # ---- set-up: no DDP wrapper ------------------------------------------------------------------
    def _configure_launcher(self) -> None:  # Lightning's private hook: see _choose_launcher
        _choose_launcher(self, super()._configure_launcher)

    def configure_ddp(self) -> None:
        assert self.lightning_module is not None
        self._broadcast_module_states()  # θ from rank 0
        self._anchor = parameters_to_vector(self._params()).detach().float().clone()
        if self._rank_module_state is not None:  # between two syncs every rank has its own θ: not rank 0's
            self.lightning_module.load_state_dict(self._rank_module_state)
            self._rank_module_state = None
        if self._pending_state is not None:
            self.apply_lowcomm_state(self._pending_state)
            self._pending_state = None

    def setup(self, trainer) -> None:
        super().setup(trainer)  # ... configure_ddp, then the optimizers
        if trainer.state.fn == TrainerFn.FITTING and self.mode == "lordo":
            for optimizer in self.optimizers:
                check_sync_optimizer(optimizer, f"LoRDOStrategy(mode={self.mode!r})")

    @torch.no_grad()
    def _broadcast_module_states(self) -> None:
        """Every parameter and buffer from rank 0 (start-up, not counted in the ledger)."""
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            for t in [*self.model.parameters(), *self.model.buffers()]:
                dist.broadcast(t.detach(), src=0)

    def _params(self) -> list[Tensor]:
        return [p for p in self.lightning_module.parameters() if p.requires_grad]

    # ---- collectives, all through the ledger -------------------------------------------------------
    def _all_reduce_mean(self, flat: Tensor, tag: str) -> Tensor:
        self.ledger.add(tag, flat)
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)  # AVG is not available on gloo
            flat.div_(self.world_size)
        return flat

    def _broadcast_tensor(self, flat: Tensor, tag: str) -> Tensor:
        self.ledger.add(tag, flat)
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            dist.broadcast(flat, src=0)
        return flat

    def _in_warmup(self) -> bool:
        return self.inner_step < self.warmup_ddp_steps

    def _reduces_gradients(self) -> bool:
        return self.mode in ("ddp", "lowrank_ddp") or self._in_warmup()

    @torch.no_grad()
    def _all_reduce_grads(self, params: list[Tensor], tag: str) -> list[Tensor]:
        """One flat bucket; a parameter without a gradient contributes zeros, so every rank enters the same
        collective even when a step is skipped on one of them."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = self._all_reduce_mean(torch.cat([g.reshape(-1) for g in grads]).float(), tag)
        out, offset = [], 0
        for p in params:
            out.append(flat[offset : offset + p.numel()].view_as(p).to(p.dtype))
            offset += p.numel()
        return out

    # ---- one training step -------------------------------------------------------------------------
    def optimizer_step(self, optimizer, closure, model=None, **kwargs: Any) -> Any:
        def closure_then_communicate():
            loss = closure()  # forward + backward of this rank's batch
            if self._reduces_gradients():
                params = self._params()
                for p, g in zip(params, self._all_reduce_grads(params, "gradient")):
                    p.grad = g
            elif self.mode == "lordo" and not optimizer.projectors_ready():
                self._init_projectors(optimizer)
            return loss  # precision plugin then clips the (averaged) gradient

        output = super().optimizer_step(optimizer, closure_then_communicate, model, **kwargs)
        self.inner_step += 1
        if self.mode in LOCAL_MODES:
            local_steps = self.inner_step - self.warmup_ddp_steps
            if local_steps == 0:  # DDP warm-up just ended: ranks are identical, start the anchor
                self._anchor = parameters_to_vector(self._params()).detach().float().clone()
            elif local_steps > 0 and local_steps % self.sync_every == 0:
                self.outer_sync(optimizer)
        return output

    def _init_projectors(self, optimizer: LowRankSyncOptimizer) -> None:
        """Start-up: the first Q from the all-reduced gradient of the first batch (b·P_lr once). The
        local-projector ablation leaves it to the optimizer (each worker's own gradient, no traffic)."""
        if self.projector_source == "local_pseudo_grad":
            return
        low = optimizer.low_rank_params()
        optimizer.init_projectors(dict(zip(low, self._all_reduce_grads(low, "projector_init"))))

    # ---- the sync, every K inner steps --------------------------------------------------------------
    @torch.no_grad()
    def outer_sync(self, optimizer) -> None:
        params = self._params()
        theta = parameters_to_vector(params).detach().float()
        local_delta = self._anchor - theta  # 1. Δᵐ = θ̄ − θᵐ
        delta = self._all_reduce_mean(local_delta.clone(), "pseudo_gradient")  # Δ = mean_m Δᵐ
        if self.outer == "average":  # 2. θ ← θ̄ − Δ
            self._anchor = self._anchor - delta
        else:  # Nesterov SGD on θ̄
            buf = (
                delta.clone()
                if self._outer_buf is None
                else self._outer_buf.mul_(self.outer_momentum).add_(delta)
            )
            self._outer_buf = buf
            self._anchor = self._anchor - self.outer_lr * (delta + self.outer_momentum * buf)
        _copy_into(self._anchor, params)  # θᵐ ← θ; θ̄ ← θ
        if self.mode == "lordo":  # optimizer: a LowRankSyncOptimizer (checked in setup)
            if self.sync_states:  # 3. state averaging
                states = optimizer.state_tensors_for_sync(self.sync_error_feedback)
                flat = self._all_reduce_mean(
                    torch.cat([s.reshape(-1).float() for s in states]), "optimizer_state"
                )
                _copy_into(flat, states)
            self._refresh_projectors(  # 4.–5. projector refresh
                optimizer, params, local_delta if self.projector_source == "local_pseudo_grad" else delta
            )
        self.num_syncs += 1

    def _refresh_projectors(
        self, optimizer: LowRankSyncOptimizer, params: list[Tensor], source: Tensor
    ) -> None:
        offsets, offset = {}, 0
        for p in params:
            offsets[id(p)] = offset
            offset += p.numel()
        low = optimizer.low_rank_params()
        deltas = {p: source[offsets[id(p)] : offsets[id(p)] + p.numel()].view_as(p) for p in low}
        sims = optimizer.refresh_projectors(deltas, rotate=self.rotate_moments)
        if self.broadcast_projector:  # heterogeneous ranks: rank 0's Q
            Qs = optimizer.projectors()
            flat = self._broadcast_tensor(torch.cat([Q.reshape(-1) for Q in Qs]), "projector_broadcast")
            _copy_into(flat, Qs)
        if sims:
            self.similarities.append(sum(sims) / len(sims))

    # ---- what the LightningModule logs, and the strategy's own checkpoint state ---------------------
    def comm_metrics(self) -> dict[str, float]:
        total = self.ledger.total
        ring = 2 * (self.world_size - 1) / self.world_size if self.world_size > 1 else 1.0
        metrics = {
            "comm/bytes_total": float(total),
            "comm/bytes_per_step": total / max(self.inner_step, 1),
            "comm/ring_bytes_total": total * ring,
            "comm/num_collectives": float(sum(self.ledger.calls.values())),
            "comm/num_syncs": float(self.num_syncs),
        }
        if self.similarities:
            metrics["lordo/subspace_similarity"] = self.similarities[-1]
        if len(self.similarities) > 1:  # after the first refresh: what the stagnation argument is about
            later = self.similarities[1:]
            metrics["lordo/subspace_similarity_min"] = min(later)
            metrics["lordo/subspace_similarity_max"] = max(later)
        return metrics

    def lowcomm_state_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "inner_step": self.inner_step,
            "num_syncs": self.num_syncs,
            "anchor": None if self._anchor is None else self._anchor.cpu(),
            "outer_buf": None if self._outer_buf is None else self._outer_buf.cpu(),
            "ledger": self.ledger.state_dict(),
            "similarities": list(self.similarities),
        }

    def load_lowcomm_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``lowcomm_state_dict``; before ``configure_ddp`` (a resumed fit) it waits for the anchor."""
        if state.get("mode") != self.mode:
            raise ValueError(
                f"checkpoint was written by mode={state.get('mode')!r}, this run is mode={self.mode!r}"
            )
        if self._anchor is None:
            self._pending_state = state
        else:
            self.apply_lowcomm_state(state)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None
    ) -> None:
        checkpoint["lowcomm"] = self.lowcomm_state_dict()  # a resumed run syncs on schedule
        if self.mode in LOCAL_MODES and self.world_size > 1 and dist.is_available() and dist.is_initialized():
            # between syncs the workers' weights and optimiser states differ: keep every rank's, so that a run
            # resumed there continues each worker where it was (every rank calls save_checkpoint)
            own = {
                "state_dict": checkpoint["state_dict"],
                "optimizer_states": checkpoint.get("optimizer_states"),
            }
            ranks: list[Any] = [None] * self.world_size
            dist.all_gather_object(ranks, own)
            checkpoint["lowcomm"]["ranks"] = ranks
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        if "lowcomm" in checkpoint:
            ranks = checkpoint["lowcomm"].pop("ranks", None)
            if ranks and len(ranks) == self.world_size and self.mode in LOCAL_MODES:
                own = ranks[self.global_rank]
                checkpoint["state_dict"], checkpoint["optimizer_states"] = (
                    own["state_dict"],
                    own["optimizer_states"],
                )
                self._rank_module_state = own["state_dict"]
            self.load_lowcomm_state_dict(checkpoint["lowcomm"])
        return checkpoint

    def apply_lowcomm_state(self, state: dict[str, Any]) -> None:
        """Counters, anchor, outer momentum, ledger and similarities from ``state``, now."""
        device = self.root_device
        self.inner_step, self.num_syncs = int(state["inner_step"]), int(state["num_syncs"])
        if state["anchor"] is not None:
            self._anchor = state["anchor"].to(device)
        if state["outer_buf"] is not None:
            self._outer_buf = state["outer_buf"].to(device)
        self.ledger.load_state_dict(state["ledger"])
        self.similarities = list(state["similarities"])


# ---- Lightning internals ----------------------------------------------------------------------------------
# No public hook exists for these, so they sit here together; tests/test_lordo.py
# (test_lightning_internals_still_exist) checks LIGHTNING_INTERNALS on the installed Lightning and fails loudly,
# naming the member, when a release renames or removes one.
#  * DDPStrategy._configure_launcher / ._launcher / ._start_method: the only way to choose the launcher. Under
#    srun/torchrun the ranks exist already and Lightning's spawn launcher would start a second set inside every
#    Slurm task; in-process runs (``litlab repro``, tests) need the launcher below.
#  * _MultiProcessingLauncher (get_extra_results / update_main_process_results): the spawn launcher, extended to
#    bring the loop counters and the ledger back to the launching process.
#  * _SubprocessScriptLauncher: Lightning's launcher for processes started externally.
#  * _Loop._loaded_from_state_dict / ._resuming_from_checkpoint: after loading the ranks' loop counters into the
#    launching process's loops, mark them "not resuming" so a later fit() there starts afresh.
LIGHTNING_INTERNALS: dict[str, tuple[type, tuple[str, ...]]] = {
    "DDPStrategy": (DDPStrategy, ("_configure_launcher", "_launcher", "_start_method")),
    "_MultiProcessingLauncher": (
        _MultiProcessingLauncher,
        ("get_extra_results", "update_main_process_results"),
    ),
    "_SubprocessScriptLauncher": (_SubprocessScriptLauncher, ()),
    "_Loop": (_Loop, ("restarting", "_loaded_from_state_dict", "_resuming_from_checkpoint")),
}


def fork_hazard() -> str | None:
    """Why forking the ranks from this process could hang them, or None. A process group, or the child-process
    observer thread of Lightning's launcher, left by an earlier distributed fit in the same process reach forked
    ranks without their threads, and the ranks' first collective never returns (a CI run hung so, in a test
    worker that had run a single-device fit before). A fresh ``litlab fit``, a ``litlab repro`` worker or a
    notebook (where fork is the only start method that works) has neither."""
    if dist.is_available() and dist.is_initialized():
        return "a process group from an earlier fit is still initialised in this process"
    observers = [t.name for t in threading.enumerate() if "child-process-observer" in t.name]
    if observers:
        return "the process launcher of an earlier fit is still watching its ranks from this process"
    return None


def _choose_launcher(strategy: LoRDOStrategy, lightning_default) -> None:
    """Under srun/torchrun launch nothing, whatever ``start_method`` says; spawn: ``_SpawnLauncher``. ``fork``
    falls back to ``spawn`` (the same numbers, measured; ~12 CPU-s more per fit) when forking is unsafe here."""
    env = strategy.cluster_environment
    if env is not None and env.creates_processes_externally:
        strategy._launcher = _SubprocessScriptLauncher(env, strategy.num_processes, strategy.num_nodes)
    elif strategy._start_method != "popen":
        start = strategy._start_method
        if start == "fork" and (reason := fork_hazard()) is not None:
            rank_zero_warn(
                f"LoRDOStrategy: start_method 'fork' -> 'spawn': {reason}, and forked ranks could hang"
            )
            start = "spawn"
        strategy._launcher = _SpawnLauncher(strategy, start_method=start)
    else:
        lightning_default()


class _SpawnLauncher(_MultiProcessingLauncher):
    """Lightning's spawn launcher that also brings the loop counters (``trainer.global_step``) and this strategy's
    ledger back to the launching process, so in-process callers see what the ranks did."""

    def get_extra_results(self, trainer) -> dict[str, Any]:
        extra = super().get_extra_results(trainer)
        buffer = io.BytesIO()
        # counters and ledger only: the result travels through a pipe that is read after the ranks exit, so a
        # payload beyond the pipe buffer (e.g. the anchor θ̄) would block rank 0 forever
        lowcomm = {**trainer.strategy.lowcomm_state_dict(), "anchor": None, "outer_buf": None}
        torch.save({"fit_loop": trainer.fit_loop.state_dict(), "lowcomm": lowcomm}, buffer)
        extra["lordo_state_bytes"] = buffer.getvalue()
        return extra

    def update_main_process_results(self, trainer, extra: dict[str, Any]) -> None:
        super().update_main_process_results(trainer, extra)
        if "lordo_state_bytes" not in extra:
            return
        state = torch.load(io.BytesIO(extra["lordo_state_bytes"]), weights_only=False)  # from our own child
        trainer.fit_loop.load_state_dict(state["fit_loop"])
        _not_resuming(trainer.fit_loop)  # counters only: a later fit() starts afresh, as it would have
        trainer.strategy.apply_lowcomm_state(state["lowcomm"])


def _not_resuming(loop: _Loop) -> None:
    loop.restarting, loop._loaded_from_state_dict, loop._resuming_from_checkpoint = False, False, False
    for child in vars(loop).values():
        if isinstance(child, _Loop):
            _not_resuming(child)


def _copy_into(flat: Tensor, tensors: list[Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into ``tensors`` (never aliasing them to ``flat``)."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
