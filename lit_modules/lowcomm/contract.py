"""What the low-communication family's parts need from each other, written down and checked once, at setup.

``litlab.strategies.lordo.LoRDOStrategy`` issues every collective of a run itself (LoRDO, "LoRDO: Distributed
Low-Rank Optimization with Infrequent Communication", arXiv 2602.04396; DiLoCo, arXiv 2311.08105; GaLore,
arXiv 2403.03507). What it needs from the parts it is plugged into:

* from the LightningModule: nothing beyond Lightning's own API — its trainable parameters (``parameters()``, the
  same order on every rank; the strategy averages them and their pseudo-gradients as one flat vector). The
  strategy carries its own state (anchor θ̄, counters, byte ledger) in the checkpoint, through Lightning's
  public ``Strategy.save_checkpoint`` / ``Strategy.load_checkpoint``.
* ``LowRankSyncOptimizer``: from the optimizer, in mode ``"lordo"`` — the low-rank matrices, their projectors,
  the states a sync averages and the projector refresh. ``litlab.lit_modules.lowcomm.optim.LowRankQHAdamW``
  provides it; modes ``ddp``, ``lowrank_ddp`` and ``diloco`` take any ``torch.optim.Optimizer``.

And what the family's LightningModule (``LoRDOLMModule``) reads from its Trainer's strategy, when there is one:

* ``CommReporter``: the strategy's ``mode`` (which optimizer the run needs) and ``comm_metrics()`` (logged after
  each step). Any other strategy (``"auto"``, plain DDP) runs the module without communication metrics.

``check_protocol`` (``litlab.lit_modules.core.contracts``) raises ``ContractError`` naming the class and the first
member it lacks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from torch import Tensor

from litlab.lit_modules.core.contracts import check_protocol


@runtime_checkable
class LowRankSyncOptimizer(Protocol):
    """The optimizer of a LoRDO run: GaLore-style moments in an r-dimensional projected space per matrix."""

    def low_rank_params(self) -> list[Tensor]:
        """The projected matrices, in parameter order (identical on every rank)."""
        ...

    def projectors_ready(self) -> bool:
        """Whether every low-rank matrix has its projector Q already."""
        ...

    def init_projectors(self, grads: Mapping[Tensor, Tensor]) -> None:
        """The first Q of each matrix, from a gradient (the all-reduced one of the first batch)."""
        ...

    def projectors(self) -> list[Tensor]:
        """Each low-rank matrix's Q, in ``low_rank_params`` order: the tensors themselves (copied into in place)."""
        ...

    def state_tensors_for_sync(self, include_error_feedback: bool = True) -> list[Tensor]:
        """The optimizer states a sync averages, in a fixed order identical on every rank (averaged in place)."""
        ...

    def refresh_projectors(self, deltas: Mapping[Tensor, Tensor], rotate: bool = True) -> list[float]:
        """New Q of each matrix from its (pseudo-gradient) Δ; returns the subspace similarity to the old Q."""
        ...


@runtime_checkable
class CommReporter(Protocol):
    """A strategy that counts its own traffic (``LoRDOStrategy``)."""

    mode: str

    def comm_metrics(self) -> dict[str, float]:
        """``comm/bytes_total``, ``comm/bytes_per_step``, ... up to the current step."""
        ...


def check_sync_optimizer(optimizer: object, user: str) -> LowRankSyncOptimizer:
    """``optimizer`` as a ``LowRankSyncOptimizer``, or ``ContractError`` naming its class and the missing member."""
    check_protocol(optimizer, LowRankSyncOptimizer, user)
    return optimizer  # type: ignore[return-value]
