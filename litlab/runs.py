"""Where a run lives and what it logs to: the defaults every litlab run gets (how its checkpoints are written:
``litlab.checkpoint_io``). Imports neither torch nor Lightning: ``litlab --help`` reads it.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from litlab.lit_modules.core.errors import ConfigError, RunFolderBusy

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
        "stop_on_divergence",
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


def check_run_name(flag: str, name: str) -> str:
    """``--experiment`` and ``--run_id`` are folder names, not paths: a separator, ``..`` or an absolute path would
    put the run's files outside ``--runs_dir``."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or os.sep in name or "\0" in name:
        raise ConfigError(
            f"{flag} must be a folder name (no '/', '..' or absolute path): got {name!r}; runs live under --runs_dir"
        )
    return name


def run_folder(runs_dir: str | os.PathLike, experiment: str, run_id: str) -> Path:
    """``<runs_dir>/<experiment>/<run_id>``, checked to resolve inside ``runs_dir`` (a symlinked name cannot lead out)."""
    root = Path(runs_dir)
    run_dir = root / check_run_name("--experiment", experiment) / check_run_name("--run_id", run_id)
    if not run_dir.resolve().is_relative_to(root.resolve()):
        raise ConfigError(
            f"run folder {run_dir} resolves to {run_dir.resolve()}, outside --runs_dir {root.resolve()}"
        )
    return run_dir


def remove_stale_temp_files(run_dir: str | os.PathLike) -> list[Path]:
    """Delete the ``.<name>.<pid>.tmp`` files (``atomic_path``) that a killed writer left in the run folder and its
    ``checkpoints/``. Called while holding the run's lock: no live process is writing them."""
    removed = []
    for folder in (Path(run_dir), Path(run_dir) / "checkpoints"):
        for tmp in folder.glob(".*.tmp"):
            if tmp.is_file():
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
    return removed


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
