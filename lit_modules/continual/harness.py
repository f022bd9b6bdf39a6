"""Continual LoRA on one protocol: the LightningModule every continual method and baseline extends.

``SequentialLoRA`` is the harness and itself the unprotected baseline (sequential fine-tuning of one LoRA):

    frozen backbone (``backbone: Backbone``; TinyViT pre-trained locally without labels, its init and batch order
                    drawn from the run's ``backbone`` stream: one member of that family per run seed) + LoRA
                    on ``targets``
    train:  masked cosine CE on the current task's classes (cumulative data → joint-training upper bound)
    eval:   NCM prototypes μ_c = normalize(mean z) of each class, stored right after its task (exemplar-free)

The CPU protocol (sklearn digits, 5 tasks × 2 classes, a TinyViT pre-trained here by rotation prediction, NCM
evaluation) is the project's, not a paper's: with the masked cosine head alone, classifier bias dominated and
every method fell to near-chance class-incremental accuracy. Full-scale runs use each paper's own head.

One ``fit`` walks the tasks of a DataModule that follows ``contract.ContinualData`` (task t owns epochs
[t·E, (t+1)·E)), read through ``self.trainer.datamodule`` after the Trainer ran its ``setup``. The module
calls ``on_task_start(t, dm)`` at the first epoch of a task and ``on_task_end(t, dm)`` at its last, then every
``contract.TaskEndCallback``'s ``on_task_end(trainer, module, t)`` (the accuracy matrix), all before that
epoch's checkpoint, so ``--ckpt_path last`` resumes cleanly. Optimisation is manual: ``cl_step`` = loss →
backward → ``transform_grads`` (GPM-style hooks) → step → ``update_transform`` (Janus-LoRA's rectification) on
a snapshot of the factors.

The baselines built on it (LoRA-GPM, InfLoRA, O-LoRA) are in ``baselines.py``. Joint training is
``SequentialLoRA`` with ``data.init_args.cumulative: true``.
"""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litlab.lit_modules.continual.backbones import (
    HFViTFeatures,
    TinyGPTFeatures,
    check_backbone_available,
    pretrained_backbone,
)
from litlab.lit_modules.continual.contract import (
    ContinualData,
    TaskEndCallback,
    check_data,
    task_end_callbacks,
)
from litlab.lit_modules.core.adapters import (
    AdapterLinear,
    adapter_parameters,
    inject_adapters,
    snapshot_factors,
    target_linear_names,
    transform_adapter_updates,
)
from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.rank_plan import planned_ranks
from litlab.lit_modules.core.seeding import derive_seed


@config_part
class Backbone:
    """The frozen feature extractor. ``name="tinyvit"``: the CPU toy's TinyViT (``width``, ``depth``, ``heads``,
    ``mlp_dim``) pre-trained here without labels for ``pretrain_epochs`` at ``pretrain_lr`` (on the text
    benchmark: the locally pre-trained TinyGPT of ``width``), one per run seed; any other name is a Hugging Face
    ViT id or folder (full scale), whose hidden size ``width`` must give. In YAML:
    ``model.init_args.backbone.width``."""

    name: str = "tinyvit"
    width: int = 64
    depth: int = 2
    heads: int = 4
    mlp_dim: int = 128
    pretrain_epochs: int = 30
    pretrain_lr: float = 3e-3


BACKBONE = Backbone()  # frozen: one shared default instance is safe


