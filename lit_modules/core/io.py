"""Files that a crash never leaves half-written, and the one rule for where caches live.

Every file litlab writes for later reading (summaries, cards, cached models and data sets, adapters) goes through
``atomic_path``: write to a temporary name beside the target, then ``os.replace`` it in, so a reader, a killed run
or a second process writing the same cache sees the old file or the new one, never a mix.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """Where locally built models and data sets are cached: ``$LITLAB_CACHE``, else ``runs/cache``.

    An empty ``LITLAB_CACHE`` (``export LITLAB_CACHE=`` to "unset" it) means the default, not the working directory,
    where cache files would land among the user's own."""
    return Path(os.environ.get("LITLAB_CACHE") or "runs/cache")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success move it onto ``path`` (a file or a folder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        if (
            tmp.is_dir() and path.is_dir()
        ):  # a folder cannot replace a non-empty folder: keep the first one made
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


@contextmanager
def one_builder(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.<name>.lock`` beside it while ``path`` is checked and built: two processes that need
    the same cached artefact (the two workers of ``litlab repro --jobs 2``, two test workers) build it once, and
    the second loads what the first wrote. The kernel drops the lock when its holder dies, killed or not."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (fsynced before the rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
