"""LoRDO — "LoRDO: Distributed Low-Rank Optimization with Infrequent Communication" (ICML 2026, arXiv 2602.04396).

LM pre-training whose communication pattern is the Trainer's strategy (``litlab.strategies.lordo.LoRDOStrategy``):

    mode          strategy                       optimizer (this module's ``optimizer``)
    ddp           gradient all-reduce each step  adamw
    lowrank_ddp   gradient all-reduce each step  lowrank_qh_adamw, ω = 1, EF off, update_proj_gap = 8 (GaLore,
                                                 arXiv 2403.03507)
    diloco        sync params every K steps      adamw (local states stay local), outer Nesterov (DiLoCo,
                                                 arXiv 2311.08105)
    lordo         sync params + states every K   lowrank_qh_adamw, ω = 0.97, EF on; global Q from mean Δ

Per inner step on each worker m (``litlab.lit_modules.lowcomm.optim.LowRankQHAdamW``):
    G = ∇F(θᵐ; ξᵐ) (+E) ;  g = P(G) ;  Adam moments on g ;  W ← W − η[ω Pᵀ(û/den) + (1−ω) G/μ]
every K steps (the strategy): Δ = mean_m(θ̄ − θᵐ); θ ← θ̄ − Δ; average u, v, m, v, E; Q ← SVD_r(Δ).
Reconstructed (only the paper's abstract and introduction could be read): the QH normaliser (chosen: μ = mean of
the low-rank Adam denominator) and the outer rule (chosen: plain averaging).

The constructor takes two typed groups (``litlab.lit_modules.core.config.config_part``): ``net: TinyDecoder``
(the model trained from scratch) and ``low_rank: LowRankSetup`` (which matrices are projected and how). In YAML:
``model.init_args.net.d_model``, ``model.init_args.low_rank.qh_omega``, ...
"""

from __future__ import annotations

import re
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.models import TinyGPT, tiny_llama
from litlab.lit_modules.core.schedules import warmup_then_decay_lr
from litlab.lit_modules.lowcomm.contract import CommReporter
from litlab.lit_modules.lowcomm.optim import LowRankQHAdamW

LOW_RANK_REGEX = (
    r"(q_proj|k_proj|v_proj|o_proj|up_proj|down_proj|gate_proj)\.weight$"  # attention + MLP matrices
)
NEEDS_OPTIMIZER = {
    "lordo": "lowrank_qh_adamw",
    "lowrank_ddp": "lowrank_qh_adamw",
}  # strategy mode -> optimizer


@config_part
class TinyDecoder:
    """The decoder LM trained from scratch: ``backbone="tiny_gpt"`` is ``TinyGPT`` (quick scale), ``"llama"`` a
    ``LlamaForCausalLM`` built from its config (full scale: 125M = d_model 768, 12 layers, 12 heads, MLP 2048).
    Nothing is downloaded for the model."""

    backbone: Literal["tiny_gpt", "llama"] = "tiny_gpt"
    vocab_size: int = 97
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    mlp_hidden: int = 256
    block_size: int = 128


@config_part
class LowRankSetup:
    """The low-rank optimizer's own settings (``optimizer="lowrank_qh_adamw"``; ignored by AdamW): ``rank`` r of
    each projector, ``qh_omega`` ω (1: no full-rank term), ``error_feedback`` E, ``update_proj_gap`` > 0 refreshes
    Q from the current gradient every so many steps (GaLore; 0: the strategy sets Q), ``low_rank_regex`` which
    2-D parameters are projected."""

    rank: int = 8
    qh_omega: float = 0.97
    error_feedback: bool = True
    update_proj_gap: int = 0
    low_rank_regex: str = LOW_RANK_REGEX


NET = TinyDecoder()
LOW_RANK = LowRankSetup()


