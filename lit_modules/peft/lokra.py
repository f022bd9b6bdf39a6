"""LoKRA / LoKRA+ — "LoKRA / LoKRA+: Low Kruskal-Rank Adaptation" (ICML 2026; no arXiv id was reachable).

LoKRA  : LoRA's ΔW = s·BA, plus λ·P where P is a log-det surrogate of the Kruskal rank of A and Bᵀ.
LoKRA+ : ΔW = s·(D ⊙ C)[:d_out] (Khatri–Rao, as in the prior KRAdapter, Albert et al., ICCV 2025,
         arXiv 2508.00230), with the same penalty on D and C.
LoRA   : the baseline, mode="lora" (no penalty; ``penalty.lam`` is ignored).

Reconstructed: the paper's exact penalty, its constants and LoKRA+'s factor shapes could not be read (only the
paper's abstract and its authors' AMD ROCm blog post were). Chosen: the mean over random disjoint q-column
blocks of −log det(M̃ᵀM̃ + εI) with column-normalised M̃, ε = 1e-4, δ = 1e-6, λ = 1e-3; LoKRA+ with r₁ = r,
r₂ = ⌈d_out/r₁⌉, scale α/r₁ and C = 0 at init. ``KruskalPenalty(block_mode="fixed")`` and
``KruskalPenalty(normalize=False)`` keep the alternatives reachable.

Algorithm, per training step:
    L_task = loss(model(batch))                              # base frozen, factors trainable
    P      = mean over adapted layers of Σ_M P(M)            # M ∈ {A, Bᵀ} or {D, C}; fresh random blocks
    L      = L_task + λ(t)·P                                 # λ ramps linearly over penalty.warmup_steps
    backward; clip ‖∇‖ ≤ 1 (trainer.gradient_clip_val); step
after training: W₀ ← W₀ + s·ΔW (``merge_adapters``)

The constructors take typed groups (``litlab.lit_modules.core.config.config_part``), each declared once and
shared by both experiments: ``adapter: AdapterPlan``, ``penalty: KruskalPenalty`` and, for the language model,
``base: TinyBase``. In YAML: ``model.init_args.penalty.lam``, ``model.init_args.adapter.rank``, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litlab.lit_modules.core.adapters import (
    AdapterLinear,
    adapter_parameters,
    adapter_regularizer,
    inject_adapters,
    target_linear_names,
)
from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.hf import load_causal_lm
from litlab.lit_modules.core.kruskal import normalize_columns
from litlab.lit_modules.core.pretrain import pretrained_tiny_gpt
from litlab.lit_modules.core.rank_plan import (
    PROBE_AT_FIT_START,
    RankPlan,
    planned_ranks,
)
from litlab.lit_modules.core.schedules import warmup_then_decay_lr
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.peft.commonsense_eval import generated_answers_correct
from litlab.lit_modules.peft.lm_rank_probe import FitStartRankProbe

Mode = Literal["lora", "lokra", "lokra_plus"]
BlockMode = Literal["random", "fixed"]
MODES = ("lora", "lokra", "lokra_plus")
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "up_proj", "down_proj")  # DoRA's commonsense protocol


# ---- the typed argument groups ------------------------------------------------------------------------
@config_part
class KruskalPenalty:
    """The Kruskal-rank penalty λ·P and its schedule (reconstructed, see the module docstring).

    ``lam`` λ; ``eps`` ε added to each block's Gram; ``delta`` δ guarding zero columns in the normalisation;
    ``block_mode`` "random" (fresh disjoint blocks each step) or "fixed" (contiguous blocks); ``normalize``
    unit-norm columns first (False: the unnormalised alternative, pair it with a norm penalty); ``every``
    add the penalty every this many steps; ``warmup_steps`` ramp λ linearly over these steps (0: none).
    The random blocks of step t are drawn from the run seed's ``"penalty.blocks"`` stream + t.
    """

    lam: float = 1e-3
    eps: float = 1e-4
    delta: float = 1e-6
    block_mode: BlockMode = "random"
    normalize: bool = True
    every: int = 1
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        if self.lam < 0:
            raise ValueError(f"penalty.lam={self.lam} must be >= 0")
        if self.block_mode not in ("random", "fixed"):
            raise ValueError(f"penalty.block_mode must be 'random' or 'fixed', got {self.block_mode!r}")
        if self.every < 1:
            raise ValueError(f"penalty.every={self.every} must be >= 1")
        if self.warmup_steps < 0:
            raise ValueError(f"penalty.warmup_steps={self.warmup_steps} must be >= 0")


@config_part
class AdapterPlan:
    """Where and how large the adapters are: ``rank`` r (r₁ for LoKRA+), ``alpha`` α (scale α/r), ``r2``
    LoKRA+'s second factor's rows (None: ⌈d_out/r₁⌉), ``dropout`` on the adapter's input, ``targets`` name
    suffixes of the linear layers to adapt (or one regex).

    ``rank_plan``: CSPLoRA's per-module ranks averaging ``rank`` (α fixed, so each module's scale is α/r_l): a
    plan file written by ``litlab plan``, or ``"probe"``: the fit probes its frozen base itself when it sets up,
    reading ``probe_batches`` training batches (``litlab.lit_modules.peft.lm_rank_probe`` says why and how)."""

    rank: int = 4
    alpha: float = 8.0
    r2: int | None = None
    dropout: float = 0.0
    targets: tuple[str, ...] | str = DEFAULT_TARGETS
    rank_plan: str | None = None
    probe_batches: int = 20  # batches the CSPLoRA probe reads (rank_plan "probe" and `litlab plan`)

    def __post_init__(self) -> None:
        if self.probe_batches < 1:
            raise ValueError(f"adapter.probe_batches={self.probe_batches} must be >= 1")


@config_part
class TinyBase:
    """The frozen base of the quick scale: a TinyGPT pre-trained for ``pretrain_steps`` on the first half of
    the local corpus (cached; ``litlab.lit_modules.core.pretrain.pretrained_tiny_gpt``). The run seed's
    ``"backbone"`` stream seeds its initialisation and its pre-training windows: one base per run seed, so a
    card's evidence spans several bases, not one."""

    pretrain_steps: int = 300
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    block_size: int = 128


