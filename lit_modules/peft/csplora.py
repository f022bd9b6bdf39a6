"""CSPLoRA: Confidence-Guided Structural Planning for Low-Rank Adaptation (H. Ding, X. Li, J. Ma, X. An, Y. Yang,
Z. Tan; ICML 2026, OpenReview WkARznT46l; Algorithm 1, Appendix D).

Probe the frozen base once, then fine-tune LoRA with the planned per-module ranks; the planner
(``core/rank_plan.py``) adds nothing per step. This module is the spec's CPU task (a token TinyViT pre-trained on 40
base classes, 20 novel classes behind an input-side orthogonal shift, LoRA on ``embed`` + ``qkv, proj, fc1,
fc2`` of 4 blocks: L = 17 modules in 5 families), with the plans the card compares:

    uniform    r_l = r_base everywhere
    csplora    probe (γ = 2) → family calibration → log smoothing → allocation (stages 1–3)
    no_smooth / no_calib / raw    the planner without one or both of stage 2's steps (Appendix B ablations)
    inverted   the csplora ranks given to the modules in reversed order (the spec's control: rank moved to
               the output side, away from the shift)

Every plan spends R_tot = L·r_base (r_min = 0 at r_base = 1, 1 at r_base = 2, r_max = 4 r_base) with α fixed at
2·r_base, so each module's scale is α / r_l (PEFT's ``rank_pattern`` semantics, as in the official code).
``rank_plan``: a plan file (``litlab plan``) used instead of probing: probe once, deploy at any budget.

Reconstructed (spec §8): the head warm-up before probing (so that confidences mean something), the inverted
control's exact form, and the toy itself; the paper's settings are LLaMA / RoBERTa fine-tuning.
"""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
import torchmetrics
from torch import Tensor, nn

from litlab.lit_modules.core.adapters import adapter_parameters, inject_adapters, target_linear_names
from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.core.io import atomic_write_json
from litlab.lit_modules.core.models import TinyViT
from litlab.lit_modules.core.pretrain import train_and_cache
from litlab.lit_modules.core.rank_plan import (
    ProbeSettings,
    RankPlan,
    classification_loss_and_confidence,
    family_of,
    probe_saliency,
)

Plan = Literal["uniform", "csplora", "no_smooth", "no_calib", "raw", "inverted"]
TARGETS = ("embed", "qkv", "proj", "fc1", "fc2")


@config_part
class TokenViTBase:
    """The frozen backbone: a token TinyViT (linear token embedding ``token_dim`` → ``width``) pre-trained with
    supervised CE on the data module's base classes (AdamW ``lr``, weight decay ``weight_decay``, batch
    ``batch_size``, ``epochs``), cached once per ``seed``."""

    width: int = 64
    depth: int = 4
    heads: int = 4
    mlp_dim: int = 128
    epochs: int = 8
    lr: float = 3e-3
    weight_decay: float = 0.05
    batch_size: int = 128
    seed: int = 0


@config_part
class PlannerConfig:
    """Stage 1's probe (``probe_batches`` batches of ``probe_batch_size``, γ and its strategy) and stage 2's
    smoothing temperature τ; stage 3's r_max = ``r_max_factor``·r_base."""

    gamma: float = 2.0
    gamma_strategy: Literal["fixed", "adaptive_std", "uniform"] = "fixed"
    probe_batches: int = 30
    probe_batch_size: int = 32
    tau: float = 1.0
    r_max_factor: int = 4


TOKEN_VIT = TokenViTBase()
PLANNER = PlannerConfig()


def pretrained_token_vit(base: TokenViTBase, x: Tensor, y: Tensor, n_classes: int) -> TinyViT:
    """Supervised pre-training on the base classes; the classification head is dropped after it."""
    args = {**vars(base), "n": len(y), "tokens": x.shape[1], "dim": x.shape[2], "classes": n_classes}

    def build() -> TinyViT:
        return TinyViT(
            width=base.width,
            depth=base.depth,
            heads=base.heads,
            mlp_dim=base.mlp_dim,
            num_classes=n_classes,
            token_dim=x.shape[2],
            num_tokens=x.shape[1],
        )

    def train(model: TinyViT) -> None:
        opt = torch.optim.AdamW(model.parameters(), lr=base.lr, weight_decay=base.weight_decay)
        g = torch.Generator().manual_seed(base.seed)
        for _ in range(base.epochs):
            for idx in torch.randperm(len(y), generator=g).split(base.batch_size):
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()

    vit = train_and_cache("csplora_token_vit", args, base.seed, build, train, threads=1)
    vit.head = nn.Identity()
    return vit.requires_grad_(False)


