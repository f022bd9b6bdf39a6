"""Writes ``summary.json`` (fit) / ``summary-<stage>.json`` at the end of a run: the final logged metrics, where the harness and tools read them."""

from __future__ import annotations

import math
import time
from pathlib import Path

import lightning as L
import torch

from litlab.lit_modules.core.io import atomic_write_json


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
        metrics = {}
        for k, v in trainer.callback_metrics.items():
            value = float(v.detach().float().mean()) if isinstance(v, torch.Tensor) else float(v)
            metrics[k] = value if math.isfinite(value) else str(value)
        name = "summary.json" if stage == "fit" else f"summary-{stage}.json"
        atomic_write_json(
            self.run_dir / name,
            {
                **self.identity,
                "status": status,
                "stage": stage,
                "metrics": metrics,
                "global_step": trainer.global_step,
                "epoch": trainer.current_epoch,
                "wall_time_s": round(time.time() - self._started, 3),
            },
        )

    def on_fit_start(self, trainer, pl_module) -> None:
        self._started = time.time()

    def on_fit_end(self, trainer, pl_module) -> None:
        self._write(trainer, "fit", "interrupted" if trainer.interrupted else "finished")

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "validate":
            self._write(trainer, "validate", "finished")

    def on_test_end(self, trainer, pl_module) -> None:
        self._write(trainer, "test", "finished")

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        stage = trainer.state.fn.value if trainer.state.fn else "fit"  # str(enum) differs across Pythons
        self._write(trainer, stage, f"failed: {type(exception).__name__}: {exception}")
