"""``litlab fit|validate|test|predict``: LightningCLI in subclass mode, plus the defaults every run gets.

Any LightningModule under ``lit_modules`` and any DataModule under ``datamodules`` can be named by class path
(``model.class_path: litlab.lit_modules.peft.lokra.LoKRAMatrixApprox``) or, once imported here, by class name.
Every run, unless its config says otherwise, gets:

* ``seed_everything: 0`` (set it in the config; it is part of the run's identity);
* a WandbLogger (offline unless the user is logged in; ``WANDB_MODE=disabled`` drops it) and a CSVLogger;
* RichProgressBar, LearningRateMonitor, and a ModelCheckpoint that keeps ``last.ckpt``;
* ``ExactResume``: the random generators and the epoch position in every checkpoint, so a resumed fit
  continues the uninterrupted one batch for batch (``litlab.callbacks.exact_resume``);
* ``summary.json`` with the final metrics (``litlab.callbacks.run_summary.RunSummary``);
* ``adapters.safetensors``, the adapters alone, when the model has any (``litlab.callbacks.save_adapters.SaveAdapters``);
* checkpoints loaded with ``weights_only=True`` and a clear error for a truncated file;
* one writer per run folder (``RunLock``: a second ``fit`` on it stops at once, naming the holder's pid);
* ``--ckpt_path last`` resumes from the newest checkpoint that loads (a kill during the write of ``last.ckpt``
  leaves the one before), saying which; temp files a killed writer left are removed first;
* ``StopOnDivergence``: the first NaN/inf loss or logged metric stops the fit, status ``diverged: <metric> at step
  N`` (``--stop_on_divergence=false`` turns it off); ``PreemptionCheckpoint``: SIGTERM/SIGUSR1 save a checkpoint at
  the current step, status ``preempted``; the exit codes are in the README's run section;
* ``--experiment`` and ``--run_id`` are folder names: a path that would lead outside ``--runs_dir`` is refused;
* a folder ``runs/<experiment>/<run-id>/`` where ``run-id = <config hash>-s<seed>``, so relaunching the same
  config with ``--ckpt_path last`` resumes the interrupted attempt.
"""

from __future__ import annotations

import errno
import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import (
    Callback,
    LearningRateMonitor,
    ModelCheckpoint,
    ProgressBar,
    RichProgressBar,
)
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException

import litlab.datamodules
import litlab.lit_modules
from litlab.callbacks.divergence import StopOnDivergence
from litlab.callbacks.exact_resume import ExactResume
from litlab.callbacks.preemption import PreemptionCheckpoint
from litlab.callbacks.run_summary import RunSummary, record_failed_attempt
from litlab.callbacks.save_adapters import SaveAdapters
from litlab.checkpoint_io import SafeCheckpointIO, newest_loadable_checkpoint, write_failure_cause
from litlab.lit_modules.core.errors import CheckpointError, RunIOError, RunPreempted, unavailable_cause
from litlab.lit_modules.core.seeding import reset_ledger
from litlab.runs import RunLock, default_run_id, remove_stale_temp_files, run_folder, wandb_mode

# what a full disk, a read-only file system or a quota raise while a run writes its logs
IO_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EIO})


def import_method_modules() -> None:
    """Import every module of ``lit_modules`` and ``datamodules`` so classes can be named by short name too."""
    for package in (litlab.lit_modules, litlab.datamodules):
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            importlib.import_module(info.name)


class RunAlreadyFinished(Exception):
    """Raised before instantiation when ``skip_finished`` is set and the run's summary says finished."""

    def __init__(self, run_dir: Path):
        super().__init__(f"run already finished: {run_dir}")
        self.run_dir = run_dir


