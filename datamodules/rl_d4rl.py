"""D4RL-layout HDF5 files: writer, one reader for D4RL files and Minari data sets, and their cache paths.

The layout is D4RL's (Fu et al., "D4RL: Datasets for Deep Data-Driven Reinforcement Learning", arXiv
2004.07219; the ``d4rl`` package's ``offline_env.py``).

D4RL v2 keys: ``observations`` [N, d_s] f32, ``actions`` [N, d_a] f32, ``next_observations`` [N, d_s] f32,
``rewards`` [N] f32, ``terminals`` [N] bool, ``timeouts`` [N] bool, ``infos/*``, ``metadata/*``. ``terminals``
is true termination; ``timeouts`` is time-limit truncation (bootstrapped). Minari files (``main_data.hdf5``,
one group ``episode_<i>`` per episode with T+1 observations, ``terminations``/``truncations``) are converted
to the same flat arrays on load, so real D4RL/Minari data run the same configs unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from litlab.lit_modules.core.errors import DataFileError
from litlab.lit_modules.core.io import atomic_path, cache_dir

REQUIRED = ("observations", "actions", "rewards", "terminals")
# D4RL's data-set levels: random, medium (≈ 1/3 of the expert return), medium-replay, expert, medium ∪ expert
LEVELS = ("random", "medium", "medium-replay", "expert", "medium-expert")


def dataset_path(env_id: str, level: str, root: Path | None = None, seed: int | None = None) -> Path:
    """``<cache>/d4rl/<env>-<level>.hdf5``: where ``litlab data d4rl`` writes and the data module looks;
    ``<env>-<level>-seed<k>.hdf5`` for a data set generated with seed ``k`` (a run's ``data`` stream: one set
    per run seed)."""
    suffix = "" if seed is None else f"-seed{seed}"
    return (root or cache_dir() / "d4rl") / f"{env_id}-{level}{suffix}.hdf5"


def cached_refs_path() -> Path:
    """The measured (random, expert) returns of toy envs, written beside the cached data sets."""
    return cache_dir() / "d4rl" / "ref_scores.json"


def write_d4rl(path: str | os.PathLike, data: dict[str, np.ndarray], metadata: dict[str, Any]) -> Path:
    """Write ``data`` (D4RL keys; ``infos/<name>`` for infos) atomically: a reader never sees half a file."""
    path = Path(path)
    n = len(data["observations"])
    for key, value in data.items():
        if len(value) != n:
            raise ValueError(f"{key} has {len(value)} rows, observations have {n}")
    dtypes = {"terminals": bool, "timeouts": bool}
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        for key, value in data.items():
            f.create_dataset(
                key, data=np.asarray(value, dtype=dtypes.get(key, np.float32)), compression="gzip"
            )
        for key, value in metadata.items():
            f[f"metadata/{key}"] = value
    return path


@contextmanager
def open_hdf5(path: str | os.PathLike) -> Iterator[h5py.File]:
    """The one way data files are read: h5py's errors (a truncated or non-HDF5 file, a damaged data set) become
    ``DataFileError`` naming the file and what to do, whether they come from opening or from reading."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            yield f
    except DataFileError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as err:
        raise DataFileError(
            f"data file {path} cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:300]}); it is "
            "truncated or not HDF5: delete it (a generated data set is made again) or download it again"
        ) from err


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    with open_hdf5(path) as f:
        if "metadata" not in f:
            return {}
        out = {}
        for k, v in f["metadata"].items():
            v = v[()]
            out[k] = v.decode() if isinstance(v, bytes) else (v.item() if hasattr(v, "item") else v)
        return out


def load_dataset(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Flat arrays ``observations, actions, next_observations, rewards, terminals, timeouts`` (+ ``episode``,
    the index of each row's episode) from a D4RL-layout file or a Minari ``main_data.hdf5``."""
    path = Path(path)
    if path.is_dir():
        path = path / "data" / "main_data.hdf5" if (path / "data").is_dir() else path / "main_data.hdf5"
    if not path.exists():
        raise FileNotFoundError(f"no data set at {path}")
    with open_hdf5(path) as f:
        if all(k in f for k in REQUIRED):
            out = {
                k: f[k][()]
                for k in ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations")
                if k in f
            }
        elif any(k.startswith("episode_") for k in f):
            out = _minari_to_flat(f)
        else:
            raise DataFileError(
                f"{path} is neither D4RL layout (keys {REQUIRED}) nor Minari (episode_* groups); "
                f"it has {sorted(f)[:10]}"
            )
    n = len(out["observations"])
    out["observations"] = out["observations"].astype(np.float32).reshape(n, -1)
    out["actions"] = out["actions"].astype(np.float32).reshape(n, -1)
    out["rewards"] = out["rewards"].astype(np.float32).reshape(n)
    out["terminals"] = out["terminals"].astype(bool).reshape(n)
    out["timeouts"] = out.get("timeouts", np.zeros(n, bool)).astype(bool).reshape(n)
    ends = out["terminals"] | out["timeouts"]
    out["episode"] = np.concatenate([[0], np.cumsum(ends)[:-1]]).astype(np.int64)
    if (
        "next_observations" not in out
    ):  # old D4RL files: s' is the next row; rows without a valid s' are dropped
        out["next_observations"] = np.concatenate([out["observations"][1:], out["observations"][-1:]])
        keep = ~out["timeouts"]
        keep[-1] &= out["terminals"][-1]
        out = {k: v[keep] for k, v in out.items()}
    out["next_observations"] = (
        out["next_observations"].astype(np.float32).reshape(len(out["observations"]), -1)
    )
    return out


def _minari_to_flat(f: h5py.File) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("observations", "next_observations", "actions", "rewards", "terminals", "timeouts")
    }
    for name in sorted((k for k in f if k.startswith("episode_")), key=lambda k: int(k.split("_")[1])):
        ep = f[name]
        obs = ep["observations"][()]
        if isinstance(obs, dict) or not isinstance(ep["observations"], h5py.Dataset):
            raise ValueError(
                f"Minari episode {name} has dict observations; only flat Box observations are supported"
            )
        parts["observations"].append(obs[:-1])
        parts["next_observations"].append(obs[1:])
        parts["actions"].append(ep["actions"][()])
        parts["rewards"].append(ep["rewards"][()])
        parts["terminals"].append(ep["terminations"][()])
        trunc = ep["truncations"][()].astype(bool)
        trunc[-1] = trunc[-1] or not bool(ep["terminations"][-1])  # the episode ends here either way
        parts["timeouts"].append(trunc)
    return {k: np.concatenate(v) for k, v in parts.items()}


def episode_returns(data: dict[str, np.ndarray]) -> np.ndarray:
    """Undiscounted return of each complete episode of a flat data set."""
    returns = np.bincount(data["episode"], weights=data["rewards"])
    last_complete = bool(data["terminals"][-1] or data["timeouts"][-1])
    return returns if last_complete else returns[:-1]
