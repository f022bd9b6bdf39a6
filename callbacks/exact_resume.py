"""``ExactResume``: a fit resumed from a checkpoint continues the uninterrupted fit, batch for batch.

Lightning restores weights, optimisers and loop counters, but not three things that decide what the next batch
and the next random draw are (tests/test_resume_exact.py kills every quick config after its first checkpoint and
compares the resumed run with an uninterrupted one):

* **the random generators** of torch (CPU and CUDA), NumPy and Python: they are saved in every checkpoint and
  restored when training restarts (after the loader's position is restored, below);
* **the position in the epoch**: a plain (not ``state_dict``-able) map-style loader restarts its epoch from the
  first batch, so a run resumed mid-epoch saw the epoch's first batches twice; the batches already trained on
  are skipped (drawn and dropped: a sampler's indices after sharding and shuffling are what the loader yields);
* **an epoch-end checkpoint of an iteration-bounded run** (``max_steps``): ModelCheckpoint saves in
  ``on_train_epoch_end``, after validation; Lightning (2.6) resumes such a file as "restarted on epoch end", runs
  the epoch-end hooks a second time and counts the epoch twice, so the sampler's ``set_epoch`` skipped an epoch's
  windows and every later step was logged one step late. The loop state is rewritten, on load, to the epoch's
  completed state, which is what an uninterrupted run holds when the next epoch starts, and the next epoch
  builds its loader and iterator as an uninterrupted one does (each draws a base seed from torch's generator).

Nothing here draws a random number or touches the data of an uninterrupted run: its numbers are unchanged.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities.combined_loader import _Stateful
from torch.utils.data import IterableDataset


def rng_states() -> dict[str, Any]:
    """torch / CUDA / NumPy / Python generator states, as tensors and ints (loadable with ``weights_only``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": _to_lists(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_states(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _to_lists(x: Any) -> Any:
    return [_to_lists(v) for v in x] if isinstance(x, tuple) else x


def _epoch_end_saved(fit_loop: dict[str, Any]) -> bool:
    """Was this fit-loop state saved in ``on_train_epoch_end`` (the epoch processed, not yet completed)?"""
    cur = fit_loop.get("epoch_progress", {}).get("current", {})
    return bool(cur) and cur["ready"] == cur["started"] == cur["processed"] == cur["completed"] + 1


class ExactResume(L.Callback):
    """Saves the generators and the epoch position in every checkpoint; restores both when a fit resumes."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None
        self._epoch_completed = False

    # ---- save -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        trainer = getattr(self, "_trainer", None)
        batches = 0
        if trainer is not None:
            fit = trainer.fit_loop
            epoch = fit.epoch_progress.current
            if epoch.processed == epoch.completed:  # inside the epoch: this many batches are trained on
                batches = int(fit.epoch_loop.batch_progress.current.processed)
        return {"rng": rng_states(), "batches_in_epoch": batches}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer

    # ---- load -------------------------------------------------------------------------------------
    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        fit_loop = checkpoint.get("loops", {}).get("fit_loop")
        if fit_loop and _epoch_end_saved(fit_loop):
            _complete_epoch(fit_loop)
            self._epoch_completed = True

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._epoch_completed:
            # the next epoch starts afresh; a restarting epoch loop would take its first batch for the end of the
            # saved epoch (validation due: skip it) and log every later step one step late
            fit = trainer.fit_loop
            fit.epoch_loop.restarting = False
            # ... and like an uninterrupted run's, it makes its loader (when reloaded every epoch) and iterator
            # afresh: each draws the loader's base seed from torch's generator, restored below
            fit._resuming_from_checkpoint = False
            if trainer.reload_dataloaders_every_n_epochs:
                fit._last_train_dl_reload_epoch = -(10**9)
            self._epoch_completed = False
        if self._pending is None:
            return
        state, self._pending = self._pending, None
        skip = int(state.get("batches_in_epoch", 0))
        if skip:
            _skip_batches(trainer, skip)
        if "rng" in state:
            set_rng_states(state["rng"])


def _complete_epoch(fit_loop: dict[str, Any]) -> None:
    """Rewrite an epoch-end fit-loop state to the state at the start of the next epoch (in place)."""
    for key in ("current", "total"):
        progress = fit_loop["epoch_progress"][key]
        progress["completed"] = progress["processed"]
    batches = fit_loop.get("epoch_loop.batch_progress")
    if batches:
        batches["current"] = {k: 0 for k in batches["current"]}
        batches["is_last_batch"] = False
    for name in ("epoch_loop.scheduler_progress", "epoch_loop.automatic_optimization.optim_progress"):
        _zero_current(fit_loop.get(name))


def _zero_current(progress: Any) -> None:
    if isinstance(progress, dict):
        for k, v in progress.items():
            if k == "current" and isinstance(v, dict):
                progress[k] = {kk: 0 for kk in v}
            else:
                _zero_current(v)


def _skip_batches(trainer: L.Trainer, n: int) -> None:
    """Draw and drop the first ``n`` batches of every resumable-by-skipping train loader of this epoch."""
    combined_loader = trainer.fit_loop._combined_loader
    loaders = list(combined_loader.flattened) if combined_loader is not None else []
    to_skip = [
        i
        for i, loader in enumerate(loaders)
        # Lightning restores a stateful loader; an iterable data set keeps its own position (RL step indices)
        if not isinstance(loader, _Stateful)
        and not isinstance(getattr(loader, "dataset", None), IterableDataset)
    ]
    if not to_skip:
        return
    fetcher = trainer.fit_loop._data_fetcher
    mode_iter = getattr(getattr(fetcher, "iterator", None), "_iterator", None)
    iterators = getattr(mode_iter, "iterators", None)
    if iterators is None or len(iterators) != len(loaders):
        raise RuntimeError(
            "ExactResume: cannot find the train loaders' iterators in this Lightning release "
            "(fit_loop._data_fetcher.iterator._iterator.iterators); the resumed epoch would repeat its first batches"
        )
    for i in to_skip:
        for _ in range(n):
            next(iterators[i])
