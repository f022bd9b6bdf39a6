"""The accuracy matrix of a continual-learning run and the metrics read from it.

``R[i, j]`` = accuracy on task j's test set after training task i (class-incremental: the model predicts over
every class it has seen, no task id). The continual harness (``litlab.lit_modules.continual.harness``) calls
``on_task_end(trainer, module, t)`` on every callback that follows its ``TaskEndCallback`` contract, right
after its own task-end work and before the checkpoint of that epoch is written, so a resumed run has the rows
it had. The DataModule needs only ``TaskTestSets`` (``num_tasks``, ``task_test_loader``), checked at setup.
Logged, with T tasks and A_i the accuracy over all samples of tasks 0..i after task i:

    cl/acc        accuracy over all test samples after task T (cl/acc_task_mean: mean_j R[T, j])
    cl/maa        (1/T) Σ_i A_i
    cl/bwt        (1/(T-1)) Σ_{j<T} (R[T, j] − R[j, j])                 backward transfer (< 0: forgetting)
    cl/forgetting (1/(T-1)) Σ_{j<T} max_{i<T} (R[i, j] − R[T, j])
    cl/fwt        (1/(T-1)) Σ_{j>0} (R[j-1, j] − b_j), b_j the accuracy on task j before any training
                  (the definition of "Gradient Episodic Memory for Continual Learning", Lopez-Paz & Ranzato,
                  NeurIPS 2017; 0 − b_j in the class-incremental case, where unseen classes cannot be
                  predicted)

The matrix is saved as ``accuracy_matrix.json`` and drawn as ``accuracy_matrix.png`` in the run folder, and
the image goes to the wandb logger when there is one (``litlab.lit_modules.continual.report`` draws it and
puts the seed means of a card into its report).
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch

from litlab.lit_modules.continual.contract import TaskTestSets, check_data
from litlab.lit_modules.continual.report import draw_accuracy_matrix
from litlab.lit_modules.core.io import atomic_write_text


@torch.no_grad()
def task_accuracy(module: L.LightningModule, loader) -> tuple[int, int]:
    """(correct, total) of ``module.cl_predict`` on one task's test loader."""
    was_training = module.training
    module.eval()
    correct = total = 0
    for x, y in loader:
        pred = module.cl_predict(x.to(module.device))
        correct += int((pred.cpu() == y).sum())
        total += int(y.numel())
    module.train(was_training)
    return correct, total


def cl_metrics(
    R: list[list[float]], correct: list[list[int]], sizes: list[int], init_acc: list[float] | None = None
) -> dict[str, float]:
    """ACC, task-mean ACC, MAA, BWT, forgetting and FWT from the rows of R (row i = after task i)."""
    T = len(R)
    A = [sum(correct[i][: i + 1]) / max(sum(sizes[: i + 1]), 1) for i in range(T)]
    out = {"cl/acc": A[-1], "cl/acc_task_mean": sum(R[-1][:T]) / T, "cl/maa": sum(A) / T}
    if T > 1:
        out["cl/bwt"] = sum(R[T - 1][j] - R[j][j] for j in range(T - 1)) / (T - 1)
        out["cl/forgetting"] = sum(
            max(R[i][j] for i in range(j, T - 1)) - R[T - 1][j] for j in range(T - 1)
        ) / (T - 1)
        if init_acc is not None:
            out["cl/fwt"] = sum(R[j - 1][j] - init_acc[j] for j in range(1, T)) / (T - 1)
    return out


class AccuracyMatrixCallback(L.Callback):
    """Fills R[i, j] at every task end; logs ACC/MAA/BWT/forgetting/FWT; saves and draws the matrix."""

    def __init__(self, filename: str = "accuracy_matrix"):  # card reports read accuracy_matrix.json
        self.filename = filename
        self.R: list[list[float]] = []  # R[i][j]
        self.correct: list[list[int]] = []  # correct counts, same layout
        self.sizes: list[int] = []  # test-set size of each task
        self.init_acc: list[float] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_data(trainer.datamodule, TaskTestSets, type(self).__name__)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dm = trainer.datamodule
        if self.init_acc is None and trainer.current_epoch == 0:
            res = [task_accuracy(pl_module, dm.task_test_loader(j)) for j in range(dm.num_tasks)]
            self.init_acc = [c / max(n, 1) for c, n in res]
            self.sizes = [n for _, n in res]

    def on_task_end(self, trainer: L.Trainer, pl_module: L.LightningModule, t: int) -> None:
        dm = trainer.datamodule
        res = [task_accuracy(pl_module, dm.task_test_loader(j)) for j in range(dm.num_tasks)]
        self.sizes = [n for _, n in res]
        del self.R[t:], self.correct[t:]  # a resumed run may redo a task it had finished
        self.R.append([c / max(n, 1) for c, n in res])
        self.correct.append([c for c, _ in res])
        pl_module.log("cl/task", float(t))
        pl_module.log("cl/acc_seen", sum(self.correct[t][: t + 1]) / max(sum(self.sizes[: t + 1]), 1))
        if t == dm.num_tasks - 1:
            for k, v in self.metrics().items():
                pl_module.log(k, v)
            if trainer.is_global_zero:
                self.save(Path(trainer.default_root_dir), trainer)

    def metrics(self) -> dict[str, float]:
        return cl_metrics(self.R, self.correct, self.sizes, self.init_acc)

    def save(self, run_dir: Path, trainer: L.Trainer | None = None) -> Path:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            run_dir / f"{self.filename}.json",
            json.dumps(
                {"R": self.R, "init_acc": self.init_acc, "sizes": self.sizes, "metrics": self.metrics()},
                indent=1,
            ),
        )
        png = run_dir / f"{self.filename}.png"
        draw_accuracy_matrix(torch.tensor(self.R), png, title="R[i, j]: accuracy on task j after task i")
        for logger in trainer.loggers if trainer is not None else []:
            if type(logger).__name__ == "WandbLogger":
                logger.log_image(key="cl/accuracy_matrix", images=[str(png)])
        return png

    def state_dict(self) -> dict:
        return {"R": self.R, "correct": self.correct, "sizes": self.sizes, "init_acc": self.init_acc}

    def load_state_dict(self, state: dict) -> None:
        self.R, self.correct = [list(r) for r in state["R"]], [list(c) for c in state["correct"]]
        self.sizes, self.init_acc = list(state["sizes"]), state.get("init_acc")