class LitlabCLI(LightningCLI):
    # False for a CLI that only reads the resolved config (``litlab slurm``'s run folder): it must not hold
    # the folder's lock, or the job it submits finds its own folder busy
    takes_run_lock: bool = True

    def __init__(self, *args: Any, skip_finished: bool = False, **kwargs: Any) -> None:
        import_method_modules()
        self.skip_finished = skip_finished
        self.run_dir: Path | None = None
        self.run_lock: RunLock | None = None
        kwargs.setdefault("model_class", L.LightningModule)
        kwargs.setdefault("datamodule_class", L.LightningDataModule)
        kwargs.setdefault("subclass_mode_model", True)
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_kwargs", {"parser_mode": "yaml"})
        kwargs.setdefault("parser_class", ShortErrorParser)
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--experiment",
            type=str | None,
            default=None,
            help="Run group: runs/<experiment>/. Default: the config file's folder name "
            "(configs/lokra/quick.yaml -> lokra), else the model class name.",
        )
        parser.add_argument(
            "--run_id",
            type=str | None,
            default=None,
            help="Run folder name. Default: <config hash>-s<seed>, so a relaunch resumes.",
        )
        parser.add_argument("--runs_dir", type=str, default="runs", help="Root folder of all runs.")
        parser.add_argument(
            "--stop_on_divergence",
            type=bool,
            default=True,
            help="Stop a fit at the first NaN/inf training loss or logged metric (status 'diverged: <metric> at "
            "step N', exit code 4).",
        )

    def _parse_ckpt_path(self) -> None:
        """LightningCLI reads a given checkpoint's hyper-parameters before anything else: check it first."""
        ckpt_path = (
            self.config[self.config.subcommand].get("ckpt_path") if self.config.get("subcommand") else None
        )
        if ckpt_path and Path(ckpt_path).is_file():
            SafeCheckpointIO().load_checkpoint(ckpt_path, map_location="cpu")  # clear error when truncated
        super()._parse_ckpt_path()

    # ---- run identity ---------------------------------------------------------------------------
    def _section(self) -> Any:
        return self.config[self.subcommand] if self.subcommand else self.config

    def _experiment_name(self, cfg: Any) -> str:
        if cfg.get("experiment"):
            return cfg.experiment
        configs = cfg.get("config") or []
        if configs:
            return Path(str(configs[0])).resolve().parent.name
        class_path = (cfg.get("model") or {}).get("class_path") or "run"
        return re.sub(r"(?<!^)(?=[A-Z])", "_", class_path.rsplit(".", 1)[-1]).lower()

    def before_instantiate_classes(self) -> None:
        cfg = self._section()
        seed = cfg.get("seed_everything")
        reset_ledger(seed if isinstance(seed, int) and seed is not False else None)  # one ledger per run
        run_id = cfg.get("run_id") or default_run_id(cfg.as_dict(), seed if seed is not False else None)
        self.run_dir = run_folder(cfg.runs_dir, self._experiment_name(cfg), run_id)
        if self.skip_finished and _finished(self.run_dir):
            raise RunAlreadyFinished(self.run_dir)
        if self.subcommand == "fit" and self.takes_run_lock and not _secondary_rank():
            # one writer per run folder, before any logger or checkpoint touches it
            self.run_lock = RunLock(self.run_dir).acquire()
            remove_stale_temp_files(self.run_dir)  # a killed writer's half files; we hold the lock
            if cfg.get("ckpt_path") == "last":
                cfg["ckpt_path"] = self._resume_checkpoint(_checkpoint_folders(cfg, self.run_dir))

    def _resume_checkpoint(self, folders: list[Path]) -> str:
        """The newest checkpoint of the run that loads, checked before loggers make a new csv version and wandb run;
        ``CheckpointError`` when there are checkpoints and none loads (the run does not silently start over)."""
        assert self.run_dir is not None
        folder = folders[0] if len(folders) == 1 else self.run_dir
        path, skipped = newest_loadable_checkpoint(folders)
        if path is None and skipped:
            err = CheckpointError(
                f"no checkpoint in {folder} loads, so the run cannot resume: " + "; ".join(skipped)
            )
            record_failed_attempt(self.run_dir, f"failed: {type(err).__name__}: {err}")
            self.release_run_lock()
            raise err
        if path is None:
            print(f"litlab: no checkpoint in {folder}: --ckpt_path last starts at step 0", file=sys.stderr)
            return "last"  # Lightning's own answer (a warning and a fresh start)
        if skipped or path.name != "last.ckpt":
            why = "; ".join(skipped) if skipped else "there is no last.ckpt"
            print(f"litlab: resuming from {path} ({why})", file=sys.stderr)
        return str(path)

    def release_run_lock(self) -> None:
        if self.run_lock is not None:
            self.run_lock.release()
            self.run_lock = None

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ValueError as err:  # jsonargparse's "Problem with given class_path" around the real reason
            self.release_run_lock()
            cause = unavailable_cause(err)
            if cause is None:
                raise
            raise cause from None
        except BaseException:
            self.release_run_lock()
            raise

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)
        except SIGTERMException:  # Lightning's: a SystemExit with no code, which a shell would see as success
            raise self._preempted() from None
        except OSError as err:
            if err.errno not in IO_ERRNOS:
                raise
            where = err.filename or self.run_dir
            raise RunIOError(
                f"cannot write {where} ({write_failure_cause(err, Path(str(where)).parent)})"
            ) from err
        finally:
            self.release_run_lock()  # the kernel also drops it when the process dies, SIGKILL included

    def after_fit(self) -> None:
        """A relaunch that resumed from the last checkpoint of a completed fit (the attempt before it was killed
        between that checkpoint and its summary) trains and logs nothing: one validation pass on the restored
        weights gives its summary the metrics the killed attempt did not record."""
        from lightning.pytorch.utilities.model_helpers import is_overridden

        trainer: Any = self.trainer
        summary = next((c for c in trainer.callbacks if isinstance(c, RunSummary)), None)
        if summary is None or not summary.resumed_at_the_end(trainer):
            return
        if self.run_dir is not None and _read_json(self.run_dir / "summary.json").get("metrics"):
            return  # a finished record from before keeps its metrics (a relaunch of a finished run)
        if is_overridden("validation_step", self.model) and self.trainer.limit_val_batches != 0:
            print(
                "litlab: resumed at the end of training; validating to record the run's metrics",
                file=sys.stderr,
            )
            trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
            summary.record_fit(trainer)

    def _preempted(self) -> RunPreempted:
        import signal

        callbacks: list[Callback] = getattr(self.trainer, "callbacks", [])
        callback = next((c for c in callbacks if isinstance(c, PreemptionCheckpoint)), None)
        name = callback.signal_name if callback else "SIGTERM"
        step = self.trainer.global_step
        saved = (
            f"checkpoint at step {step} saved"
            if callback and callback.saved_step == step
            else "no checkpoint"
        )
        return RunPreempted(
            f"preempted by {name} at step {step} ({saved}); resume with --ckpt_path last",
            status=f"preempted: {name} at step {step}",
            signal_number=int(getattr(signal, name)),
        )

    # ---- default loggers, callbacks, plugins ----------------------------------------------------
    def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
        assert self.run_dir is not None
        trainer_cfg = self._get(self.config_init, "trainer", default={})
        user_callbacks = list(trainer_cfg.get("callbacks") or [])
        user_callbacks += [
            self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys
        ]
        run_dir, run_id = self.run_dir, self.run_dir.name
        experiment = run_dir.parent.name

        if trainer_cfg.get("default_root_dir") is None:
            kwargs["default_root_dir"] = str(run_dir)
        loggers = trainer_cfg.get("logger")
        if loggers is None or loggers is True:
            loggers = [CSVLogger(save_dir=str(run_dir), name="csv")]
            mode = wandb_mode()
            if mode != "disabled":
                run_dir.mkdir(parents=True, exist_ok=True)
                loggers.insert(
                    0,
                    WandbLogger(
                        project="litlab",
                        group=experiment,
                        name=f"{experiment}/{run_id}",
                        id=re.sub(r"[^A-Za-z0-9_-]", "-", f"{experiment}-{run_id}")[-64:],
                        save_dir=str(run_dir),
                        offline=(mode != "online"),
                        resume="allow",
                    ),
                )
            kwargs["logger"] = loggers
        if not trainer_cfg.get("plugins"):
            kwargs["plugins"] = [SafeCheckpointIO()]

        defaults: list[Callback] = [
            # before RunSummary: the checkpoint at the signal, then the status
            PreemptionCheckpoint(run_dir / "checkpoints"),
            RunSummary(
                run_dir,
                {
                    "run_id": run_id,
                    "experiment": experiment,
                    "seed": self._get(self.config, "seed_everything"),
                },
            ),
        ]
        divergence_check = self._get(self.config, "stop_on_divergence", default=True)
        if divergence_check and not _has(user_callbacks, StopOnDivergence):
            # first: a diverged step is neither checkpointed nor recorded as finished
            defaults.insert(0, StopOnDivergence())
        if not _has(user_callbacks, ExactResume):
            defaults.append(ExactResume())  # generators and epoch position in every checkpoint
        if not _has(user_callbacks, SaveAdapters):
            defaults.append(SaveAdapters())  # a no-op for models without adapters
        if (
            not _has(user_callbacks, ModelCheckpoint)
            and trainer_cfg.get("enable_checkpointing", True) is not False
        ):
            defaults.append(ModelCheckpoint(dirpath=str(run_dir / "checkpoints"), save_last=True))
        if (
            not _has(user_callbacks, ProgressBar)
            and trainer_cfg.get("enable_progress_bar", True) is not False
        ):
            defaults.append(RichProgressBar())
        if loggers and not _has(user_callbacks, LearningRateMonitor):
            defaults.append(LearningRateMonitor(logging_interval="step"))
        self.trainer_defaults = {**self.trainer_defaults, "callbacks": defaults}
        return super().instantiate_trainer(**kwargs)