class CSPLoRAClassifier(L.LightningModule):
    """LoRA fine-tuning of the frozen token ViT plus a linear head, with the ranks of ``plan``."""

    def __init__(
        self,
        plan: Plan = "csplora",
        r_base: int = 1,
        r_min: int = 0,
        alpha_per_r_base: float = 2.0,
        targets: tuple[str, ...] = TARGETS,
        rank_plan: str | None = None,
        planner: PlannerConfig = PLANNER,
        base: TokenViTBase = TOKEN_VIT,
        lr: float = 2e-3,
        head_warmup_steps: int = 100,
        head_warmup_lr: float = 1e-2,
    ):
        super().__init__()
        self.save_hyperparameters()
        if plan not in Plan.__args__:
            raise ValueError(f"plan must be one of {Plan.__args__}, got {plan!r}")
        self.plan_kind, self.planner_cfg, self.base_cfg = plan, planner, base
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=2)  # resized in setup
        self.backbone: TinyViT | None = None

    # ---- model and plan, once the data are known ---------------------------------------------------------
    def _build_base(self, dm) -> None:
        """The frozen backbone and the warmed-up head, the same whether a fit or ``litlab plan`` asks: both are
        drawn from ``base.seed``, not from the global random stream."""
        if self.backbone is not None:
            return
        dm.setup("fit")
        bx, by = dm.pretrain_set()
        self.backbone = pretrained_token_vit(self.base_cfg, bx, by, int(by.max()) + 1)
        with torch.random.fork_rng():
            torch.manual_seed(40_000 + self.base_cfg.seed)
            self.head = nn.Linear(self.base_cfg.width, dm.num_classes)
            self._warm_up_head(dm.train_x, dm.train_y)
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(
            num_classes=dm.num_classes, average="micro"
        )

    def target_names(self) -> list[str]:
        return target_linear_names(self.backbone, list(self.hparams.targets))

    def make_rank_plan(self, datamodule) -> RankPlan:
        """What ``litlab plan`` calls: stage 1 on this config's frozen base, no adapters, no training."""
        self._build_base(datamodule)
        return self.probe(self.target_names(), datamodule)

    def setup(self, stage: str) -> None:
        if getattr(self, "adapted", None):
            return
        dm = self.trainer.datamodule
        self._build_base(dm)
        names = self.target_names()
        self.ranks = self.plan_ranks(names, dm)
        hp = self.hparams
        alpha = hp.alpha_per_r_base * hp.r_base
        self.adapted = dict(inject_adapters(self.backbone, names, rank=self.ranks, alpha=alpha))
        uniform = sum(hp.r_base * (m.in_features + m.out_features) for m in self._linears(names).values())
        self.n_adapter_params = sum(p.numel() for p in adapter_parameters(self.adapted))
        self.param_ratio = self.n_adapter_params / uniform

    def _linears(self, names: list[str]) -> dict[str, nn.Module]:
        return {n: self.backbone.get_submodule(n) for n in names}

    @torch.no_grad()
    def _features(self, x: Tensor) -> Tensor:
        return self.backbone.forward_features(x)

    def _warm_up_head(self, x: Tensor, y: Tensor) -> None:
        """A linear head on frozen features, full-batch Adam: confidences then mean something when probing."""
        feats = self._features(x)
        opt = torch.optim.Adam(self.head.parameters(), lr=self.hparams.head_warmup_lr)
        for _ in range(self.hparams.head_warmup_steps):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(self.head(feats), y).backward()
            opt.step()

    def probe(self, names: list[str], dm) -> RankPlan:
        """Stage 1 on ``probe_batches`` random training batches; the plan artefact."""
        cfg = self.planner_cfg
        batches = dm.probe_batches(cfg.probe_batches, cfg.probe_batch_size, seed=self.base_cfg.seed)
        settings = ProbeSettings(
            gamma_strategy=cfg.gamma_strategy,
            gamma=cfg.gamma,
            min_steps=cfg.probe_batches,
            max_steps=cfg.probe_batches,
        )

        def loss_and_confidence(model: nn.Module, batch) -> tuple[Tensor, Tensor]:
            x, y = batch
            return classification_loss_and_confidence(self.head(model.forward_features(x)), y)

        scores, stats = probe_saliency(
            self.backbone, self._linears(names), batches, loss_and_confidence, settings
        )
        return RankPlan(
            scores=scores,
            families={n: family_of(n) for n in names},
            base_model=f"token_vit(depth={self.base_cfg.depth}, width={self.base_cfg.width}, seed={self.base_cfg.seed})",
            probe={**stats, "gamma": cfg.gamma, "gamma_strategy": cfg.gamma_strategy},
            made_for_r_base=self.hparams.r_base,
            tau=cfg.tau,
        )

    def plan_ranks(self, names: list[str], dm) -> dict[str, int]:
        hp = self.hparams
        if self.plan_kind == "uniform":
            return {n: hp.r_base for n in names}
        if hp.rank_plan is not None:
            plan = RankPlan.load(hp.rank_plan)
            plan.check_matches(names)
        else:
            plan = self.probe(names, dm)
        self.rank_plan_artefact = plan
        variant = "csplora" if self.plan_kind == "inverted" else self.plan_kind
        ranks = plan.ranks(hp.r_base, hp.r_min, self.planner_cfg.r_max_factor * hp.r_base, variant=variant)
        if self.plan_kind == "inverted":
            ordered = [ranks[n] for n in names]
            ranks = dict(zip(names, reversed(ordered)))
        return ranks

    # ---- training ----------------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        root = self.trainer.default_root_dir
        if self.trainer.is_global_zero and root:
            atomic_write_json(
                f"{root}/ranks.json",
                {"plan": self.plan_kind, "r_base": self.hparams.r_base, "ranks": self.ranks},
            )
            if getattr(self, "rank_plan_artefact", None) is not None:
                self.rank_plan_artefact.save(f"{root}/rank_plan.json")

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone.forward_features(x))

    def training_step(self, batch, batch_idx: int) -> Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        x, y = batch
        self.val_acc.update(self(x).argmax(-1), y)
        self.log("val/acc", self.val_acc, on_epoch=True)

    def on_validation_epoch_end(self) -> None:
        self.log("plan/param_ratio_vs_uniform", float(self.param_ratio))
        self.log("plan/adapter_params", float(self.n_adapter_params))
        self.log(
            "plan/rank_first_block",
            float(sum(r for n, r in self.ranks.items() if n.startswith(("embed", "blocks.0.")))),
        )

    def configure_optimizers(self):
        params = adapter_parameters(self.adapted) + list(self.head.parameters())
        return torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=0.0)