# defaults of the constructors (frozen, so one shared instance is safe)
MATRIX_ADAPTER = AdapterPlan(rank=8, alpha=8.0, r2=8, targets=("layer",))  # 1024 trainable numbers at 64×64
LM_ADAPTER = AdapterPlan()
PENALTY = KruskalPenalty()
TINY_BASE = TinyBase()


# ---- the Kruskal penalty (reconstructed) -----------------------------------------------------------------
def _column_blocks(n: int, q: int, mode: BlockMode, generator: torch.Generator | None) -> Tensor:
    """Indices ``[nb, q]`` of disjoint q-column blocks; leftover columns sit out this step."""
    nb = n // q
    if nb == 0:
        raise ValueError(f"block size q={q} is larger than the number of columns n={n}")
    if mode == "fixed":
        order = torch.arange(n)
    elif mode == "random":
        order = torch.randperm(n, generator=generator)
    else:
        raise ValueError(f"block_mode must be 'random' or 'fixed', got {mode!r}")
    return order[: nb * q].reshape(nb, q)


def blockwise_logdet_penalty(
    M: Tensor,
    q: int | None = None,
    generator: torch.Generator | None = None,
    eps: float = 1e-4,
    delta: float = 1e-6,
    block_mode: BlockMode = "random",
    normalize: bool = True,
) -> Tensor:
    """``P(M) = −(1/nb) Σ_S log det(M̃_Sᵀ M̃_S + εI)`` over disjoint q-column blocks S.

    Reconstructed: the paper says the penalty maximises "the log-determinant of each sub-matrix to promote
    column-wise linear independence"; the blocks, normalisation and ε are our choice. ``M`` is
    ``[q_rows, n]``; its columns are the vectors that should be k-independent. The block size defaults to
    the row count, i.e. the maximal Kruskal rank. ``P ≈ −q·log(1+ε)`` when every block is orthonormal and
    grows without bound as any block's columns become parallel. ``normalize=False`` skips step 1.
    """
    q = M.shape[0] if q is None else q
    Mn = normalize_columns(M, delta) if normalize else M  # 1. unit-norm columns: P(cM) = P(M)
    blocks = _column_blocks(M.shape[1], q, block_mode, generator).to(M.device)  # 2. disjoint blocks S
    Ms = Mn[:, blocks].permute(1, 0, 2)  # [nb, rows, q]
    gram = Ms.transpose(1, 2) @ Ms + eps * torch.eye(q, device=M.device, dtype=M.dtype)  # 3. G_S + εI
    # Cholesky is cheaper than slogdet and G is SPD by construction (+εI).
    chol = torch.linalg.cholesky(gram)
    logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    return -logdet.mean()  # 4. P(M) = −mean_S log det


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be 'lora', 'lokra' or 'lokra_plus', got {mode!r}")