class LoRDOLMModule(L.LightningModule):
    """Next-token pre-training of a decoder LM from scratch, ``{"input_ids", "labels"}`` batches; AdamW or the
    low-rank QH-AdamW, warm-up then cosine decay to ``min_lr_ratio``·lr."""

    def __init__(
        self,
        optimizer: Literal["lowrank_qh_adamw", "adamw"] = "lowrank_qh_adamw",
        net: TinyDecoder = NET,
        low_rank: LowRankSetup = LOW_RANK,
        lr: float = 3e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 1e-5,
        warmup_steps: int = 0,
        min_lr_ratio: float = 0.1,
    ):
        super().__init__()
        self.save_hyperparameters()
        if optimizer not in ("lowrank_qh_adamw", "adamw"):
            raise ValueError(f"optimizer={optimizer!r} must be 'lowrank_qh_adamw' or 'adamw'")
        self.net = n = as_config(TinyDecoder, net, "net")
        self.low_rank = as_config(LowRankSetup, low_rank, "low_rank")
        if n.backbone == "tiny_gpt":
            if n.mlp_hidden % n.d_model:
                raise ValueError(
                    f"net.mlp_hidden={n.mlp_hidden} must be a multiple of net.d_model={n.d_model} for tiny_gpt"
                )
            self.model = TinyGPT(
                n.vocab_size, n.d_model, n.n_layers, n.n_heads, n.mlp_hidden // n.d_model, n.block_size
            )
        elif n.backbone == "llama":
            self.model = tiny_llama(
                n.vocab_size, n.d_model, n.n_layers, n.n_heads, n.n_heads, n.mlp_hidden, n.block_size
            )
        else:
            raise ValueError(f"net.backbone={n.backbone!r} must be 'tiny_gpt' or 'llama'")
        regex = self.low_rank.low_rank_regex
        self.low_rank_names = [
            name for name, p in self.model.named_parameters() if p.dim() == 2 and re.search(regex, name)
        ]
        if optimizer == "lowrank_qh_adamw" and not self.low_rank_names:
            raise ValueError(
                f"low_rank.low_rank_regex={regex!r} matches no 2-D parameter of the {n.backbone} model"
            )

    def forward(self, input_ids: Tensor) -> Tensor:
        out = self.model(input_ids)
        return out if isinstance(out, Tensor) else out.logits

    def _loss(self, batch: dict[str, Tensor]) -> Tensor:
        logits = self(batch["input_ids"])
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self._loss(batch)  # this worker's local batch ξᵐ
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        strategy = self.trainer.strategy
        if isinstance(strategy, CommReporter):  # after the step: includes this step's sync
            self.log_dict(strategy.comm_metrics(), rank_zero_only=True)

    def validation_step(self, batch, batch_idx: int) -> None:
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/ppl", torch.exp(loss), sync_dist=True)

    def setup(self, stage: str) -> None:
        """Before the strategy builds the optimizer: a mode that needs the low-rank optimizer says so by its key."""
        strategy = self.trainer.strategy
        mode = strategy.mode if isinstance(strategy, CommReporter) else None
        if mode in NEEDS_OPTIMIZER and self.hparams.optimizer != NEEDS_OPTIMIZER[mode]:
            raise ValueError(
                f"strategy mode={mode!r} needs model.init_args.optimizer={NEEDS_OPTIMIZER[mode]!r}, "
                f"got {self.hparams.optimizer!r}"
            )

    def configure_optimizers(self):
        hp = self.hparams
        low = [p for n, p in self.model.named_parameters() if n in self.low_rank_names]
        rest = [p for n, p in self.model.named_parameters() if n not in self.low_rank_names]
        if hp.optimizer == "adamw":
            opt = torch.optim.AdamW(
                self.model.parameters(), lr=hp.lr, betas=hp.betas, eps=hp.eps, weight_decay=hp.weight_decay
            )
        else:
            lr_cfg = self.low_rank
            opt = LowRankQHAdamW(
                [{"params": low, "low_rank": True}, {"params": rest, "low_rank": False}],
                lr=hp.lr,
                betas=hp.betas,
                eps=hp.eps,
                weight_decay=hp.weight_decay,
                rank=lr_cfg.rank,
                qh_omega=lr_cfg.qh_omega,
                error_feedback=lr_cfg.error_feedback,
                update_proj_gap=lr_cfg.update_proj_gap,
            )
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        sched = warmup_then_decay_lr(
            opt, warmup_steps=hp.warmup_steps, total_steps=total, decay="cosine", min_ratio=hp.min_lr_ratio
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
