"""CSPLoRA's rank planner and its artefact (H. Ding, X. Li, J. Ma, X. An, Y. Yang, Z. Tan, "CSPLoRA:
Confidence-Guided Structural Planning for Low-Rank Adaptation", ICML 2026, OpenReview WkARznT46l; Algorithm 1).

Probe once on the frozen base, deploy everywhere: the planner scores every target module by a
confidence-weighted first-order Taylor saliency of its *base* weight (stage 1, eq. for S_l), calibrates the
scores per module family and log-smooths them (stage 2), and turns them into per-module ranks for any budget
(stage 3). The artefact is the score vector (``RankPlan``), not the ranks: every backend and every budget
reads its own ranks from one probe. Pure functions; ``lit_modules/peft/csplora.py`` composes them, and every
adapter backend takes a plan through its ``rank_plan`` argument (``planned_ranks``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, cast, overload

import torch
from torch import Tensor, nn

from litlab.lit_modules.core.adapters import AdapterLinear
from litlab.lit_modules.core.io import atomic_write_json, atomic_write_text

PLAN_FORMAT = "litlab.rank_plan/1"
GammaStrategy = Literal["fixed", "adaptive_std", "uniform"]


# ---- stage 1: confidence-weighted probing ---------------------------------------------------------------
def confidence_weights(
    confidence: Tensor,
    strategy: GammaStrategy = "fixed",
    gamma: float = 2.0,
    gamma_scale: float = 1.0,
    gamma_max: float = 10.0,
    min_std: float = 1e-4,
    detach: bool = True,
) -> Tensor:
    """Per-sample weights w (sum 1) from confidences c_i: difficulty d_i = 1 − c_i, then
    fixed: w = softmax(γ d); adaptive: γ_eff = min(γ_s / std(d), γ_max), w = softmax(γ_eff (d − mean d)),
    uniform when std(d) < min_std; a batch of one gets weight 1 (weighting needs two samples).
    ``detach``: the weights are constants of the backward pass (the paper's weighted loss); ``False`` keeps them
    in the graph, so backward also differentiates softmax(γ d) (the released planner does)."""
    d = 1.0 - (confidence.detach() if detach else confidence).flatten().double()
    n = d.numel()
    if n < 1:
        raise ValueError("confidence_weights needs at least one sample")
    if strategy not in ("fixed", "adaptive_std", "uniform"):
        raise ValueError(f"gamma strategy must be 'fixed', 'adaptive_std' or 'uniform', got {strategy!r}")
    if n == 1 or strategy == "uniform" or (strategy == "fixed" and gamma == 0):
        return torch.full((n,), 1.0 / n, dtype=torch.float64)
    if strategy == "fixed":
        return torch.softmax(gamma * d, dim=0)
    sigma = d.std(unbiased=False)  # population std, as the official planner
    if sigma < min_std:
        return torch.full((n,), 1.0 / n, dtype=torch.float64)
    gamma_eff = min(gamma_scale / float(sigma), gamma_max)
    return torch.softmax(gamma_eff * (d - d.mean()), dim=0)


def classification_loss_and_confidence(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """ℓ_i = CE(logits_i, y_i) and c_i = softmax(logits_i)[y_i]."""
    loss = nn.functional.cross_entropy(logits, labels, reduction="none")
    return loss, torch.exp(-loss)


def causal_lm_loss_and_confidence(
    logits: Tensor, labels: Tensor, aligned: bool = False
) -> tuple[Tensor, Tensor]:
    """Over target tokens (label ≠ −100), shifted by one unless ``aligned`` (labels already next-token):
    ℓ_i = mean token CE, c_i = mean token probability."""
    if not aligned:
        logits, labels = logits[:, :-1], labels[:, 1:]
    mask = labels != -100
    tok = nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.clamp_min(0).reshape(-1), reduction="none"
    ).view(labels.shape)
    count = mask.sum(1).clamp_min(1)
    return (tok * mask).sum(1) / count, (torch.exp(-tok) * mask).sum(1) / count


@dataclass
class ProbeSettings:
    """Stage 1 (paper Appendix D; the stopping rule of the official planner): probe ``min_steps`` to
    ``max_steps`` batches; every ``check_every`` steps compare the total energy E = Σ_l S_l / steps and the
    top-``top_k`` modules; stop after ``patience`` checks in a row with |ΔE|/E < ``rel_tol`` and no top module
    moved more than ``rank_tol`` places. ``detach_confidence`` and ``count_bias`` (default: the paper's saliency of
    the base weight under a weighted loss with constant weights): the released planner (github.com/Ming-to/CSPLoRA,
    ``csplora.py``) keeps the weights in the graph (``detach_confidence=False``) and adds each target module's
    bias term Σ|b ⊙ ∂L_w/∂b| to its score (``count_bias=True``)."""

    gamma_strategy: GammaStrategy = "fixed"
    gamma: float = 2.0
    gamma_scale: float = 1.0
    gamma_max: float = 10.0
    min_steps: int = 50
    max_steps: int = 200
    check_every: int = 10
    rel_tol: float = 0.02
    top_k: int = 20
    rank_tol: int = 5
    patience: int = 3
    detach_confidence: bool = True
    count_bias: bool = False


def _stable(prev: list[str], now: list[str], rank_tol: int) -> bool:
    where = {n: i for i, n in enumerate(prev)}
    return all(n in where and abs(where[n] - i) <= rank_tol for i, n in enumerate(now))


@torch.no_grad()
def _restore(flags: dict[nn.Parameter, bool]) -> None:
    for p, flag in flags.items():
        p.requires_grad_(flag)
        p.grad = None


def probe_saliency(
    model: nn.Module,
    modules: Mapping[str, nn.Module],
    batches: Iterable,
    loss_and_confidence: Callable[[nn.Module, object], tuple[Tensor, Tensor]],
    settings: ProbeSettings = ProbeSettings(),  # noqa: B008  (frozen use only)
) -> tuple[dict[str, float], dict]:
    """S_l = (1/T) Σ_t Σ |W_l ⊙ ∂L_w/∂W_l| with L_w = Σ_i w_i ℓ_i (stage 1). ``modules`` maps names to the
    wrapped linears (``AdapterLinear``: its base weight; ``nn.Linear``: its weight), plus the bias term with
    ``settings.count_bias``. No parameter changes: the model runs in eval mode, only the scored parameters take
    gradients, and every ``requires_grad`` flag is put back.
    Returns the scores and the probe's statistics (steps, whether it converged, mean effective sample size)."""
    linears = {n: m.base if isinstance(m, AdapterLinear) else m for n, m in modules.items()}
    scored: dict[str, list[nn.Parameter]] = {
        n: [cast(nn.Parameter, lin.weight)]
        + ([cast(nn.Parameter, lin.bias)] if settings.count_bias and lin.bias is not None else [])
        for n, lin in linears.items()
    }
    flags = {p: p.requires_grad for p in model.parameters()}
    flags.update({p: p.requires_grad for ps in scored.values() for p in ps})
    was_training = model.training
    scores = {n: 0.0 for n in scored}
    steps, calm, converged, ess = 0, 0, False, []
    prev_energy: float | None = None
    prev_top: list[str] = []
    # Each weight's gradient is scored and freed as soon as backward has accumulated it, so at most a few of the
    # probed weights' gradients are alive at once (all of them at once is one more copy of every probed weight).
    names_of: dict[nn.Parameter, list[str]] = {}
    for n, params in scored.items():
        for param in params:
            names_of.setdefault(param, []).append(n)

    def score_and_free(weight: nn.Parameter) -> None:
        for n in names_of[weight]:
            assert weight.grad is not None  # the hook runs after backward accumulated it
            scores[n] += float((weight.detach() * weight.grad).abs().sum())
        weight.grad = None

    handles = []
    try:
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        for weight in names_of:
            weight.grad = None  # as _restore leaves it at the end
            weight.requires_grad_(True)
            handles.append(weight.register_post_accumulate_grad_hook(score_and_free))
        for batch in batches:
            loss, confidence = loss_and_confidence(model, batch)
            w = confidence_weights(
                confidence,
                settings.gamma_strategy,
                settings.gamma,
                settings.gamma_scale,
                settings.gamma_max,
                detach=settings.detach_confidence,
            ).to(loss)
            ess.append(float(1.0 / (w.detach().double() ** 2).sum()) / w.numel())
            (w * loss).sum().backward()  # scores accumulate in score_and_free
            del loss, confidence, w
            steps += 1
            if steps % settings.check_every == 0 and steps >= settings.check_every:
                energy = sum(scores.values()) / steps
                top = sorted(scores, key=scores.__getitem__, reverse=True)[: settings.top_k]
                if prev_energy is not None:
                    quiet = abs(energy - prev_energy) / max(prev_energy, 1e-30) < settings.rel_tol
                    calm = calm + 1 if quiet and _stable(prev_top, top, settings.rank_tol) else 0
                prev_energy, prev_top = energy, top
                if steps >= settings.min_steps and calm >= settings.patience:
                    converged = True
                    break
            if steps >= settings.max_steps:
                break
    finally:
        for h in handles:
            h.remove()
        _restore(flags)
        model.train(was_training)
    if steps == 0:
        raise ValueError("probe_saliency got no batches")
    stats = {"steps": steps, "converged": converged, "mean_relative_ess": sum(ess) / len(ess)}
    return {n: s / steps for n, s in scores.items()}, stats


# ---- stage 2: calibration and smoothing -----------------------------------------------------------------
def family_of(name: str) -> str:
    """A module's family: its last name part (q_proj, fc1, ...)."""
    return name.rsplit(".", 1)[-1]


def calibrate(scores: Mapping[str, float], families: Mapping[str, str]) -> dict[str, float]:
    """S'_l = S_l / mean_{m ∈ fam(l)} S_m: every family then has mean 1 (the official planner's rule)."""
    totals: dict[str, list[float]] = {}
    for n, s in scores.items():
        totals.setdefault(families[n], []).append(s)
    mean = {f: sum(v) / len(v) for f, v in totals.items()}
    return {n: s / mean[families[n]] if mean[families[n]] > 0 else 0.0 for n, s in scores.items()}


def smooth(scores: Mapping[str, float], tau: float = 1.0) -> dict[str, float]:
    """s_l = log(1 + S'_l)^(1/τ), floored at 1e-12: order kept, heavy tails compressed (Appendix A, Prop. A.4)."""
    if tau <= 0:
        raise ValueError(f"smoothing temperature tau must be > 0, got {tau}")
    return {n: max(math.log1p(s) ** (1.0 / tau), 1e-12) for n, s in scores.items()}


# ---- stage 3: budget allocation -------------------------------------------------------------------------
def coverage_rho(s: Mapping[str, float], rho_min: float = 0.6, rho_max: float = 1.0) -> float:
    """The released planner's adaptive coverage (``rho_method="coverage"``, on by default in its scripts; the paper
    fixes ρ = 1): ρ = ρ_min + (ρ_max − ρ_min)·sqrt(exp(H)/L), H the entropy of s / Σ s, clipped to [ρ_min, ρ_max].
    Flat scores give ρ_max; scores concentrated on few modules give ρ near ρ_min."""
    if not 0 < rho_min <= rho_max <= 1:
        raise ValueError(f"need 0 < rho_min <= rho_max <= 1, got rho_min={rho_min}, rho_max={rho_max}")
    values = [v for v in s.values() if v > 0]
    total = sum(values)
    if not values or total <= 0:
        return rho_max
    entropy = -sum(v / total * math.log(v / total + 1e-12) for v in values)
    rho = rho_min + (rho_max - rho_min) * math.sqrt(math.exp(entropy) / len(values))
    return max(rho_min, min(rho_max, rho))


@overload
def allocate(
    s: Mapping[str, float],
    r_base: int,
    r_min: int = 0,
    r_max: int | None = None,
    rho: float = 1.0,
    floor: Literal[True] = True,
    unplanned_rank: int | None = None,
) -> dict[str, int]: ...


@overload
def allocate(
    s: Mapping[str, float],
    r_base: int,
    r_min: int = 0,
    r_max: int | None = None,
    rho: float = 1.0,
    *,
    floor: Literal[False],
    unplanned_rank: int | None = None,
) -> dict[str, float]: ...


def allocate(
    s: Mapping[str, float],
    r_base: int,
    r_min: int = 0,
    r_max: int | None = None,
    rho: float = 1.0,
    floor: bool = True,
    unplanned_rank: int | None = None,
) -> dict[str, float] | dict[str, int]:
    """r_l = min(r_min + ⌊(R_tot − L r_min) s_l / Σ s⌋, r_max), R_tot = L r_base, r_max = 4 r_base by default;
    the leftover goes +1 at a time to modules in descending s_l (cycling, skipping those at r_max). With
    ``floor=False`` the real-valued ranks r_min + (R_tot − L r_min) s_l / Σ s (the scale-invariant structure).
    ``rho < 1``: only the smallest top-score set holding ρ of the total score shares the budget; the rest get
    r_min. ``unplanned_rank`` (the released planner with ρ < 1): the selected M modules share R_tot − M r_min
    and the rest get ``unplanned_rank`` (PEFT's default rank r for modules outside ``rank_pattern``), so the
    total exceeds R_tot by (L − M)·r."""
    names = list(s)
    L = len(names)
    if L == 0:
        raise ValueError("allocate got no modules")
    r_max = 4 * r_base if r_max is None else r_max
    if not (0 <= r_min <= r_base <= r_max):
        raise ValueError(
            f"need 0 <= r_min <= r_base <= r_max, got r_min={r_min}, r_base={r_base}, r_max={r_max}"
        )
    if not 0 < rho <= 1:
        raise ValueError(f"coverage rho must be in (0, 1], got {rho}")
    order = sorted(names, key=lambda n: s[n], reverse=True)  # stable: ties keep module order
    active = order
    if rho < 1:
        total, acc, active = sum(s.values()), 0.0, []
        for n in order:
            active.append(n)
            acc += s[n]
            if acc >= rho * total:
                break
    rest = r_min if unplanned_rank is None else unplanned_rank  # the rank of modules left out by rho
    # left-out modules spend r_min of the budget R_tot = L r_base; at an unplanned rank they spend outside it
    total_budget = L * r_base + (0 if unplanned_rank is None else (L - len(active)) * rest)
    remaining = L * r_base - (L if unplanned_rank is None else len(active)) * r_min
    mass = sum(s[n] for n in active)
    if not floor:
        return {n: r_min + remaining * s[n] / mass if n in active else float(rest) for n in names}
    ranks = {n: r_min if n in active else rest for n in names}
    for n in active:
        ranks[n] = min(r_min + math.floor(remaining * s[n] / mass), r_max)
    leftover = total_budget - sum(ranks.values())
    while leftover > 0 and any(ranks[n] < r_max for n in active):
        for n in active:
            if leftover == 0:
                break
            if ranks[n] < r_max:
                ranks[n] += 1
                leftover -= 1
    return ranks


# ---- the artefact ---------------------------------------------------------------------------------------
def module_list_hash(names: Iterable[str]) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


PlanVariant = Literal["csplora", "no_smooth", "no_calib", "raw"]


@dataclass
class RankPlan:
    """What one probe leaves: the raw scores S_l per module (in model order), their families, the settings
    it was probed with, the base model's name and a hash of its module list. Ranks are computed per budget
    (``ranks``), so one file serves every budget and backend."""

    scores: dict[str, float]
    families: dict[str, str]
    base_model: str
    probe: dict = field(default_factory=dict)
    made_for_r_base: int | None = None
    tau: float = 1.0
    format: str = PLAN_FORMAT

    @property
    def modules_hash(self) -> str:
        return module_list_hash(self.scores)

    def structure(self, variant: PlanVariant = "csplora") -> dict[str, float]:
        """The structural prior s (stage 2) of the full planner or one ablation."""
        if variant not in ("csplora", "no_smooth", "no_calib", "raw"):
            raise ValueError(f"plan variant must be csplora, no_smooth, no_calib or raw, got {variant!r}")
        x = dict(self.scores)
        if variant in ("csplora", "no_smooth"):
            x = calibrate(x, self.families)
        if variant in ("csplora", "no_calib"):
            x = smooth(x, self.tau)
        return {n: max(v, 1e-12) for n, v in x.items()}

    def ranks(
        self,
        r_base: int,
        r_min: int = 0,
        r_max: int | None = None,
        variant: PlanVariant = "csplora",
        rho: float = 1.0,
        adaptive_rho: bool = False,
    ) -> dict[str, int]:
        """Ranks for one budget. ``adaptive_rho`` (the released planner's default; the paper's is ρ = 1): ρ from
        ``coverage_rho`` of the structure, the modules left out at PEFT's default rank r_base."""
        s = self.structure(variant)
        if adaptive_rho:
            return allocate(s, r_base, r_min, r_max, coverage_rho(s), unplanned_rank=r_base)
        return allocate(s, r_base, r_min, r_max, rho)

    def check_matches(self, module_names: Iterable[str]) -> None:
        """A plan loaded onto a model whose target modules differ is refused, naming the difference."""
        names = list(module_names)
        missing = [n for n in self.scores if n not in names]
        extra = [n for n in names if n not in self.scores]
        if missing or extra:
            raise ValueError(
                f"rank plan for {self.base_model!r} ({len(self.scores)} modules) does not fit this model: "
                f"modules in the plan but not the model: {missing[:6]}{' …' if len(missing) > 6 else ''}; "
                f"in the model but not the plan: {extra[:6]}{' …' if len(extra) > 6 else ''}"
            )

    def save(self, path: str | os.PathLike) -> Path:
        body = {**asdict(self), "modules_hash": self.modules_hash}
        return atomic_write_text(path, json.dumps(body, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> RankPlan:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(
                f"rank plan {path} does not exist (make one with `litlab plan --config ...`)"
            )
        body = json.loads(path.read_text())
        if body.get("format") != PLAN_FORMAT:
            raise ValueError(
                f"{path} is not a litlab rank plan (format {body.get('format')!r}, want {PLAN_FORMAT})"
            )
        stored_hash = body.pop("modules_hash", None)
        plan = cls(**body)
        if stored_hash is not None and stored_hash != plan.modules_hash:
            raise ValueError(f"rank plan {path}: its module list does not match its hash (edited by hand?)")
        return plan


# ``rank_plan`` = this value: no plan file; the fit probes its own frozen base once, at its start (see
# ``plan_or_probe``), with the planner ``litlab plan`` runs, and writes the plan into its run folder
PROBE_AT_FIT_START = "probe"


def plan_or_probe(rank_plan: str | None, names: Iterable[str], probe: Callable[[], RankPlan]) -> RankPlan:
    """The plan a backend's ``rank_plan`` names, as a fit reads it at its start: a plan file (``litlab plan``),
    checked against the model's target modules ``names``; or, for ``PROBE_AT_FIT_START`` (and ``None``, where
    the module always plans, as ``CSPLoRAClassifier``), one call of ``probe``, the module's own
    ``make_rank_plan`` stage 1 on its frozen base."""
    if rank_plan is None or rank_plan == PROBE_AT_FIT_START:
        plan = probe()
    else:
        plan = RankPlan.load(rank_plan)
    plan.check_matches(names)
    return plan


def write_plan_into_run(
    trainer: Any, rank_plan: RankPlan | None, ranks: Mapping[str, int], /, **about: Any
) -> None:
    """At fit start, into the run folder (``trainer.default_root_dir``, rank 0 only): ``ranks.json`` (``about``
    then the ranks) and, where the fit probed or read one, the plan as ``rank_plan.json``, the artefact another
    fit's ``rank_plan`` or ``litlab plan``'s readers take."""
    root = trainer.default_root_dir
    if not (trainer.is_global_zero and root):
        return
    atomic_write_json(f"{root}/ranks.json", {**about, "ranks": dict(ranks)})
    if rank_plan is not None:
        rank_plan.save(f"{root}/rank_plan.json")


def planned_ranks(
    plan_path: str | os.PathLike,
    module_names: Iterable[str],
    r_base: int,
    r_min: int = 0,
    r_max: int | None = None,
) -> dict[str, int]:
    """What a backend's ``rank_plan`` argument does: load the plan, check it fits the model's target modules,
    and return per-module ranks for this backend's budget (r_base = its uniform rank)."""
    plan = RankPlan.load(plan_path)
    names = list(module_names)
    plan.check_matches(names)
    return plan.ranks(r_base, r_min, r_max)


class RankPlanner(Protocol):
    """A LightningModule ``litlab plan`` can probe: it builds its frozen base from the config's DataModule and
    returns one probe's plan, with no adapters trained (``CSPLoRAClassifier``, ``CSPLoRALanguageProbe`` and
    ``LoKRALanguageModel`` are)."""

    def make_rank_plan(self, datamodule: Any) -> RankPlan:
        """Stage 1 on the frozen base, fed by ``datamodule``'s batches; the artefact."""
        ...


def saliency_heatmap(plan: RankPlan, path: Path) -> Path:
    """Depth × family map of the calibrated, smoothed scores s_l (the plan's structure)."""
    import matplotlib  # a second to import: only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    s = plan.structure("csplora")
    families = sorted({plan.families[n] for n in s})
    depth = {n: int(m.group(1)) if (m := re.search(r"\.(\d+)\.", f".{n}.")) else -1 for n in s}
    layers = sorted(set(depth.values()))
    grid = np.full((len(layers), len(families)), np.nan)
    for n, v in s.items():
        grid[layers.index(depth[n]), families.index(plan.families[n])] = v
    fig, ax = plt.subplots(figsize=(1.2 + 0.8 * len(families), 1.2 + 0.25 * len(layers)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(families)), families, rotation=45, ha="right")
    ax.set_yticks(range(len(layers)), ["(none)" if d < 0 else str(d) for d in layers])
    ax.set_xlabel("module family")
    ax.set_ylabel("layer")
    ax.set_title(f"CSPLoRA saliency s_l: {plan.base_model}", fontsize=8)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
