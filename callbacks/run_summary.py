"""Writes ``summary.json`` (fit) / ``summary-<stage>.json`` at the end of a run: the final logged metrics, where the harness and tools read them.

Every attempt on a run folder (a first fit, a resume, a failed relaunch) adds one entry to ``attempts`` (outcome,
step, wall time); the record itself is the latest successful one: an attempt that fails after a finished one
leaves the finished metrics and status in place and only adds its own entry.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

from litlab.callbacks.divergence import first_nonfinite
from litlab.callbacks.preemption import PreemptionCheckpoint
from litlab.callbacks.step_log import log_step_before_checkpoint
from litlab.lit_modules.core.errors import RunDiverged, RunIOError, RunStopped
from litlab.lit_modules.core.io import atomic_write_json
from litlab.lit_modules.core.seeding import seed_ledger


class RunSummary(L.Callback):
    """After fit/validate/test, atomically record ``trainer.callback_metrics`` and the run's identity.

    ``status`` is ``finished`` only when fit reached its stopping condition (not on an exception or a
    keyboard interrupt), which is what lets an interrupted reproduction resume instead of reusing it.
    """

    def __init__(self, run_dir: str | Path, identity: dict | None = None):
        self.run_dir = Path(run_dir)
        self.identity = dict(identity or {})
        self._started = time.time()

    def _write(self, trainer: L.Trainer, stage: str, status: str) -> None:
        if trainer.global_rank != 0 or trainer.sanity_checking:
            return
        nonfinite = first_nonfinite(trainer.callback_metrics, trainer.lightning_module)
        # never "finished" with a NaN metric
        if status == "finished" and nonfinite is not None:
            status = f"diverged: {nonfinite} at step {trainer.global_step}"
        metrics = {}
        for k, v in trainer.callback_metrics.items():
            value = float(v.detach().float().mean()) if isinstance(v, torch.Tensor) else float(v)
            metrics[k] = value if math.isfinite(value) else str(value)
        name = "summary.json" if stage == "fit" else f"summary-{stage}.json"
        path = self.run_dir / name
        previous = _read(path)
        record = {
            **self.identity,
            "status": status,
            "stage": stage,
            "metrics": metrics,
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "wall_time_s": round(time.time() - self._started, 3),
            # the run seed, each component's derived seed and each cached artefact's fingerprint
            "seed_ledger": seed_ledger(),
        }
        attempt = {k: record[k] for k in ("status", "global_step", "epoch", "wall_time_s")} | {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self._started))
        }
        attempts = [*previous.get("attempts", []), attempt]
        if previous.get("status") == "finished" and (status != "finished" or not metrics):
            # a failed attempt never overwrites a finished record, nor does a relaunch with nothing left to train
            # (resumed from the last checkpoint of a finished fit, it logs no metric)
            record = previous
        try:
            atomic_write_json(path, {**record, "attempts": attempts})
        except OSError as err:  # a full or read-only disk: the status goes to stderr instead
            message = (
                f"cannot write {path} ({err.strerror or type(err).__name__}); this attempt's status: {status}"
            )
            if status == "finished":
                raise RunIOError(message) from err
            print(f"litlab: {message}", file=sys.stderr)

    def on_fit_start(self, trainer, pl_module) -> None:
        self._started = time.time()
        self.trained = False  # whether this attempt entered the training loop (see ``resumed_at_the_end``)

    def on_train_start(self, trainer, pl_module) -> None:
        self.trained = True

    def resumed_at_the_end(self, trainer: L.Trainer) -> bool:
        """A relaunch that resumed from the last checkpoint of a completed fit (the previous attempt was killed
        between that checkpoint and its summary): Lightning skips the loop, so nothing is logged."""
        return not getattr(self, "trained", True) and not trainer.callback_metrics

    def record_fit(self, trainer: L.Trainer) -> None:
        """Write the fit's summary again from the metrics a validation pass just logged (``LitlabCLI.after_fit``)."""
        self._write(trainer, "fit", "finished")

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        # the logs up to a checkpoint reach the disk with it, the checkpoint's own step included (written inside
        # on_train_batch_end, before Lightning logs that step): a run killed after the checkpoint keeps them
        log_step_before_checkpoint(trainer)
        for logger in trainer.loggers:
            if isinstance(logger, CSVLogger):
                logger.save()

    def on_fit_end(self, trainer, pl_module) -> None:
        # never "finished" with a NaN metric, even with --stop_on_divergence=false: on_exception records it
        nonfinite = first_nonfinite(trainer.callback_metrics, pl_module)
        if nonfinite is not None and not trainer.interrupted:
            raise RunDiverged(
                f"diverged: {nonfinite} is {trainer.callback_metrics[nonfinite]} at the end of the fit",
                status=f"diverged: {nonfinite} at step {trainer.global_step}",
            )
        self._write(trainer, "fit", "interrupted" if trainer.interrupted else "finished")

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "validate":
            self._end_of_evaluation(trainer, "validate")

    def on_test_end(self, trainer, pl_module) -> None:
        self._end_of_evaluation(trainer, "test")

    def _end_of_evaluation(self, trainer: L.Trainer, stage: str) -> None:
        nonfinite = first_nonfinite(trainer.callback_metrics, trainer.lightning_module)
        if nonfinite is not None:  # recorded by on_exception, with the diverged exit code
            raise RunDiverged(
                f"diverged: {nonfinite} is {trainer.callback_metrics[nonfinite]} in {stage}",
                status=f"diverged: {nonfinite} at step {trainer.global_step}",
            )
        self._write(trainer, stage, "finished")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        stage = trainer.state.fn.value if trainer.state.fn else "fit"  # str(enum) differs across Pythons
        self._write(trainer, stage, exception_status(trainer, exception))


def exception_status(trainer: L.Trainer, exception: BaseException) -> str:
    """The status of an attempt that ``exception`` ended: ``diverged: ...``, ``preempted: SIGTERM at step N``, or
    ``failed: <type>: <message>``."""
    if isinstance(exception, RunStopped):
        return exception.status
    if isinstance(exception, SIGTERMException):
        signal_name = next(
            (c.signal_name for c in trainer.callbacks if isinstance(c, PreemptionCheckpoint)), "SIGTERM"
        )
        return f"preempted: {signal_name} at step {trainer.global_step}"
    return f"failed: {type(exception).__name__}: {exception}"


def record_failed_attempt(run_dir: str | Path, status: str) -> None:
    """Add a failed attempt that never reached the Trainer (e.g. a broken ``last.ckpt``) to ``summary.json``,
    keeping its record as it was."""
    path = Path(run_dir) / "summary.json"
    previous = _read(path)
    attempt = {"status": status, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    record = previous or {"status": status, "stage": "fit", "metrics": {}}
    atomic_write_json(path, {**record, "attempts": [*previous.get("attempts", []), attempt]})


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
