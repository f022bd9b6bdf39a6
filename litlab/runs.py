"""Where a run lives, what it logs to, and how its files are written: the defaults every litlab run gets.

A run's identity is a hash of its resolved config (minus keys that do not change what is computed) and its
seed, so re-launching the same config lands in the same folder, ``ckpt_path=last`` finds the checkpoint of
the interrupted attempt, and the reproduction harness can reuse runs that already finished.
"""

from __future__ import annotations

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

from litlab.lit_modules.core.errors import CheckpointError

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
    """Lightning's checkpoint IO (its saves are already write-then-commit), loading with
    ``weights_only=True`` by default and turning a truncated or corrupt file into a clear error."""

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