class ShortErrorParser(LightningArgumentParser):
    """A refused argument prints the error and the ``--help`` tip, not the whole usage block (50 lines for fit)."""

    def print_usage(self, file: Any = None) -> None:
        print(f"usage: {self.prog} [options]", file=file or sys.stderr)


class _Parsed(Exception):
    pass


class _ParseOnly(LitlabCLI):
    def before_instantiate_classes(self) -> None:
        raise _Parsed


def check_fit_args(args: list[str]) -> None:
    """Parse ``litlab fit`` arguments exactly as a run does (configs resolved, class paths and init args checked)
    and stop before anything is built or written; ``ConfigError`` with the parser's message if refused."""
    import sys

    from jsonargparse import ArgumentError

    from litlab.lit_modules.core.errors import ConfigError

    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when args come from both places
    try:
        _ParseOnly(
            args=list(args),
            parser_kwargs={"parser_mode": "yaml", "exit_on_error": False, "fit": {"exit_on_error": False}},
        )
    except _Parsed:
        return
    except (ArgumentError, ValueError, TypeError) as err:
        raise ConfigError(" ".join(str(err).split())[:2000]) from err
    except SystemExit as err:  # a parser that printed its error and exited anyway
        if err.code in (0, None):
            raise
        raise ConfigError("the litlab fit parser refused these arguments (its message is above)") from None
    finally:
        sys.argv = argv