def inject_lokra(
    model: nn.Module, mode: Mode, plan: AdapterPlan, probed: RankPlan | None = None
) -> dict[str, AdapterLinear]:
    """LoRA and LoKRA share the low-rank branch; LoKRA+ uses the Khatri–Rao branch (r₁ = rank). Ranks: uniform,
    or from ``plan.rank_plan``'s file, or from ``probed`` (the plan a ``"probe"`` fit made at its start)."""
    check_mode(mode)
    extra = {"r2": plan.r2} if mode == "lokra_plus" else {}
    targets = plan.targets if isinstance(plan.targets, str) else list(plan.targets)
    rank: int | dict[str, int] = plan.rank
    if probed is not None:
        probed.check_matches(target_linear_names(model, targets))
        rank = probed.ranks(plan.rank)
    elif plan.rank_plan == PROBE_AT_FIT_START:
        raise ValueError(
            f"adapter.rank_plan={PROBE_AT_FIT_START!r} is probed by the language model when its fit sets up; "
            "inject_lokra needs that plan (probed=) or a plan file"
        )
    elif plan.rank_plan is not None:
        rank = planned_ranks(plan.rank_plan, target_linear_names(model, targets), r_base=plan.rank)
    return inject_adapters(
        model,
        targets,
        rank=rank,
        alpha=plan.alpha,
        dropout=plan.dropout,
        kind="khatri_rao" if mode == "lokra_plus" else "lora",
        **extra,
    )


class LoKRARule:
    """The part LoKRA adds to an adapted model: the Kruskal penalty. Its effect on the factors is logged by
    ``litlab.callbacks.adapter_stats.AdapterSpectrumCallback`` (configured in configs/lokra/*.yaml)."""

    def __init__(self, adapted: Mapping[str, AdapterLinear], penalty: KruskalPenalty):
        self.adapted, self.config = adapted, penalty
        self.blocks_seed = derive_seed("penalty.blocks")

    def penalty(self, step: int) -> Tensor:
        """Mean over layers of P(A) + P(Bᵀ) (or P(D) + P(C)); step t's blocks drawn from the stream's seed + t."""
        cfg = self.config
        gen = torch.Generator().manual_seed(self.blocks_seed + step)
        return adapter_regularizer(
            self.adapted,
            lambda _m, _b, branch: sum(
                blockwise_logdet_penalty(
                    M,
                    generator=gen,
                    eps=cfg.eps,
                    delta=cfg.delta,
                    block_mode=cfg.block_mode,
                    normalize=cfg.normalize,
                )
                for M in branch.kruskal_factors()
            ),
        )


class _LoKRABase(L.LightningModule):
    """Shared step logic of the two LoKRA experiments; subclasses build ``self.model`` and ``task_loss``."""

    adapted: dict[str, AdapterLinear]

    def _adapt(self, mode: Mode, adapter: AdapterPlan, penalty: KruskalPenalty) -> None:
        """The adapters now, or, with ``adapter.rank_plan="probe"``, once ``setup`` has probed the base."""
        check_mode(mode)
        self.mode = mode
        self.penalty_cfg = as_config(KruskalPenalty, penalty, "penalty")
        self.adapter_cfg = as_config(AdapterPlan, adapter, "adapter")
        self.adapted = {}
        self.rank_plan_artefact: RankPlan | None = None  # the plan probed at fit start (rank_plan "probe")
        if self.adapter_cfg.rank_plan != PROBE_AT_FIT_START:
            self._inject(None)
        elif not isinstance(self, FitStartRankProbe):
            raise ValueError(
                f"adapter.rank_plan={PROBE_AT_FIT_START!r}: only LoKRALanguageModel probes its base; "
                f"{type(self).__name__} takes a plan file"
            )

    def _inject(self, probed: RankPlan | None) -> None:
        self.adapted = inject_lokra(self.model, self.mode, self.adapter_cfg, probed)
        self.rule = LoKRARule(self.adapted, self.penalty_cfg)

    def task_loss(self, batch) -> Tensor:
        raise NotImplementedError

    def current_lam(self) -> float:
        cfg = self.penalty_cfg
        if self.mode == "lora" or cfg.lam == 0:
            return 0.0
        ramp = 1.0 if cfg.warmup_steps == 0 else min(1.0, (self.global_step + 1) / cfg.warmup_steps)
        return cfg.lam * ramp

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss_task = self.task_loss(batch)
        lam = self.current_lam()
        loss = loss_task
        if lam > 0 and self.global_step % self.penalty_cfg.every == 0:
            penalty = self.rule.penalty(self.global_step)
            loss = loss_task + lam * penalty  # L = L_task + λ(t)·P
            self.log("train/penalty", penalty)
        self.log("train/loss_task", loss_task, prog_bar=True)
        self.log("train/loss", loss)
        return loss

    def merge_adapters(self) -> None:
        for layer in self.adapted.values():
            layer.merge()


