"""LoKRA on a task where the adapter's rank binds and the paper's metric (accuracy) is read: the medium scale of
"LoKRA / LoKRA+: Low Kruskal-Rank Adaptation" (ICML 2026).

The paper fine-tunes 7B-8B LLMs on Commonsense170K and reports accuracy; a CPU cannot. This is the CPU stand-in
the card's medium scale runs (seeds/lokra.yaml, issue 33): CSPLoRA's token-ViT task (a TinyViT pre-trained on 40
base classes, 20 novel classes behind an orthogonal input shift, ``datamodules.synth_tokens.PlanningTaskData``),
adapters on ``embed`` + ``qkv, proj, fc1, fc2`` of its 4 blocks (17 modules) and a linear head, trained together
with AdamW; ``val/acc`` on the 2000 held-out novel-class samples. The frozen backbone and the warmed-up head are
CSPLoRA's (``csplora.frozen_token_vit_and_head``), so ``mode="lora"`` at rank r and α = 2r is CSPLoRA's
``plan="uniform"`` at ``r_base = r`` (a test holds them equal).

Per training step (``_LoKRABase.training_step``):
    L_task = CE(head(backbone + s·ΔW(x)), y)         # ΔW = BA (LoRA, LoKRA) or (D ⊙ C)[:d_out] (LoKRA+)
    L      = L_task + λ·P                             # LoKRA, LoKRA+: P the Kruskal log-det penalty (reconstructed)
``adapt=False`` is the frozen-backbone floor: the head alone trains, with the same optimiser and steps.
The penalty, λ = 1e-3, and LoKRA+'s factor shapes are reconstructed (``lokra`` module docstring says how).
"""

from __future__ import annotations

import torch
import torchmetrics
from torch import Tensor, nn

from litlab.lit_modules.core.adapters import adapter_parameters
from litlab.lit_modules.core.config import as_config
from litlab.lit_modules.peft.contract import PlanningData
from litlab.lit_modules.peft.csplora import TARGETS, TOKEN_VIT, TokenViTBase, frozen_token_vit_and_head
from litlab.lit_modules.peft.lokra import PENALTY, AdapterPlan, KruskalPenalty, Mode, _LoKRABase

# the medium card's design: r = 4, alpha = 2r (seeds/lokra.yaml, amendment of 2026-12-07)
CLASSIFIER_ADAPTER = AdapterPlan(rank=4, alpha=8.0, targets=TARGETS)


class LoKRAClassifier(_LoKRABase):
    """LoRA / LoKRA / LoKRA+ adapters on the frozen token ViT plus a linear head (``adapt=False``: head only)."""

    def __init__(
        self,
        mode: Mode = "lokra",
        adapter: AdapterPlan = CLASSIFIER_ADAPTER,
        penalty: KruskalPenalty = PENALTY,
        base: TokenViTBase = TOKEN_VIT,
        adapt: bool = True,
        lr: float = 2e-3,
        head_warmup_steps: int = 100,
        head_warmup_lr: float = 1e-2,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.base_cfg = as_config(TokenViTBase, base, "base")
        self.adapter_plan = as_config(AdapterPlan, adapter, "adapter")
        if self.adapter_plan.rank_plan is not None:
            raise ValueError(
                f"adapter.rank_plan={self.adapter_plan.rank_plan!r}: LoKRAClassifier uses uniform ranks; "
                "CSPLoRAClassifier plans them on this task"
            )
        self.adapted = {}
        self.model: nn.Module | None = None
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=2)  # resized in setup

    def setup(self, stage: str) -> None:
        if self.model is not None:
            return
        dm: PlanningData = self.trainer.datamodule
        hp = self.hparams
        self.model, _, self.head = frozen_token_vit_and_head(
            dm, self.base_cfg, hp.head_warmup_steps, hp.head_warmup_lr, type(self).__name__
        )
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(
            num_classes=dm.num_classes, average="micro"
        )
        if hp.adapt:
            self._adapt(hp.mode, self.adapter_plan, hp.penalty)
        else:
            self.mode, self.penalty_cfg = "lora", as_config(KruskalPenalty, hp.penalty, "penalty")

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.model.forward_features(x))

    def task_loss(self, batch) -> Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.val_acc.update(self(x).argmax(-1), y)
        self.log("val/acc", self.val_acc, on_epoch=True)

    def on_validation_epoch_end(self) -> None:
        self.log("adapters/params", float(sum(p.numel() for p in adapter_parameters(self.adapted))))

    def configure_optimizers(self):
        params = adapter_parameters(self.adapted) + list(self.head.parameters())
        return torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=0.0)
