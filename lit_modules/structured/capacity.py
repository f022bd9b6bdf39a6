"""Deployment at a parameter budget, and ``CapacitySweep``: validation loss against budget ("the continuum").

A budget is a fraction f of the selected blocks' dense parameter count ``Σ_i m_i n_i``; the other parameters
(embeddings, norms, LM head) are kept as they are and not counted in f. A run that carries a structured surrogate
(a callback with ``structured_blocks()``, e.g. SALAAD's) is deployed by HPA on its ``(L, S)``; a dense run is
compressed post hoc (truncated SVD with the same HPA shrink rule + the top-``posthoc_density`` entries of the
residual; SALAAD spec §6 (A)).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import lightning as L
import torch
from torch import Tensor, nn

from litlab.lit_modules.structured.lm import BLOCKS, find_blocks, short_name
from litlab.lit_modules.structured.sparse_lowrank import (
    ENERGY,
    Parts,
    factorize,
    hpa_surrogates,
    posthoc_surrogates,
)

FRACTIONS = (1.0, 0.6, 0.45, 0.35, 0.25, 0.15)


@runtime_checkable
class StructuredSource(Protocol):
    """What a structure method hands to deployment: name -> (layer, L, S)."""

    def structured_blocks(self) -> dict[str, tuple[nn.Linear, Tensor, Tensor]]: ...


@dataclass
class Deployment:
    weights: dict[str, Tensor]  # name -> X̂
    ranks: dict[str, int]  # name -> k'
    block_params: int  # counted parameters of the deployed blocks (k'(m + n) + nnz)
    dense_block_params: int  # Σ m n
    source: str  # "hpa" or "posthoc"
    parts: Parts  # name -> (U diag(σ), Vᵀ, S) at the deployed rank

    @property
    def fraction(self) -> float:
        return self.block_params / self.dense_block_params


def deploy(
    blocks: dict[str, tuple[nn.Linear, Tensor, Tensor]] | dict[str, nn.Linear],
    fraction: float,
    posthoc_density: float = 0.05,
    energy: float = ENERGY,
) -> Deployment:
    """The surrogate weights at ``fraction`` of the blocks' dense parameters: HPA on ``(L, S)`` when the values are
    ``(layer, L, S)`` triples, post-hoc compression of the layers' weights when they are layers."""
    first = next(iter(blocks.values()))
    layers = {n: (v[0] if isinstance(v, tuple) else v) for n, v in blocks.items()}
    dense = sum(lin.weight.numel() for lin in layers.values())
    budget = fraction * dense
    if isinstance(first, tuple):
        factors = {n: factorize(L_, S_, energy) for n, (_, L_, S_) in blocks.items()}
        weights, ranks, count, parts = hpa_surrogates(factors, budget)
        source = "hpa"
    else:
        weights, ranks, count, parts = posthoc_surrogates(
            {n: lin.weight for n, lin in layers.items()}, budget, posthoc_density, energy
        )
        source = "posthoc"
    return Deployment(weights, ranks, count, dense, source, parts)


@contextlib.contextmanager
def swapped(layers: dict[str, nn.Linear], weights: dict[str, Tensor]):
    """Temporarily replace each layer's weight by its surrogate."""
    saved = {n: layers[n].weight.detach().clone() for n in weights}
    try:
        with torch.no_grad():
            for n, w in weights.items():
                layers[n].weight.copy_(w.to(layers[n].weight.dtype))
        yield
    finally:
        with torch.no_grad():
            for n, w in saved.items():
                layers[n].weight.copy_(w)


def structured_source(trainer: L.Trainer) -> StructuredSource | None:
    for cb in trainer.callbacks:
        if isinstance(cb, StructuredSource) and cb.structured_blocks():  # a source with blocks attached
            return cb
    return None


@torch.no_grad()
def eval_loss(pl_module: L.LightningModule, loader) -> float:
    """Batch-size-weighted mean of ``pl_module.lm_loss`` over ``loader`` (what Lightning's ``val/loss`` is)."""
    was_training = pl_module.training
    pl_module.eval()
    total, count = 0.0, 0
    for batch in loader:
        batch = {k: v.to(pl_module.device) for k, v in batch.items()}
        n = batch["input_ids"].shape[0]
        total += float(pl_module.lm_loss(batch)) * n
        count += n
    pl_module.train(was_training)
    return total / max(count, 1)


class CapacitySweep(L.Callback):
    """At the end of each validation (not the sanity check), the val loss of the deployed model at every budget
    in ``fractions``: logs ``val/loss@<f>``, ``capacity/params@<f>`` (counted fraction) and, for a structured run,
    ``capacity/full_fraction`` (the budget above which HPA keeps every energy rank) and the ranks at each budget
    (``capacity/rank@<f>/<block>`` when ``log_ranks``). The module must have ``lm_loss(batch)``."""

    def __init__(
        self,
        fractions: tuple[float, ...] = FRACTIONS,
        blocks: str = BLOCKS,
        posthoc_density: float = 0.05,
        energy: float = ENERGY,
        log_ranks: bool = False,
    ) -> None:
        if not fractions or any(not 0.0 <= f <= 1.0 for f in fractions):
            raise ValueError(f"fractions={fractions} must be a non-empty list of numbers in [0, 1]")
        self.fractions, self.pattern = [float(f) for f in fractions], blocks
        self.posthoc_density, self.energy, self.log_ranks = posthoc_density, energy, log_ranks

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if not hasattr(pl_module, "lm_loss"):
            raise TypeError(f"CapacitySweep needs {type(pl_module).__name__}.lm_loss(batch)")
        source = structured_source(trainer)
        blocks = source.structured_blocks() if source is not None else find_blocks(pl_module, self.pattern)
        layers = {n: (v[0] if isinstance(v, tuple) else v) for n, v in blocks.items()}
        loaders = trainer.val_dataloaders
        loader = loaders[0] if isinstance(loaders, list | tuple) else loaders
        limit = trainer.num_val_batches[0] if trainer.num_val_batches else float("inf")
        if math.isfinite(limit):  # the batches Lightning's own validation saw (limit_val_batches)
            loader = list(itertools.islice(loader, int(limit)))
        metrics = {}
        for f in self.fractions:
            dep = deploy(blocks, f, self.posthoc_density, self.energy)
            with swapped(layers, dep.weights):
                metrics[f"val/loss@{f:g}"] = eval_loss(pl_module, loader)
            metrics[f"capacity/params@{f:g}"] = dep.fraction
            if self.log_ranks:
                for n, k in dep.ranks.items():
                    metrics[f"capacity/rank@{f:g}/{short_name(n)}"] = float(k)
        if source is not None:
            metrics["capacity/full_fraction"] = deploy(
                blocks, 1.0, self.posthoc_density, self.energy
            ).fraction
        pl_module.log_dict(metrics, on_step=False, on_epoch=True)
