"""LoRDO — Distributed Low-Rank Optimization with Infrequent Communication (ICML 2026). Spec: shared/methods/lordo.md.

LM pre-training whose communication pattern is the Trainer's strategy (``litlab.strategies.lordo.LoRDOStrategy``):

    mode          strategy                       optimizer (this module's ``optimizer``)
    ddp           gradient all-reduce each step  adamw
    lowrank_ddp   gradient all-reduce each step  lowrank_qh_adamw, ω = 1, EF off, update_proj_gap = 8 (GaLore)
    diloco        sync params every K steps      adamw (local states stay local), outer Nesterov
    lordo         sync params + states every K   lowrank_qh_adamw, ω = 0.97, EF on; global Q from mean Δ

Per inner step on each worker m (§3.3, ``litlab.lit_modules.lowcomm.optim.LowRankQHAdamW``):
    G = ∇F(θᵐ; ξᵐ) (+E) ;  g = P(G) ;  Adam moments on g ;  W ← W − η[ω Pᵀ(û/den) + (1−ω) G/μ]
every K steps (§3.4, the strategy): Δ = mean_m(θ̄ − θᵐ); θ ← θ̄ − Δ; average u, v, m, v, E; Q ← SVD_r(Δ).
Reconstructed (lordo.md §8): QH normaliser μ = mean of the low-rank Adam denominator; the outer rule.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from litlab.lit_modules.core.models import TinyGPT, tiny_llama
from litlab.lit_modules.lowcomm.optim import LowRankQHAdamW
from torch import Tensor

LOW_RANK_REGEX = (
    r"(q_proj|k_proj|v_proj|o_proj|up_proj|down_proj|gate_proj)\.weight$"  # attention + MLP matrices
)


class LoRDOLMModule(L.LightningModule):
    """Next-token pre-training of a decoder LM from scratch, ``{"input_ids", "labels"}`` batches.

    ``backbone="tiny_gpt"`` is ``TinyGPT`` (quick scale); ``"llama"`` a ``LlamaForCausalLM`` built from its config
    (full scale: 125M = hidden 768, 12 layers, 12 heads, MLP 2048). Nothing is downloaded for the model.
    """

    def __init__(
        self,
        optimizer: Literal["lowrank_qh_adamw", "adamw"] = "lowrank_qh_adamw",
        backbone: Literal["tiny_gpt", "llama"] = "tiny_gpt",
        vocab_size: int = 97,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        mlp_hidden: int = 256,
        block_size: int = 128,
        rank: int = 8,
        qh_omega: float = 0.97,
        error_feedback: bool = True,
        update_proj_gap: int = 0,
        low_rank_regex: str = LOW_RANK_REGEX,
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
        if backbone == "tiny_gpt":
            if mlp_hidden % d_model:
                raise ValueError(
                    f"mlp_hidden={mlp_hidden} must be a multiple of d_model={d_model} for tiny_gpt"
                )
            self.model = TinyGPT(vocab_size, d_model, n_layers, n_heads, mlp_hidden // d_model, block_size)
        elif backbone == "llama":
            self.model = tiny_llama(vocab_size, d_model, n_layers, n_heads, n_heads, mlp_hidden, block_size)
        else:
            raise ValueError(f"backbone={backbone!r} must be 'tiny_gpt' or 'llama'")
        self.low_rank_names = [
            n for n, p in self.model.named_parameters() if p.dim() == 2 and re.search(low_rank_regex, n)
        ]
        if optimizer == "lowrank_qh_adamw" and not self.low_rank_names:
            raise ValueError(
                f"low_rank_regex={low_rank_regex!r} matches no 2-D parameter of the {backbone} model"
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
        comm = getattr(
            self.trainer.strategy, "comm_metrics", None
        )  # after the step: includes this step's sync
        if comm is not None:
            self.log_dict(comm(), rank_zero_only=True)

    def validation_step(self, batch, batch_idx: int) -> None:
        loss = self._loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)
        self.log("val/ppl", torch.exp(loss), sync_dist=True)

    def on_fit_start(self) -> None:
        mode = getattr(self.trainer.strategy, "mode", None)
        needs = {
            "lordo": "lowrank_qh_adamw",
            "lowrank_ddp": "lowrank_qh_adamw",
            "diloco": "adamw",
            "ddp": "adamw",
        }
        if mode in ("lordo", "lowrank_ddp") and self.hparams.optimizer != needs[mode]:
            raise ValueError(
                f"strategy mode={mode!r} needs model.init_args.optimizer={needs[mode]!r}, "
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
            opt = LowRankQHAdamW(
                [{"params": low, "low_rank": True}, {"params": rest, "low_rank": False}],
                lr=hp.lr,
                betas=hp.betas,
                eps=hp.eps,
                weight_decay=hp.weight_decay,
                rank=hp.rank,
                qh_omega=hp.qh_omega,
                error_feedback=hp.error_feedback,
                update_proj_gap=hp.update_proj_gap,
            )
        total = max(int(self.trainer.estimated_stepping_batches), 1)

        def warmup_cosine(step: int) -> float:
            if step < hp.warmup_steps:
                return (step + 1) / hp.warmup_steps
            progress = min(1.0, (step - hp.warmup_steps) / max(total - hp.warmup_steps, 1))
            return hp.min_lr_ratio + (1 - hp.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # the strategy's anchor, counters and ledger travel with the checkpoint (a resumed run syncs on schedule)
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if hasattr(self.trainer.strategy, "lowcomm_state_dict"):
            checkpoint["lowcomm"] = self.trainer.strategy.lowcomm_state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "lowcomm" in checkpoint and hasattr(self.trainer.strategy, "load_lowcomm_state_dict"):
            self.trainer.strategy.load_lowcomm_state_dict(checkpoint["lowcomm"])


# ---- `litlab repro lordo` report: loss vs communicated bytes ---------------------------------------------
def _curve(run_dir: Path) -> tuple[list[float], list[float], list[float]]:
    import csv

    bytes_, loss, sims = [], [], []
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path) as f:
            for row in csv.DictReader(f):
                if row.get("comm/bytes_total") and row.get("train/loss"):
                    bytes_.append(float(row["comm/bytes_total"]))
                    loss.append(float(row["train/loss"]))
                if row.get("lordo/subspace_similarity"):
                    sims.append(float(row["lordo/subspace_similarity"]))
    return bytes_, loss, sims


def report(res: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Card report hook: a table of val loss and bytes per run, a loss-vs-bytes plot, the derived ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, numbers = [], {}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    summaries, seen = {}, set()
    for name, r in res["runs"].items():
        run_dir = Path(r["runs"][0]["run_dir"])
        summary = json.loads((run_dir / "summary.json").read_text())["metrics"]
        if run_dir in seen or "val/loss" not in summary or "comm/bytes_total" not in summary:
            continue  # a second card entry reading another metric of the same run
        seen.add(run_dir)
        summaries[name] = summary
        b, loss, sims = _curve(run_dir)
        steps = summary.get("comm/num_syncs", 0)
        rows.append(
            f"| {name} | {summary['val/loss']:.4f} | {summary['comm/bytes_total']:.4g} | "
            f"{summary['comm/bytes_per_step']:.5g} | {int(steps)} | "
            f"{(f'{min(sims):.4f}–{max(sims):.4f}' if sims else '—')} |"
        )
        if b:
            k = max(1, len(loss) // 30)
            smooth = [sum(loss[i : i + k]) / len(loss[i : i + k]) for i in range(0, len(loss), k)]
            ax.plot([max(x, 1.0) for x in b[::k]], smooth, label=name)
        if sims and name.startswith("lordo"):
            numbers[f"{name}_similarity_min"] = min(sims[1:] or sims)
            numbers[f"{name}_similarity_max"] = max(sims[1:] or sims)
    ax.set_xscale("log")
    ax.set_xlabel("communicated payload bytes per worker")
    ax.set_ylabel("train loss (smoothed)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out_dir / "lordo_loss_vs_bytes.png"
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

    def ratio(a: str, b: str, key: str) -> float | None:
        if a in summaries and b in summaries and summaries[b][key]:
            return summaries[a][key] / summaries[b][key]
        return None

    for name, (a, b, key) in {
        "bytes_ratio_lordo_ddp_k8": ("lordo", "ddp", "comm/bytes_per_step"),
        "bytes_ratio_lordo_ddp_k32": ("lordo_k32", "ddp", "comm/bytes_per_step"),
        "val_loss_ratio_lordo_lowrank_ddp": ("lordo", "lowrank_ddp", "val/loss"),
        "val_loss_ratio_lordo_ddp": ("lordo", "ddp", "val/loss"),
    }.items():
        value = ratio(a, b, key)
        if value is not None:
            numbers[name] = value
    markdown = "\n".join(
        [
            "## Loss and communication",
            "",
            "| run | val loss | bytes total | bytes/step | syncs | subspace similarity (min–max) |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    return {"figures": [path], "markdown": markdown, "numbers": numbers}
