"""Ad-hoc structured training for one parameter budget: the baselines that SALAAD's "performing comparably to ad-hoc
sparse / low-rank training" is measured against (SALAAD, arXiv 2602.00942, abstract; the paper's baseline section
could not be read, so these are ours).

``AdHocStructure`` trains the selected blocks under a hard constraint by projected gradient descent: once before the
first step and after every optimiser step, each block's weight is replaced by its projection onto the constraint set
for the budget f (a fraction of the blocks' dense parameters ``Σ m n``, as in ``capacity``):

* ``low_rank``: the rank-k truncated SVD (Eckart-Young; ``project_rank``), one k for every block, the largest with
  ``Σ k (m + n) ≤ f Σ m n`` (``uniform_rank``; 5, 9, 13 for the quick model at 15, 25, 35 %);
* ``sparse``: each block's ⌊f·mn⌋ largest-|·| entries (iterative hard thresholding, Blumensath & Davies 2009: magnitude
  pruning at every step, the support free to move);
* ``budget: 0`` with either: every block is 0 after every step, the model without blocks (the card's floor).

Why not SALAAD's own ADMM with the component left out and a hard cut at the budget (measured on the quick recipe,
seeds 0-4, 2026-12-07): its soft threshold at the first dropped value shrinks a random initial matrix's kept values
nearly to 0 and the coupling drags the blocks after them; rank-5..13 and density-0.15..0.35 models all ended at
2.69-2.71 nats deployed, at the loss of a model trained without blocks. Projecting inside that ADMM instead kept
X 0.2-0.4 (relative) away from its surrogate at ρ = 2e-2 (deployed 2.72 low-rank, 2.46 sparse at 15 %, seed 0)
and stalled learning at ρ = 0.1-0.5 (2.68-2.69).

The constraint is exact: the trained weights are the deployed model at the run's budget (``structured_blocks``
hands them to ``CapacitySweep`` / ``litlab export`` as ``(layer, L, 0)`` or ``(layer, 0, S)``), so HPA keeps every
rank and entry there and shrinks them only for smaller budgets. The projection is idempotent, so a resumed run needs
no state of its own.
"""

from __future__ import annotations

import math
from typing import Literal

import lightning as L
import torch
from torch import Tensor, nn

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.structured.lm import BLOCKS, find_blocks
from litlab.lit_modules.structured.sparse_lowrank import project_rank, top_entries


@config_part
class AdHocConfig:
    """Which structure (``low_rank`` or ``sparse``) and the budget f in [0, 1] it is trained for."""

    components: Literal["low_rank", "sparse"] = "low_rank"
    budget: float = 0.25

    def __post_init__(self) -> None:
        if self.components not in ("low_rank", "sparse"):
            raise ValueError(f"components={self.components!r} must be 'low_rank' or 'sparse'")
        if not 0.0 <= self.budget <= 1.0:
            raise ValueError(
                f"budget={self.budget} must lie in [0, 1] (a fraction of the blocks' parameters)"
            )


def uniform_rank(shapes: list[tuple[int, int]], budget: float) -> int:
    """The largest k with ``Σ k (m + n) ≤ budget · Σ m n`` (below every block's full rank: m n / (m + n) < min(m, n))."""
    dense = sum(m * n for m, n in shapes)
    per_rank = sum(m + n for m, n in shapes)
    return int(math.floor(budget * dense / per_rank))


class AdHocStructure(L.Callback):
    """Projected gradient descent of the ``blocks`` onto a rank-k or ⌊f·mn⌋-sparse set (module docstring)."""

    def __init__(self, config: AdHocConfig, blocks: str = BLOCKS) -> None:
        self.config = as_config(AdHocConfig, config, "AdHocStructure config")
        self.pattern = blocks
        self.modules: dict[str, nn.Linear] = {}
        self.rank = 0
        self._step_at_batch_start = -1

    @property
    def state_key(self) -> str:
        return "AdHocStructure"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.modules:
            self.attach(pl_module)

    def attach(self, module: nn.Module) -> None:
        """Find the blocks and project them once, so that the first step starts inside the constraint set."""
        self.modules = find_blocks(module, self.pattern)
        self.rank = uniform_rank(
            [tuple(lin.weight.shape) for lin in self.modules.values()], self.config.budget
        )
        self.project()

    def projection(self, W: Tensor) -> Tensor:
        if self.config.components == "low_rank":
            return project_rank(W, self.rank)
        return top_entries(W, math.floor(self.config.budget * W.numel()))

    @torch.no_grad()
    def project(self) -> None:
        for lin in self.modules.values():
            lin.weight.copy_(self.projection(lin.weight.detach().float()).to(lin.weight.dtype))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        self._step_at_batch_start = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if (
            trainer.global_step != self._step_at_batch_start
        ):  # an optimiser step was taken (not an accumulation)
            self.project()

    def structured_blocks(self) -> dict[str, tuple[nn.Linear, Tensor, Tensor]]:
        """name -> (layer, L, S): the trained weight as the low-rank or the sparse part (what deployment reads)."""
        out = {}
        for name, lin in self.modules.items():
            W = lin.weight.detach().float()
            zero = torch.zeros_like(W)
            out[name] = (lin, W, zero) if self.config.components == "low_rank" else (lin, zero, W)
        return out
