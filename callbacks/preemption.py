"""``PreemptionCheckpoint``: a fit that a scheduler preempts (SIGTERM, or SIGUSR1 outside SLURM's auto-requeue)
saves a checkpoint at the step it reached, and its run ends ``preempted``, not "finished" with exit code 0.

Built on Lightning's own handling: Lightning's SIGTERM handler sets ``trainer.received_sigterm`` and its loops raise
``SIGTERMException`` (a ``SystemExit`` with no code, so a plain ``lightning fit`` exits 0) at the end of the batch.
This callback writes ``last.ckpt`` in ``on_train_batch_end`` of that batch, the hook in which ModelCheckpoint writes
its mid-epoch checkpoints (so the file resumes exactly as theirs do, ``ExactResume``), and ``litlab.cli`` turns the
exception into ``RunPreempted`` (exit code 128 + the signal: 143 for SIGTERM). SIGUSR1 (sent before the time limit
by ``sbatch --signal=USR1@...``) takes the same path; under SLURM with auto-requeue Lightning handles SIGUSR1 itself
(a checkpoint and ``scontrol requeue``) and this callback leaves it alone.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException


class PreemptionCheckpoint(L.Callback):
    """Checkpoint at the step a SIGTERM or SIGUSR1 arrived; ``signal_name`` and ``saved_step`` say what happened."""

    def __init__(self, checkpoint_dir: str | Path):
        self.checkpoint_dir = Path(checkpoint_dir)
        self.signal_name = "SIGTERM"
        self.saved_step: int | None = None
        self._previous_sigusr1: Any = None

    # ---- SIGUSR1: Lightning's SIGTERM path, unless SLURM's auto-requeue owns it ----------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # not in on_fit_start: Lightning records the handlers it restores at the end of a fit after that hook, and
        # would put this one back after teardown removed it
        self.saved_step = None
        environment = trainer._accelerator_connector.cluster_environment
        slurm_requeue = isinstance(environment, SLURMEnvironment) and environment.auto_requeue
        if (
            slurm_requeue
            or sys.platform == "win32"
            or signal.getsignal(signal.SIGUSR1) not in (None, signal.SIG_DFL)
        ):
            return
        self._previous_sigusr1 = signal.signal(signal.SIGUSR1, self._on_sigusr1)

    def _on_sigusr1(self, signum: int, frame: FrameType | None) -> None:
        self.signal_name = "SIGUSR1"
        # Lightning's handler: marks the trainer, stops its launcher's other ranks
        sigterm_handler = signal.getsignal(signal.SIGTERM)
        if callable(sigterm_handler):
            sigterm_handler(signum, frame)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._previous_sigusr1 is not None:
            signal.signal(signal.SIGUSR1, self._previous_sigusr1)
            self._previous_sigusr1 = None

    # ---- the checkpoint at the signal ------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        preempted = trainer.received_sigterm
        if trainer.world_size > 1:  # every rank saves, or none: save_checkpoint waits for all of them
            preempted = trainer.strategy.reduce_boolean_decision(preempted, all=False)
        if preempted:
            self._save(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # the signal came after this hook ran in the batch, or during validation: save where the loop stopped (one
        # process only: with several ranks, the ranks may not all be here, and the save would wait for them forever)
        if (
            isinstance(exception, SIGTERMException)
            and trainer.state.fn == "fit"
            and trainer.world_size == 1
            and self.saved_step != trainer.global_step
        ):
            self._save(trainer)

    def _save(self, trainer: L.Trainer) -> None:
        if self.saved_step == trainer.global_step:
            return
        path = self.last_checkpoint_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)  # the full state: a resume continues it exactly
        self.saved_step = trainer.global_step
        if trainer.is_global_zero:
            print(
                f"litlab: {self.signal_name} received: checkpoint at step {trainer.global_step} written to {path}",
                file=sys.stderr,
            )

    def last_checkpoint_path(self, trainer: L.Trainer) -> Path:
        """Where ``--ckpt_path last`` looks: the ModelCheckpoint's ``last.ckpt``, else ``<run>/checkpoints/``."""
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.dirpath:
                return Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}"
        return self.checkpoint_dir / "last.ckpt"