class SequentialLoRA(L.LightningModule):
    """One LoRA per target layer trained over all tasks with no protection (the lower baseline)."""

    rectifies_updates = False  # Janus-LoRA sets this: snapshot factors before every step

    def __init__(
        self,
        targets: list[str] | str = ["qkv", "fc1"],  # noqa: B006
        rank: int = 4,
        alpha: float = 4.0,
        lr: float = 0.01,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        head_scale: float = 16.0,
        eval_head: Literal["ncm", "cosine"] = "ncm",
        factor_dtype: Literal["float32", "float64"] = "float32",
        optimizer: Literal["sgd", "adam"] = "sgd",
        rank_plan: str | None = None,
        backbone: Backbone = BACKBONE,
    ):
        """``rank_plan``: a CSPLoRA plan file (``litlab plan``) giving per-module ranks for this budget
        (``rank`` is then the average rank r_base; α stays fixed, so each module's scale is α / r_l)."""
        super().__init__()
        self.save_hyperparameters()
        self.backbone_cfg = as_config(Backbone, backbone, "model.init_args.backbone")
        check_backbone_available(self.backbone_cfg.name)
        if eval_head not in ("ncm", "cosine"):
            raise ValueError(f"eval_head must be 'ncm' or 'cosine', got {eval_head!r}")
        if optimizer not in ("sgd", "adam"):
            raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")
        if factor_dtype not in ("float32", "float64"):
            raise ValueError(f"factor_dtype must be 'float32' or 'float64', got {factor_dtype!r}")
        self.automatic_optimization = False
        self.adapted: dict[str, AdapterLinear] = {}
        self.task = -1
        # set by callers that step the module without a Trainer (benchmarks, tests)
        self._standalone_opt: torch.optim.Optimizer | None = None
        self._task_end_callbacks: list[TaskEndCallback] = []
        self.register_buffer("proto_means", torch.zeros(0, self.backbone_cfg.width), persistent=False)
        self.register_buffer("proto_labels", torch.zeros(0, dtype=torch.long), persistent=False)
        self.proto_tasks = torch.zeros(0, dtype=torch.long)
        self.register_buffer("class_mask", torch.zeros(0, dtype=torch.bool), persistent=False)

    # ---- construction (needs the data: input kind, class count) ---------------------------------
    def setup(self, stage: str) -> None:
        """The Trainer ran the DataModule's ``setup`` already: build the model from it (once) and check the
        callbacks that want the task ends."""
        if not self.adapted:
            self.build(self.trainer.datamodule)
        self._task_end_callbacks = task_end_callbacks(self.trainer.callbacks)

    def build(self, dm: ContinualData) -> None:
        """Backbone, adapters and classifier for a DataModule whose ``setup`` has run (by the Trainer, or by
        the caller of a module stepped without one)."""
        cfg = self.backbone_cfg
        check_data(dm, ContinualData, type(self).__name__)
        if cfg.name == "tinyvit" and dm.input_kind == "text":  # text toy: a locally pre-trained char LM
            self.backbone = TinyGPTFeatures(cfg.width, seed=derive_seed("backbone"))
        elif cfg.name == "tinyvit":  # CPU toy: pre-trained here without labels, cached
            self.backbone = pretrained_backbone(
                dm.pretext_inputs,
                dm.input_kind,
                width=cfg.width,
                depth=cfg.depth,
                heads=cfg.heads,
                mlp_dim=cfg.mlp_dim,
                epochs=cfg.pretrain_epochs,
                lr=cfg.pretrain_lr,
                seed=derive_seed("backbone"),
            )
        else:  # full scale: a Hugging Face ViT (id or local folder): the published weights, no seed
            self.backbone = HFViTFeatures(cfg.name)
            if self.backbone.width != cfg.width:
                raise ValueError(
                    f"model.init_args.backbone.width={cfg.width} but {cfg.name} has hidden size "
                    f"{self.backbone.width}: set width to it"
                )
        self.backbone.requires_grad_(False)
        self.adapted = self.inject(self.backbone)
        # float64 factors: an exact-arithmetic witness of the subspace invariants on small models
        if self.hparams.factor_dtype == "float64":
            for layer in self.adapted.values():
                for b in layer.branches.values():
                    for p in b.factors().values():
                        p.data = p.data.double()
        self.head = nn.Parameter(torch.randn(dm.num_classes, cfg.width) * 0.02)  # cosine classifier rows w_c
        self.class_mask = torch.zeros(dm.num_classes, dtype=torch.bool)

    def inject(self, backbone: nn.Module) -> dict[str, AdapterLinear]:
        hp = self.hparams
        targets = hp.targets if isinstance(hp.targets, str) else list(hp.targets)
        rank = hp.rank
        if hp.get("rank_plan"):
            rank = planned_ranks(hp.rank_plan, target_linear_names(backbone, targets), r_base=hp.rank)
        return dict(inject_adapters(backbone, targets, rank=rank, alpha=hp.alpha))

    def configure_optimizers(self):
        hp = self.hparams
        params = adapter_parameters(self.adapted) + [self.head]
        if hp.optimizer == "adam":  # InfLoRA / Janus-LoRA full-scale protocol (betas 0.9, 0.999)
            return torch.optim.Adam(params, lr=hp.lr, weight_decay=hp.weight_decay)
        return torch.optim.SGD(params, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)

    def _optimizer(self):
        return self._standalone_opt if self._standalone_opt is not None else self.optimizers()

    # ---- model ---------------------------------------------------------------------------------
    def features(self, x: Tensor) -> Tensor:
        return F.normalize(self.backbone.forward_features(x), dim=-1)

    def cosine_logits(self, z: Tensor) -> Tensor:
        return z @ F.normalize(self.head, dim=-1).T

    @torch.no_grad()
    def cl_predict(self, x: Tensor) -> Tensor:
        """NCM over the prototype bank (labels of the nearest prototypes); the cosine head if the bank is
        empty (before any task ended) or ``eval_head='cosine'``."""
        z = self.features(x)
        if self.hparams.eval_head == "cosine" or self.proto_means.shape[0] == 0:
            logits = self.cosine_logits(z)
            if self.class_mask.any() and self.hparams.eval_head == "cosine":
                logits = logits.masked_fill(~self._seen_mask(), float("-inf"))
            return logits.argmax(-1)
        return self.proto_labels[(z @ self.proto_means.T).argmax(-1)]

    def _seen_mask(self) -> Tensor:
        mask = torch.zeros_like(self.class_mask)
        mask[self.proto_labels.unique()] = True
        return mask | self.class_mask

    # ---- one training step ---------------------------------------------------------------------
    def task_loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Masked cosine CE on the classes of the current task (old logits masked)."""
        z = self.features(x)
        logits = (self.hparams.head_scale * self.cosine_logits(z)).masked_fill(
            ~self.class_mask, float("-inf")
        )
        ce = F.cross_entropy(logits, y)
        return ce, {"loss_ce": ce.detach(), "z": z}

    def loss(self, x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        loss, logs = self.task_loss(x, y)
        logs.pop("z")
        return loss, logs

    def transform_grads(self) -> None:
        """Between backward and the optimizer step (GPM / InfLoRA / LoDA hooks)."""

    def update_transform(self, module: str, branch_name: str, branch, old: dict, new: dict) -> dict:
        """Right after the step (Janus-LoRA's rectification): return the factors to keep."""
        return {}

    def cl_step(self, batch, opt, backward) -> dict[str, Tensor]:
        x, y = batch
        loss, logs = self.loss(x, y)
        opt.zero_grad()
        backward(loss)
        self.transform_grads()
        before = snapshot_factors(self.adapted) if self.rectifies_updates and self.task > 0 else None
        opt.step()
        if before is not None:
            transform_adapter_updates(self.adapted, before, self.update_transform)
        return {"loss": loss.detach(), **logs}

    def training_step(self, batch, batch_idx: int) -> None:
        logs = self.cl_step(batch, self._optimizer(), self.manual_backward)
        self.log_dict({f"train/{k}": v for k, v in logs.items()}, prog_bar=False)

    # ---- evaluating a checkpoint (``litlab test``) ------------------------------------------------
    def on_test_epoch_start(self) -> None:
        self._test_counts = torch.zeros(2, dtype=torch.long)  # correct, seen over every task's test set

    def test_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        """The restored model's predictions (``cl_predict``: NCM or the cosine head, as in the fit) on task
        ``dataloader_idx``'s test set: ``test/acc_task<j>`` per task, ``test/acc`` over all of them (at the
        fit's last checkpoint, the last row of the accuracy matrix and its ACC over samples)."""
        x, y = batch
        correct = (self.cl_predict(x) == y).sum().cpu()
        self._test_counts += torch.stack([correct, torch.tensor(len(y))])
        self.log(
            f"test/acc_task{dataloader_idx}",
            correct.float() / len(y),
            batch_size=len(y),
            add_dataloader_idx=False,
        )

    def on_test_epoch_end(self) -> None:
        correct, seen = self._test_counts.tolist()
        self.log("test/acc", correct / max(seen, 1))

    # ---- task boundaries -----------------------------------------------------------------------
    def on_fit_start(self) -> None:
        trainer, dm = self.trainer, self.trainer.datamodule
        want = dm.num_tasks * dm.epochs_per_task
        if not trainer.fast_dev_run and trainer.max_epochs != want:
            raise ValueError(
                f"trainer.max_epochs={trainer.max_epochs} but the task sequence needs "
                f"num_tasks × epochs_per_task = {dm.num_tasks} × {dm.epochs_per_task} = {want}"
            )

    def on_train_epoch_start(self) -> None:
        dm = self.trainer.datamodule
        if self.current_epoch % dm.epochs_per_task == 0 or self.task < 0:
            self.on_task_start(dm.task_of_epoch(self.current_epoch), dm)

    def on_train_epoch_end(self) -> None:
        trainer, dm = self.trainer, self.trainer.datamodule
        if (self.current_epoch + 1) % dm.epochs_per_task and not trainer.fast_dev_run:
            return
        logs = self.on_task_end(self.task, dm)
        self.log_dict({k: float(v) for k, v in logs.items()})
        for cb in self._task_end_callbacks:
            cb.on_task_end(trainer, self, self.task)

    def on_task_start(self, t: int, dm: ContinualData) -> None:
        self.task = t
        opt = self._standalone_opt
        if opt is None:
            opt = self.optimizers(use_pl_optimizer=False)
        opt.state.clear()  # a fresh optimizer state per task: no momentum carries old-task updates over
        self.class_mask = torch.zeros_like(self.class_mask)
        self.class_mask[dm.train_classes(t)] = True

    def on_task_end(self, t: int, dm: ContinualData) -> dict[str, float]:
        """Store the prototypes of task t's classes (all seen tasks' when training is cumulative)."""
        tasks = range(t + 1) if dm.cumulative else [t]
        for s in tasks:
            self._store_prototypes(s, dm)
        return (
            {"cl/invasion_rate": self.invasion_rate(t, dm)} if t > 0 and dm.scenario_kind == "class" else {}
        )

    @torch.no_grad()
    def _store_prototypes(self, t: int, dm: ContinualData) -> None:
        was = self.training
        self.eval()
        zs, ys = [], []
        for x, y in dm.task_train_loader(t):
            zs.append(self.features(x.to(self.device)))
            ys.append(y.to(self.device))
        z, y = torch.cat(zs), torch.cat(ys)
        classes = y.unique()
        means = torch.stack([F.normalize(z[y == c].mean(0), dim=-1) for c in classes])
        keep = self.proto_tasks.to(self.device) != t  # idempotent when a resumed run redoes a task
        self.proto_means = torch.cat([self.proto_means[keep], means])
        self.proto_labels = torch.cat([self.proto_labels[keep], classes])
        self.proto_tasks = torch.cat([self.proto_tasks[keep.cpu()], torch.full((len(classes),), t)])
        self.train(was)

    @torch.no_grad()
    def invasion_rate(self, t: int, dm: ContinualData) -> float:
        """Fraction of task-t test samples whose nearest prototype belongs to an old class: the feature-space
        overlap Janus-LoRA's decoupled margin loss acts on (arXiv 2605.28495)."""
        z = torch.cat([self.features(x.to(self.device)) for x, _ in dm.task_test_loader(t)])
        nearest = (z @ self.proto_means.T).argmax(-1)
        return float((self.proto_tasks.to(self.device)[nearest] != t).float().mean())

    # ---- input statistics -----------------------------------------------------------------------
    def set_stats(self, mode: Literal["off", "accumulate"], reset: bool = False) -> None:
        for layer in self.adapted.values():
            if reset:
                layer.reset_stats()
            layer.stats_mode = mode

    @torch.no_grad()
    def collect_stats(self, loader) -> dict[str, Tensor]:
        """One no-grad pass: uncentred second moment E[x xᵀ] of every adapted layer's input (float64)."""
        was = self.training
        self.eval()
        self.set_stats("accumulate", reset=True)
        for x, _ in loader:
            self.backbone.forward_features(x.to(self.device))
        self.set_stats("off")
        self.train(was)
        return {n: m.input_second_moment.clone() for n, m in self.adapted.items()}

    # ---- checkpoint: the state that is not a fixed-shape parameter --------------------------------
    def cl_state(self) -> dict:
        return {
            "task": self.task,
            "proto_means": self.proto_means.cpu(),
            "proto_labels": self.proto_labels.cpu(),
            "proto_tasks": self.proto_tasks,
            "class_mask": self.class_mask.cpu(),
            "stats": {
                n: {"C": m.input_second_moment, "n": m.n_tokens, "mode": m.stats_mode}
                for n, m in self.adapted.items()
            },
        }

    def load_cl_state(self, state: dict) -> None:
        self.task = int(state["task"])
        self.proto_means, self.proto_labels = (
            state["proto_means"].to(self.device),
            state["proto_labels"].to(self.device),
        )
        self.proto_tasks, self.class_mask = state["proto_tasks"], state["class_mask"].to(self.device)
        for n, s in state["stats"].items():
            m = self.adapted[n]
            m.input_second_moment, m.n_tokens, m.stats_mode = s["C"], int(s["n"]), s["mode"]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["continual"] = self.cl_state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "continual" in checkpoint:
            self.load_cl_state(checkpoint["continual"])