def _secondary_rank() -> bool:
    """A rank other than 0 started by a launcher (torchrun, srun, Lightning's subprocess launcher): the folder's
    lock belongs to rank 0's process."""
    import os

    return any(
        int(os.environ.get(k, "0") or 0) != 0 for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "NODE_RANK")
    )


def _checkpoint_folders(cfg: Any, run_dir: Path) -> list[Path]:
    """Where the run's checkpoints are: ``<run>/checkpoints`` and the ``dirpath`` of every ModelCheckpoint the config
    names (Lightning's ``ckpt_path="last"`` looks in all of them too)."""
    folders = [run_dir / "checkpoints"]
    for entry in (cfg.get("trainer") or {}).get("callbacks") or []:
        init_args = entry.get("init_args") if hasattr(entry, "get") else None
        dirpath = init_args.get("dirpath") if init_args is not None and hasattr(init_args, "get") else None
        if dirpath and "ModelCheckpoint" in str(entry.get("class_path", "")) and Path(dirpath) not in folders:
            folders.append(Path(dirpath))
    return folders


def _has(callbacks: list[Any], kind: type) -> bool:
    return any(isinstance(c, kind) for c in callbacks)


def _finished(run_dir: Path) -> bool:
    return _read_json(run_dir / "summary.json").get("status") == "finished"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