class LoKRAMatrixApprox(_LoKRABase):
    """The mechanism check: fit ``s·ΔW ≈ T`` for a fixed 64×64 target with one adapted frozen (zero) linear
    layer named ``layer``, at an equal budget of trainable numbers.

    The input is the identity batch, so the layer's output *is* (W₀ + s·ΔW)ᵀ and the loss
    ``‖output − Tᵀ‖²_F / ‖T‖²_F`` runs through the adapter's ordinary forward. Adam, ``lr``.
    """

    def __init__(
        self,
        mode: Mode = "lokra",
        dim: int = 64,
        adapter: AdapterPlan = MATRIX_ADAPTER,
        penalty: KruskalPenalty = PENALTY,
        lr: float = 1e-2,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential()
        self.model.add_module("layer", nn.Linear(dim, dim, bias=False))
        nn.init.zeros_(self.model.layer.weight)
        self._adapt(mode, adapter, penalty)
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


class LoKRALanguageModel(FitStartRankProbe, _LoKRABase):
    """Adapt a frozen causal LM with LoRA / LoKRA / LoKRA+ on next-token loss (tiny end-to-end run and the
    paper's scale: DoRA's commonsense protocol, AdamW with linear warm-up then linear decay).

    ``backbone="tiny_gpt"`` is the TinyGPT described by ``base`` (pre-trained locally on the first half of the
    local text corpus, cached); any other value is a Hugging Face model id or local folder (full scale), loaded
    by ``litlab.lit_modules.core.hf.load_causal_lm``, which fails at once offline with what to download.
    Batches are ``{"input_ids", "labels"[, "attention_mask"]}`` with labels already next-token aligned.
    Validation logs ``val/loss`` and, on a Hugging Face backbone with ``eval_max_new_tokens`` > 0 and prompt/response records, the protocol's
    ``val/commonsense_acc``: the label of a greedy response of at most that many tokens against the record's
    (``commonsense_eval``; the DataModule's ``tokenizer`` decodes, ``datamodules.commonsense``).
    """

    def __init__(
        self,
        mode: Mode = "lokra",
        backbone: str = "tiny_gpt",
        adapter: AdapterPlan = LM_ADAPTER,
        penalty: KruskalPenalty = PENALTY,
        base: TinyBase = TINY_BASE,
        lr: float = 3e-3,
        weight_decay: float = 0.0,
        warmup_steps: int = 30,
        dtype: str = "float32",
        eval_max_new_tokens: int = 32,
    ):
        super().__init__()
        self.save_hyperparameters()
        if backbone == "tiny_gpt":
            base = as_config(TinyBase, base, "base")
            self.model = pretrained_tiny_gpt(
                steps=base.pretrain_steps,
                d_model=base.d_model,
                n_layers=base.layers,
                n_heads=base.heads,
                block_size=base.block_size,
                seed=derive_seed("backbone"),
            )
        else:
            self.model = load_causal_lm(backbone, dtype=dtype)
        self._adapt(mode, adapter, penalty)

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
        dm = self.trainer.datamodule
        # the protocol's accuracy needs prompt/response records (datamodules.commonsense; it has pad_token_id): plain
        # text windows (LocalTextDataModule) have no answer to score
        responses = getattr(dm, "pad_token_id", None) is not None
        if self.hparams.backbone != "tiny_gpt" and self.hparams.eval_max_new_tokens > 0 and responses:
            correct = generated_answers_correct(
                self.model, dm.tokenizer, batch, self.hparams.eval_max_new_tokens, dm.pad_token_id
            )
            self.log("val/commonsense_acc", correct.float().mean(), batch_size=len(correct))

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(adapter_parameters(self.adapted), lr=hp.lr, weight_decay=hp.weight_decay)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        # DoRA's protocol: warm-up then linear decay to 0
        sched = warmup_then_decay_lr(
            opt, warmup_steps=min(hp.warmup_steps, total), total_steps=total, decay="linear"
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
