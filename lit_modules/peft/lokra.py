"""LoKRA / LoKRA+ — Low Kruskal-Rank Adaptation (ICML 2026). Spec: shared/methods/lokra.md.

LoKRA   (§3.2, §3.4): LoRA's ΔW = s·BA, plus λ·P where P is a log-det surrogate of the Kruskal rank of A and Bᵀ.
LoKRA+  (§3.3):       ΔW = s·(D ⊙ C)[:d_out] (Khatri–Rao), with the same penalty on D and C.
LoRA                : the baseline, mode="lora" (no penalty; ``lam`` is ignored).

Reconstructed, not read from the paper (lokra.md §8): the exact penalty (mean over random disjoint q-column
blocks of −log det(M̃ᵀM̃ + εI) with column-normalised M̃), ε = 1e-4, δ = 1e-6, λ = 1e-3, LoKRA+'s shapes
r₁ = r, r₂ = ⌈d_out/r₁⌉, its scale α/r₁ and C = 0 init. ``block_mode="fixed"`` and ``penalty_normalize=False``
keep the spec's alternatives reachable.

Algorithm (§3.5), per training step:
    L_task = loss(model(batch))                              # base frozen, factors trainable
    P      = mean over adapted layers of Σ_M P(M)            # M ∈ {A, Bᵀ} or {D, C}; fresh random blocks
    L      = L_task + λ(t)·P                                 # λ ramps linearly over penalty_warmup_steps
    backward; clip ‖∇‖ ≤ 1 (trainer.gradient_clip_val); step
after training: W₀ ← W₀ + s·ΔW (``merge_adapters``)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from litlab.lit_modules.core.adapters import (
    AdapterLinear,
    adapter_parameters,
    adapter_regularizer,
    inject_adapters,
)
from litlab.lit_modules.core.kruskal import blockwise_logdet_penalty
from torch import Tensor, nn

Mode = Literal["lora", "lokra", "lokra_plus"]
DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]  # DoRA commonsense protocol (§3.6)


def inject_lokra(
    model: nn.Module,
    mode: Mode,
    targets: str | list[str],
    rank: int | dict,
    alpha: float | dict,
    dropout: float = 0.0,
    r2: int | None = None,
) -> dict[str, AdapterLinear]:
    """LoRA and LoKRA share the low-rank branch; LoKRA+ uses the Khatri–Rao branch (r₁ = rank)."""
    if mode not in ("lora", "lokra", "lokra_plus"):
        raise ValueError(f"mode must be 'lora', 'lokra' or 'lokra_plus', got {mode!r}")
    extra = {"r2": r2} if mode == "lokra_plus" else {}
    return inject_adapters(
        model,
        targets,
        rank=rank,
        alpha=alpha,
        dropout=dropout,
        kind="khatri_rao" if mode == "lokra_plus" else "lora",
        **extra,
    )


class LoKRARule:
    """The part LoKRA adds to an adapted model: the Kruskal penalty. Its effect on the factors is logged by
    ``litlab.callbacks.adapter_stats.AdapterSpectrumCallback`` (configured in configs/lokra/*.yaml)."""

    def __init__(
        self,
        adapted: Mapping[str, AdapterLinear],
        eps: float,
        delta: float,
        block_mode: Literal["random", "fixed"],
        normalize: bool,
        seed: int,
    ):
        self.adapted, self.eps, self.delta = adapted, eps, delta
        self.block_mode, self.normalize, self.seed = block_mode, normalize, seed

    def penalty(self, step: int) -> Tensor:
        """§3.4: mean over layers of P(A) + P(Bᵀ) (or P(D) + P(C)); blocks drawn from seed + step."""
        gen = torch.Generator().manual_seed(self.seed + step)
        return adapter_regularizer(
            self.adapted,
            lambda _m, _b, branch: sum(
                blockwise_logdet_penalty(M, None, gen, self.eps, self.delta, self.block_mode, self.normalize)
                for M in branch.kruskal_factors()
            ),
        )


class _LoKRABase(L.LightningModule):
    """Shared step logic of the two LoKRA experiments; subclasses build ``self.model`` and ``task_loss``."""

    adapted: dict[str, AdapterLinear]

    def _setup_rule(self) -> None:
        hp = self.hparams
        self.rule = LoKRARule(
            self.adapted,
            hp.penalty_eps,
            hp.penalty_delta,
            hp.block_mode,
            hp.penalty_normalize,
            hp.penalty_seed,
        )

    def task_loss(self, batch) -> Tensor:
        raise NotImplementedError

    def current_lam(self) -> float:
        hp = self.hparams
        if hp.mode == "lora" or hp.lam == 0:
            return 0.0
        ramp = (
            1.0
            if hp.penalty_warmup_steps == 0
            else min(1.0, (self.global_step + 1) / hp.penalty_warmup_steps)
        )
        return hp.lam * ramp

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss_task = self.task_loss(batch)
        lam = self.current_lam()
        loss = loss_task
        if lam > 0 and self.global_step % self.hparams.penalty_every == 0:
            penalty = self.rule.penalty(self.global_step)
            loss = loss_task + lam * penalty  # §3.5
            self.log("train/penalty", penalty)
        self.log("train/loss_task", loss_task, prog_bar=True)
        self.log("train/loss", loss)
        return loss

    def merge_adapters(self) -> None:
        for layer in self.adapted.values():
            layer.merge()


class LoKRAMatrixApprox(_LoKRABase):
    """§6(a): fit ``s·ΔW ≈ T`` for a fixed 64×64 target with one adapted frozen (zero) linear layer.

    The input is the identity batch, so the layer's output *is* (W₀ + s·ΔW)ᵀ and the loss
    ``‖output − Tᵀ‖²_F / ‖T‖²_F`` runs through the adapter's ordinary forward.
    """

    def __init__(
        self,
        mode: Mode = "lokra",
        dim: int = 64,
        rank: int = 8,
        alpha: float = 8.0,
        r2: int | None = 8,
        lam: float = 1e-3,
        penalty_eps: float = 1e-4,
        penalty_delta: float = 1e-6,
        block_mode: Literal["random", "fixed"] = "random",
        penalty_normalize: bool = True,
        penalty_every: int = 1,
        penalty_warmup_steps: int = 0,
        penalty_seed: int = 0,
        lr: float = 1e-2,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential()
        self.model.add_module("layer", nn.Linear(dim, dim, bias=False))
        nn.init.zeros_(self.model.layer.weight)
        self.adapted = inject_lokra(self.model, mode, ["layer"], rank, alpha, 0.0, r2)
        self._setup_rule()
        self.register_buffer("eye", torch.eye(dim), persistent=False)

    def task_loss(self, batch) -> Tensor:
        T = batch["target"]
        return (self.model(self.eye) - T.T).pow(2).sum() / T.pow(2).sum()

    def validation_step(self, batch, batch_idx: int) -> None:
        T = batch["target"]
        delta = self.adapted["layer"].delta_weight()
        self.log("val/rel_err", torch.linalg.matrix_norm(delta - T) / torch.linalg.matrix_norm(T))
        self.log("val/delta_rank", torch.linalg.matrix_rank(delta, rtol=1e-5).float())

    def configure_optimizers(self):
        return torch.optim.Adam(adapter_parameters(self.adapted), lr=self.hparams.lr)


class LoKRALanguageModel(_LoKRABase):
    """§6(b) and full scale: adapt a frozen causal LM with LoRA / LoKRA / LoKRA+ on next-token loss.

    ``backbone="tiny_gpt"`` is a 2-layer TinyGPT pre-trained locally on the first half of the local text
    corpus (cached); any other value is a Hugging Face model id or local folder (full scale), loaded by
    ``litlab.lit_modules.core.hf.load_causal_lm``, which fails at once offline with what to download.
    Batches are ``{"input_ids", "labels"[, "attention_mask"]}`` with labels already next-token aligned.
    """

    def __init__(
        self,
        mode: Mode = "lokra",
        backbone: str = "tiny_gpt",
        targets: list[str] | str = DEFAULT_TARGETS,
        rank: int = 4,
        alpha: float = 8.0,
        dropout: float = 0.0,
        r2: int | None = None,
        lam: float = 1e-3,
        penalty_eps: float = 1e-4,
        penalty_delta: float = 1e-6,
        block_mode: Literal["random", "fixed"] = "random",
        penalty_normalize: bool = True,
        penalty_every: int = 1,
        penalty_warmup_steps: int = 0,
        penalty_seed: int = 0,
        lr: float = 3e-3,
        weight_decay: float = 0.0,
        warmup_steps: int = 30,
        dtype: str = "float32",
        base_pretrain_steps: int = 300,
        base_d_model: int = 64,
        base_layers: int = 2,
        base_heads: int = 4,
        block_size: int = 128,
    ):
        super().__init__()
        self.save_hyperparameters()
        if backbone == "tiny_gpt":
            from litlab.lit_modules.core.pretrain import pretrained_tiny_gpt

            self.model = pretrained_tiny_gpt(
                steps=base_pretrain_steps,
                d_model=base_d_model,
                n_layers=base_layers,
                n_heads=base_heads,
                block_size=block_size,
            )
        else:
            from litlab.lit_modules.core.hf import load_causal_lm

            self.model = load_causal_lm(backbone, dtype=dtype)
        self.adapted = inject_lokra(self.model, mode, targets, rank, alpha, dropout, r2)
        self._setup_rule()

    def _logits(self, batch) -> Tensor:
        out = (
            self.model(batch["input_ids"])
            if "attention_mask" not in batch
            else self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        )
        return out if isinstance(out, Tensor) else out.logits

    def task_loss(self, batch) -> Tensor:
        logits = self._logits(batch)
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)

    def validation_step(self, batch, batch_idx: int) -> None:
        self.log("val/loss", self.task_loss(batch), prog_bar=True)

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(adapter_parameters(self.adapted), lr=hp.lr, weight_decay=hp.weight_decay)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warm = min(hp.warmup_steps, total)

        def linear_warmup_decay(step: int) -> float:  # DoRA protocol: warmup then linear decay (§3.6)
            return (
                (step + 1) / max(warm, 1) if step < warm else max(0.0, (total - step) / max(total - warm, 1))
            )

        sched = torch.optim.lr_scheduler.LambdaLR(opt, linear_warmup_decay)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
