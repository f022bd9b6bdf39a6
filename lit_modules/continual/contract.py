"""What the continual-learning family needs from the parts it is plugged into, written down and checked once.

``SequentialLoRA`` (``harness.py``) and every method built on it walk a task sequence inside one ``fit``: they
read the DataModule through ``self.trainer.datamodule`` (the Trainer has run its ``setup`` already) and call
the callbacks that want to hear about a finished task. Any DataModule and callback that provide the members
below work; ``litlab.datamodules.continual.ContinualDataModule`` and
``litlab.callbacks.continual.AccuracyMatrixCallback`` are the ones the project ships.

* ``TaskTestSets``     what an evaluation needs: the number of tasks and each task's test loader
                       (``AccuracyMatrixCallback`` needs only this).
* ``ContinualData``    what the harness needs: ``TaskTestSets`` plus the task layout over epochs, the class
                       set of each task, each task's training data in order, and what the backbone is built
                       from.
* ``TaskEndCallback``  a callback the harness calls as ``on_task_end(trainer, module, t)`` after its own work
                       at the end of task ``t`` and before that epoch's checkpoint.

``check_data(dm, protocol, user)`` (``litlab.lit_modules.core.contracts.check_data``, re-exported here) raises
``ContractError`` naming the class and the first missing member; the harness calls it once, when it builds
the model (``setup``), and ``task_end_callbacks`` once per fit; ``AccuracyMatrixCallback`` checks
``TaskTestSets`` in its ``setup``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any, Literal, Protocol, runtime_checkable

from torch import Tensor
from torch.utils.data import DataLoader

from litlab.lit_modules.core.contracts import check_data
from litlab.lit_modules.core.errors import ContractError

__all__ = ["ContinualData", "TaskEndCallback", "TaskTestSets", "check_data", "task_end_callbacks"]


@runtime_checkable
class TaskTestSets(Protocol):
    """Per-task test data, for the accuracy matrix R[i, j] (accuracy on task j after training task i)."""

    num_tasks: int

    def task_test_loader(self, t: int, batch_size: int = 512) -> DataLoader:
        """Task t's test set, batches of (x, y) with global class labels."""
        ...


@runtime_checkable
class ContinualData(TaskTestSets, Protocol):
    """A task sequence served over one fit: task t owns epochs [t·E, (t+1)·E), E = ``epochs_per_task``.

    ``input_kind`` and ``pretext_inputs`` (the unlabelled training inputs a local backbone is pre-trained on,
    or None when the backbone comes from elsewhere) may be set in ``setup``: the harness reads them after
    it."""

    epochs_per_task: int
    num_classes: int  # classes over all tasks: rows of the classifier
    input_kind: Literal["image", "tokens", "text"]
    pretext_inputs: Tensor | None
    scenario_kind: Literal[
        "class", "domain"
    ]  # class-incremental (new classes per task) or domain-incremental
    cumulative: (
        bool  # task t trains on tasks 0..t (joint training): prototypes of all seen tasks are refreshed
    )

    def task_of_epoch(self, epoch: int) -> int:
        """The task trained at this epoch."""
        ...

    def train_classes(self, t: int) -> list[int]:
        """The classes whose logits the training loss sees at task t."""
        ...

    def task_train_loader(self, t: int, batch_size: int = 256) -> DataLoader:
        """Task t's training data in a fixed order (statistics passes, prototypes)."""
        ...


@runtime_checkable
class TaskEndCallback(Protocol):
    """A Lightning callback that also hears about the end of each task."""

    def on_task_end(self, trainer: Any, pl_module: Any, t: int) -> None: ...


def task_end_callbacks(callbacks: Iterable[Any]) -> list[TaskEndCallback]:
    """The callbacks that define ``on_task_end``, each checked to accept ``(trainer, pl_module, t)``."""
    out = []
    for cb in callbacks:
        if not isinstance(cb, TaskEndCallback):
            continue
        hook = cb.on_task_end
        try:
            inspect.signature(hook).bind(None, None, 0)
        except TypeError as err:
            raise ContractError(
                f"{type(cb).__name__}.on_task_end must accept (trainer, pl_module, t) "
                f"({TaskEndCallback.__name__}): {err}"
            ) from err
        except ValueError:  # no signature to read (a builtin): trust it
            pass
        out.append(cb)
    return out
