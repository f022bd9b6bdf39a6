"""How a run's checkpoints are written and read: atomically, loudly, and with ``weights_only=True`` by default."""

from __future__ import annotations

import os
import pickle
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from litlab.lit_modules.core.errors import CheckpointError, CheckpointWriteError
from litlab.lit_modules.core.io import atomic_path


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
        except (OSError, RuntimeError) as err:  # torch reports a full disk as RuntimeError ("unexpected pos")
            raise CheckpointWriteError(
                f"cannot write checkpoint {path} ({write_failure_cause(err, path.parent)}); the previous "
                "checkpoints are intact and the run stops rather than go on without the one it would resume from"
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


def write_failure_cause(err: BaseException, folder: Path) -> str:
    """Why a write failed, in words: the OS error, or for torch's own ``RuntimeError`` the free space left."""
    if isinstance(err, OSError):
        return f"{os.strerror(err.errno) if err.errno else type(err).__name__}: {err}"
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return f"{type(err).__name__}: {first_line}"
    return f"{type(err).__name__}: {first_line}; {free / 2**20:.1f} MiB free in {folder}"


def _corrupt(path: Path, err: Exception) -> CheckpointError:
    others = sorted(p.name for p in path.parent.glob("*.ckpt") if p != path)
    return CheckpointError(
        f"checkpoint {path} is truncated or corrupt ({type(err).__name__}: {err}). Delete it and "
        f"resume from another checkpoint{f' (found: {others})' if others else ''}, or start afresh."
    )


def torch_load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a litlab checkpoint outside a Trainer with the same checks."""
    return SafeCheckpointIO().load_checkpoint(path, map_location=torch.device("cpu"))


def newest_loadable_checkpoint(folders: list[Path]) -> tuple[Path | None, list[str]]:
    """The newest ``*.ckpt`` in ``folders`` (by modification time) that loads, and a line per newer one that did not:
    a run killed while writing ``last.ckpt`` resumes from its newest complete checkpoint instead of starting over."""
    found = {path for folder in folders for path in Path(folder).glob("*.ckpt")}
    candidates = sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    skipped: list[str] = []
    for path in candidates:
        try:
            SafeCheckpointIO().load_checkpoint(path, map_location="cpu")
        except CheckpointError as err:
            skipped.append(f"{path.name}: {str(err).splitlines()[0][:300]}")
            continue
        return path, skipped
    return None, skipped
