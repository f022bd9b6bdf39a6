"""Where a run lives, what it logs to, and how its files are written: the defaults every litlab run gets.

A run's identity is a hash of its resolved config (minus keys that do not change what is computed) and its
seed, so re-launching the same config lands in the same folder, ``ckpt_path=last`` finds the checkpoint of
the interrupted attempt, and the reproduction harness can reuse runs that already finished.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import netrc
import os
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from litlab.lit_modules.core.errors import CheckpointError, RunFolderBusy
from litlab.lit_modules.core.io import atomic_path

# Keys that name *where* or *how visibly* a run happens, not *what* it computes (the seed is kept apart:
# it is the run id's suffix, so the seeds of one config share a hash prefix).
IDENTITY_EXCLUDED_KEYS = frozenset(
    {
        "seed_everything",
        "config",
        "experiment",
        "run_id",
        "runs_dir",
        "ckpt_path",
        "subcommand",
        "verbose",
        "trainer.logger",
        "trainer.callbacks",
        "trainer.enable_progress_bar",
        "trainer.default_root_dir",
        "trainer.enable_model_summary",
        "trainer.log_every_n_steps",
    }
)


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def config_hash(config: Mapping[str, Any], length: int = 10) -> str:
    """Stable hash of a resolved config (nested dicts), ignoring ``IDENTITY_EXCLUDED_KEYS``."""
    flat = {
        k: v
        for k, v in _flatten(config).items()
        if not any(k == x or k.startswith(x + ".") for x in IDENTITY_EXCLUDED_KEYS)
        and not k.endswith("__path__")
    }
    blob = json.dumps(flat, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def default_run_id(config: Mapping[str, Any], seed: int | None) -> str:
    return f"{config_hash(config)}-s{seed if seed is not None else 'x'}"


def wandb_mode() -> str:
    """``WANDB_MODE`` if set; ``online`` when the user has logged in to wandb; ``offline`` otherwise."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        auth = netrc.netrc(os.environ.get("NETRC", Path.home() / ".netrc")).authenticators("api.wandb.ai")
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        auth = None
    return "online" if auth else "offline"


class SafeCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO, loading with ``weights_only=True`` by default and turning a truncated or corrupt
    file into a clear error; saving write-then-rename (``atomic_path``) and failing loudly: Lightning's own atomic
    save swallows a ``PermissionError`` (a run whose ``checkpoints/`` is not writable ended "finished" with no
    checkpoint), this one raises ``CheckpointError`` naming the file, so the run stops and its status says why."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if "://" in str(path):  # remote file systems: Lightning's fsspec path
            return super().save_checkpoint(checkpoint, path, storage_options=storage_options)
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__}.save_checkpoint does not take storage_options")
        path = Path(path)
        try:
            with atomic_path(path) as tmp:
                torch.save(checkpoint, tmp)
        except OSError as err:
            raise CheckpointError(
                f"cannot write checkpoint {path} ({type(err).__name__}: {err}); the run stops rather than "
                "go on without the checkpoint it would resume from"
            ) from err

    def load_checkpoint(self, path, map_location=None, weights_only: bool | None = None) -> dict[str, Any]:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"checkpoint not found: {path}")
        try:
            return super().load_checkpoint(
                path, map_location=map_location, weights_only=True if weights_only is None else weights_only
            )
        except pickle.UnpicklingError as err:
            if "Weights only load failed" in str(err):
                raise CheckpointError(
                    f"{path} holds objects that are not plain tensors/containers; load it with "
                    f"weights_only=False only if you trust its source.\n{err}"
                ) from err
            raise _corrupt(path, err) from err
        except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError) as err:
            raise _corrupt(path, err) from err


def _corrupt(path: Path, err: Exception) -> CheckpointError:
    others = sorted(p.name for p in path.parent.glob("*.ckpt") if p != path)
    return CheckpointError(
        f"checkpoint {path} is truncated or corrupt ({type(err).__name__}: {err}). Delete it and "
        f"resume from another checkpoint{f' (found: {others})' if others else ''}, or start afresh."
    )


def torch_load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a litlab checkpoint outside a Trainer with the same checks."""
    return SafeCheckpointIO().load_checkpoint(path, map_location=torch.device("cpu"))


class RunLock:
    """One writer per run folder: an advisory ``fcntl.flock`` on ``<run>/.lock``, which holds the holder's pid.

    The kernel drops the lock when its process dies (SIGKILL included), so the file a killed run leaves behind
    does not block its resume; a second live process gets ``RunFolderBusy`` naming the holder's pid at once."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / ".lock"
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        if self._fd is not None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if err.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise RunFolderBusy(
                    f"run folder {self.path.parent} is in use by process {holder} (lock {self.path}); wait for it "
                    "to end, or give this run another --run_id"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
