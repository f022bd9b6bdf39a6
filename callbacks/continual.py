"""The accuracy matrix of a continual-learning run and the metrics read from it (_lora_core.md §6).

``R[i, j]`` = accuracy on task j's test set after training task i (class-incremental: the model predicts over
every class it has seen, no task id). A ``ContinualLoRA`` module calls ``on_task_end(trainer, module, t)`` on
every callback that has it, right after its own task-end work and before the checkpoint of that epoch is
written, so a resumed run has the rows it had. Logged, with T tasks and A_i the accuracy over all samples of
tasks 0..i after task i:

    cl/acc        accuracy over all test samples after task T (cl/acc_task_mean: mean_j R[T, j])
    cl/maa        (1/T) Σ_i A_i
    cl/bwt        (1/(T-1)) Σ_{j<T} (R[T, j] − R[j, j])                 backward transfer (< 0: forgetting)
    cl/forgetting (1/(T-1)) Σ_{j<T} max_{i<T} (R[i, j] − R[T, j])
    cl/fwt        (1/(T-1)) Σ_{j>0} (R[j-1, j] − b_j), b_j the accuracy on task j before any training
                  (GEM's definition; 0 − b_j in the class-incremental case, where unseen classes cannot be predicted)

The matrix is saved as ``accuracy_matrix.json`` and drawn as ``accuracy_matrix.png`` in the run folder, and the
image goes to the wandb logger when there is one.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import torch


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

    def __init__(self, filename: str = "accuracy_matrix"):
        self.filename = filename
        self.R: list[list[float]] = []  # R[i][j]
        self.correct: list[list[int]] = []  # correct counts, same layout
        self.sizes: list[int] = []  # test-set size of each task
        self.init_acc: list[float] | None = None

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
        (run_dir / f"{self.filename}.json").write_text(
            json.dumps(
                {"R": self.R, "init_acc": self.init_acc, "sizes": self.sizes, "metrics": self.metrics()},
                indent=1,
            )
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


def draw_accuracy_matrix(R: torch.Tensor, path: Path, title: str = "", ax=None) -> None:
    """Heatmap of R (rows: after task i, columns: task j) with the values written in the cells."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(1.0 + 0.6 * R.shape[1], 0.8 + 0.6 * R.shape[0]))
    ax.imshow(R.numpy(), vmin=0, vmax=1, cmap="viridis")
    for i in range(R.shape[0]):
        for j in range(R.shape[1]):
            ax.text(
                j,
                i,
                f"{R[i, j]:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                color="white" if R[i, j] < 0.6 else "black",
            )
    ax.set_xlabel("evaluated on task j")
    ax.set_ylabel("after training task i")
    ax.set_xticks(range(R.shape[1]))
    ax.set_yticks(range(R.shape[0]))
    ax.set_title(title, fontsize=8)
    if own:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def accuracy_matrix_report(res: dict, out_dir, slug: str, timed: dict | None = None) -> dict:
    """A repro ``report_hook`` body: the mean accuracy matrix of every run (one heatmap each, in one figure),
    a table of ACC / BWT / forgetting / MAA, and — when ``timed`` modules are given — the median time per
    training step of each relative to the one named ``lora``, measured interleaved in this process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    seen_dirs, matrices, rows = set(), {}, []
    for name, run in res["runs"].items():
        dirs = tuple(r["run_dir"] for r in run["runs"])
        if dirs in seen_dirs:  # the same runs listed again under another metric
            continue
        seen_dirs.add(dirs)
        data = [
            json.loads((Path(d) / "accuracy_matrix.json").read_text())
            for d in dirs
            if (Path(d) / "accuracy_matrix.json").exists()
        ]
        if not data:
            continue
        matrices[name] = torch.tensor([d["R"] for d in data]).mean(0)
        mean = {
            k: sum(d["metrics"].get(k, float("nan")) for d in data) / len(data)
            for k in ("cl/acc", "cl/bwt", "cl/forgetting", "cl/maa")
        }
        rows.append(
            f"| {name} | {mean['cl/acc']:.3f} | {mean['cl/bwt']:.3f} | {mean['cl/forgetting']:.3f} | "
            f"{mean['cl/maa']:.3f} | {len(data)} |"
        )
    figures, numbers = [], {}
    md = [
        "## Accuracy matrices (mean over seeds)",
        "",
        "| run | ACC | BWT | forgetting | MAA | seeds |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    if matrices:
        n = len(matrices)
        cols = min(n, 4)
        fig, axes = plt.subplots(
            (n + cols - 1) // cols, cols, figsize=(3.2 * cols, 3.0 * ((n + cols - 1) // cols)), squeeze=False
        )
        for ax, (name, R) in zip(axes.flat, matrices.items()):
            draw_accuracy_matrix(R, Path(), title=name, ax=ax)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        path = out_dir / f"{slug}_accuracy_matrices.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        figures.append(path)
    if timed:
        from litlab.datamodules.continual import ContinualDataModule
        from litlab.lit_modules.continual.harness import time_training_steps

        with torch.random.fork_rng():
            torch.manual_seed(0)
            secs = time_training_steps(timed, ContinualDataModule())
        md += [
            "## Time per training step vs plain LoRA (median, interleaved, one process)",
            "",
            "| method | ms / step | ratio to LoRA |",
            "|---|---|---|",
        ]
        for name, s in secs.items():
            ratio = s / secs["lora"]
            md.append(f"| {name} | {1000 * s:.2f} | {ratio:.2f} |")
            if name != "lora":
                numbers[f"step_time_ratio_{name}"] = ratio
        numbers["step_time_ms_lora"] = 1000 * secs["lora"]
        md.append("")
    return {"figures": figures, "markdown": "\n".join(md), "numbers": numbers}
