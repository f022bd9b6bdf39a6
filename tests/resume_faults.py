"""Fault injection for the kill-and-resume tests (imported by the `litlab fit` subprocesses of
tests/test_resume_exact.py through PYTHONPATH; not part of the package)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class KillAfterCheckpoint(L.Callback):
    """SIGKILLs the whole process group (every rank of a forked DDP fit) at the first hook after ``path`` exists:
    the file was written by an earlier hook (ModelCheckpoint runs last in each hook), so nothing after it ran."""

    def __init__(self, path: str):
        self.path = Path(path)

    def _check(self, *args, **kwargs) -> None:
        if self.path.exists():
            os.killpg(os.getpgid(0), signal.SIGKILL)

    on_train_batch_start = on_train_batch_end = _check
    on_train_epoch_start = on_train_epoch_end = _check
    on_validation_start = on_train_end = _check


class Trace(L.Callback):
    """Debugging aid: one line per training batch (epoch, batch index, global step, a digest of the batch and of
    torch's global RNG state) appended to ``path``; diff two runs' traces to see where they part."""

    def __init__(self, path: str):
        self.path = Path(path)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        import hashlib

        import torch

        def digest(x) -> str:
            if isinstance(x, dict):
                x = list(x.values())
            if isinstance(x, (list, tuple)):
                return "".join(digest(v) for v in x)[:12]
            if isinstance(x, torch.Tensor):
                return hashlib.md5(x.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:6]
            return str(x)[:6]

        rng = hashlib.md5(torch.get_rng_state().numpy().tobytes()).hexdigest()[:6]
        with open(self.path, "a") as f:
            f.write(
                f"e{trainer.current_epoch} b{batch_idx} g{trainer.global_step} data={digest(batch)} rng={rng}\n"
            )

    def _loops(self, trainer, where: str) -> None:
        fit, ep = trainer.fit_loop, trainer.fit_loop.epoch_loop
        with open(self.path, "a") as f:
            f.write(
                f"{where}: fit={fit._restart_stage} ep={ep._restart_stage} epochs={fit.epoch_progress.current} "
                f"batches={ep.batch_progress.current} stepped={ep._batches_that_stepped}\n"
            )

    def on_train_start(self, trainer, pl_module) -> None:
        self._loops(trainer, "train_start")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._loops(trainer, "epoch_start")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._loops(trainer, "epoch_end")


class RaiseAtStep(L.Callback):
    """Raises ``RuntimeError`` at the first training batch at or after global step ``step``."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            raise RuntimeError(f"injected failure at step {trainer.global_step}")


class SignalAtStep(L.Callback):
    """Sends the process a real signal (``SIGTERM`` by default) at the first training batch at global step ``step``:
    delivered as a scheduler's would be, handled between two Python instructions of that batch."""

    def __init__(self, step: int, signal_name: str = "SIGTERM"):
        self.step = step
        self.signal_name = signal_name

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), getattr(signal, self.signal_name))


class LogValueAtStep(L.Callback):
    """Logs ``name`` = ``float(value)`` (e.g. ``"nan"``) from the first training batch at or after global step ``step``."""

    def __init__(self, name: str, value: str, step: int):
        self.name, self.value, self.step = name, float(value), step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            pl_module.log(self.name, self.value)


class LogValueInValidation(L.Callback):
    """Logs ``name`` = ``float(value)`` from every validation batch."""

    def __init__(self, name: str, value: str):
        self.name, self.value = name, float(value)

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        pl_module.log(self.name, self.value)


class KillWhileWriting(L.Callback):
    """SIGKILLs the process in the middle of writing the checkpoint file ``name`` (e.g. ``last.ckpt``): half of it is
    in the temp file beside it, as when a node dies during the write."""

    def __init__(self, name: str = "last.ckpt"):
        self.name = name

    def setup(self, trainer, pl_module, stage) -> None:
        import litlab.checkpoint_io as checkpoint_io

        real_save, name = checkpoint_io.torch.save, self.name

        def save(obj, f, *args, **kwargs):
            real_save(obj, f, *args, **kwargs)
            if f".{name}." in Path(f).name:
                data = Path(f).read_bytes()
                Path(f).write_bytes(data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)

        checkpoint_io.torch.save = save  # this process dies in it: nothing to restore


class KillRightAfterStepCheckpoint(ModelCheckpoint):
    """A ModelCheckpoint that SIGKILLs its process right after it wrote the mid-epoch checkpoint of global step
    ``kill_at_step``: inside that step's ``on_train_batch_end``, before Lightning hands the step's metrics to the
    loggers (the gap in which a kill used to lose the step's row for good)."""

    def __init__(self, kill_at_step: int, **kwargs):
        super().__init__(**kwargs)
        self.kill_at_step = kill_at_step

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        if trainer.global_step == self.kill_at_step and Path(filepath).name != "last.ckpt":
            os.killpg(os.getpgid(0), signal.SIGKILL)


class SignalInSetup(L.Callback):
    """Sends the process SIGTERM from the ``setup`` hook: before Lightning installs its own signal handlers (a
    scheduler preempting a job that is still loading its model or data)."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
