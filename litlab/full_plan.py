"""What a full-scale run costs, before it runs: ``litlab repro <slug> --scale full --plan`` and
``litlab repro --full-scale-table`` (docs/full-scale.md).

Per run: the model(s) and data set(s), the parameter count (total and trainable: the model built on the meta
device from its real numbers, ``litlab.model_shapes``, with the run's adapters injected by the method's own code),
the memory of one GPU (weights, gradients, optimiser state, activations at the config's batch and sequence length
in its precision), the FLOPs of the run and GPU-hours on one H100 at ``UTILISATION`` of its dense peak, and the
``litlab slurm`` command for the config's GPU count. Nothing is downloaded.

Transformer step, ``T = b·s`` tokens of ``b`` sequences of length ``s``, ``L`` layers of query width ``d_q``:

    forward   F = 2·(N_frozen + N_train + N_adapter)·T + 4·L·b·s²·d_q
    training  F + 2·(N_frozen − N_skip)·T + 4·N_train·T + 4·N_adapter·T − 2·N_skip_adapter·T + 8·L·b·s²·d_q

``N_*`` are the weights of the matmuls (``nn.Linear``, ``lm_head`` included; a Khatri–Rao branch counts its
materialised d_in·d_out), frozen, trained, or an adapter branch's; a frozen weight needs only the gradient of its
input (2·N, not 4·N), and ``N_skip`` is the frozen first-layer q/k/v whose input (the frozen embedding) needs no
gradient at all (a first layer that adapts some of q, k, v and not the others skips a little more of the
attention's backward: not counted). With everything trained this is Kaplan et al.'s 6·N·T (arXiv 2001.08361, §2.1) plus the attention
term; forward-only methods (prefill) are ``F``. The attention term counts the full s×s score matrix, as
``torch.utils.flop_counter.FlopCounterMode`` does (a causal flash kernel computes about half). Gradient
checkpointing adds one forward. Activations (bytes autograd keeps for backward, per layer and token, ``a`` the
compute dtype's bytes, ``r`` the residual stream's) for a pre-norm SwiGLU layer with ``h``, ``d_kv``, heads ``n_h``
and MLP width ``I``:

    trained    4·r·h + 2·r + (c_attn + c_mlp)·a·h + a·(3·d_q + 2·d_kv) + 4·n_h + 4·a·I
    frozen     2·r·h + 2·r + a·(2·d_q + 2·d_kv) + 4·n_h + 3·a·I + Σ_adapted a·(d_in + rank)

(``c_attn = 3``, ``c_mlp = 2`` under autocast, where each projection casts its input apart, else 1; a GELU MLP
keeps 2·a·I trained, a·I frozen; an adapter with dropout keeps its own dropped input and a bool mask, (a + 1)·d_in),
plus ``4·V`` per token for the loss's log-softmax and, under autocast of fp32
weights, their 2-byte copies. tests/test_full_plan.py checks both formulas against FlopCounterMode and the tensors
saved for backward on stand-in-sized models of the same classes (the cards' own stand-ins among them), and the memory
sum against the measured peak of a few AdamW steps (``LiveStoragePeak``). Models that are not transformer stacks (UNets,
VAEs, ResNets) are counted on the meta device at the config's sizes: FlopCounterMode for the FLOPs and the
tensors saved for backward for the activations, so nothing is computed or allocated.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Iterable
from typing import Any

from litlab.full_plan_base import (
    H100_PEAK_FLOPS,
    UTILISATION,
    Estimate,
    get,
    gib,
    human,
    load_config,
)


def slurm_time(hours: float) -> str:
    """A wall-clock limit with a quarter of margin, at least an hour, as ``D-HH:MM:SS`` or ``HH:MM:SS``."""
    days, rest = divmod(max(1, math.ceil(hours * 1.25)), 24)
    return f"{days}-{rest:02d}:00:00" if days else f"{rest:02d}:00:00"


def slurm_command(config: str, overrides: list[str], est: Estimate) -> str:
    nodes, per_node = (est.gpus + 7) // 8, min(est.gpus, 8)
    args = ["litlab", "slurm", "--config", config, *overrides]
    args += ["--nodes", str(nodes), "--gpus-per-node", str(per_node), "--time", slurm_time(est.wall_hours)]
    return " ".join(shlex.quote(a) for a in args)


def plan_lines(est: Estimate, config: str, overrides: list[str], seeds: list[int] | None = None) -> list[str]:
    mem = (
        f"memory/GPU {gib(est.memory_bytes)} = weights {gib(est.weights_bytes)} + gradients "
        f"{gib(est.grads_bytes)} + optimiser {gib(est.optimizer_bytes)} + activations {gib(est.activations_bytes)}"
    )
    peak = H100_PEAK_FLOPS[est.dtype] / 1e12
    return [
        f"model: {'; '.join(est.models)}",
        f"data: {'; '.join(est.datasets)}",
        f"parameters: {est.params_total:,} total, {est.params_trainable:,} trainable ({est.dtype})",
        mem,
        f"compute: {est.steps}; {human(est.flops)}FLOP ({est.flops_method}) = {est.gpu_hours:,.3g} H100 GPU-hours "
        f"at {UTILISATION:.0%} of {peak:.0f} TFLOP/s dense {est.dtype}"
        + (f", {est.wall_hours:,.3g} h on {est.gpus} GPUs" if est.gpus > 1 else ""),
        *(f"note: {n}" for n in est.notes),
        *(
            [
                f"shared: {est.shared_what}, once per seed for all the card's runs and cached: "
                f"{human(est.shared_flops)}FLOP = {est.shared_gpu_hours:,.3g} H100 GPU-hours (not in the figure above)"
            ]
            if est.shared_flops
            else []
        ),
        *(
            [f"slurm, one job per seed (seed_everything in {seeds}; here {seeds[0]}):"]
            if seeds and len(seeds) > 1
            else []
        ),
        "slurm: "
        + slurm_command(config, [*overrides, *([f"--seed_everything={seeds[0]}"] if seeds else [])], est),
    ]


def estimate(cfg: dict[str, Any]) -> Estimate:
    """The estimate of one resolved full-scale config, by the class of its model (the estimator modules' tables),
    else by its family (``family:<name>``); ``KeyError`` naming the class when none is written."""
    from litlab.full_plan_diffusion import DIFFUSION_ESTIMATORS
    from litlab.full_plan_estimators import ESTIMATORS
    from litlab.full_plan_lms import LM_ESTIMATORS
    from litlab.full_plan_others import OTHER_ESTIMATORS

    by_class = {**ESTIMATORS, **LM_ESTIMATORS, **DIFFUSION_ESTIMATORS, **OTHER_ESTIMATORS}
    class_path = str(get(cfg, "model.class_path", ""))
    name = class_path.rpartition(".")[2]
    fn = by_class.get(name)
    if fn is None:
        family = class_path.split(".lit_modules.")[-1].split(".")[0]
        fn = OTHER_ESTIMATORS.get(f"family:{family}")
    if fn is None:
        raise KeyError(
            f"no full-scale estimate for {class_path}: add one to the litlab/full_plan_*.py of its kind"
        )
    return fn(cfg)


def estimate_run(config: str, overrides: list[str]) -> Estimate:
    """The estimate of one run: the config (a path inside litlab or the working directory) and its overrides."""
    from litlab.cards import project_path

    return estimate(load_config(project_path(config), overrides))


def card_rows(card: Any, override_args: Callable[[dict], list[str]]) -> list[tuple[str, str, str, list[str]]]:
    """``(run, role, config, override args)`` of the card's full-scale runs (``override_args``: repro's, which
    writes a run's overrides as arguments); a card without any plans its full config as it stands."""
    runs = card.runs_for("full")
    rows = [
        (name, spec.role, spec.config_path("full"), override_args(spec.all_overrides("full")))
        for name, spec in runs.items()
    ]
    return rows or [("(full config)", "-", f"configs/{card.slug}/full.yaml", [])]


def print_run_plan(
    config: str, overrides: list[str], seeds: list[int] | None = None, indent: str = "      "
) -> Estimate | None:
    try:
        est = estimate_run(config, overrides)
    except (KeyError, ValueError) as err:
        print(f"{indent}no estimate: {err}")
        return None
    for line in plan_lines(est, config, overrides, seeds):
        print(indent + line)
    return est


def full_scale_table(override_args: Callable[[dict], list[str]], slugs: Iterable[str] | None = None) -> str:
    """docs/full-scale.md: one row per full-scale run of every card (``litlab repro --full-scale-table``)."""
    from litlab.cards import load_card, project_path

    names = sorted(p.stem for p in project_path("seeds").glob("*.yaml")) if slugs is None else list(slugs)
    peak = H100_PEAK_FLOPS["bf16"] / 1e12
    out = [
        "# Full scale: what each card's runs cost",
        "",
        "Generated by `litlab repro --full-scale-table > docs/full-scale.md` (`litlab/full_plan.py`; a test fails",
        "when this file and the code disagree). Per run of each card's full scale: the model(s), the parameters",
        "(exact: each model built on the meta device from its `config.json` numbers in `litlab/model_shapes.py`,",
        "the run's adapters injected by the method's own code), the memory of one GPU (weights + gradients +",
        "optimiser state + activations at the config's batch and sequence length, in its precision; CUDA context",
        "and allocator slack not included), the run's FLOPs and H100 GPU-hours at "
        f"{UTILISATION:.0%} of the dense peak ({peak:.0f} TFLOP/s",
        f"bf16, {H100_PEAK_FLOPS['fp32'] / 1e12:.0f} TFLOP/s fp32) — a lower bound where small models or",
        "environment steps, not FLOPs, set the pace (RL) — and the GPUs the config asks for.",
        "The formulas are in `litlab/full_plan.py`'s docstring; `litlab repro <slug> --scale full --plan` prints",
        "the same per run with the memory split and the `litlab slurm` command.",
        "",
        "| card | run | model | data | params (trainable) | memory/GPU | FLOP | H100 GPU-h per seed | GPUs | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    totals = []
    for slug in names:
        card = load_card(project_path(f"seeds/{slug}.yaml"))
        seeds = len(card.seeds.get("full", card.seeds.get("quick", [0])))
        runs, hours, optional_hours, shared = card.runs_for("full"), 0.0, 0.0, 0.0
        for run, _role, config, overrides in card_rows(card, override_args):
            try:
                est = estimate_run(config, overrides)
            except (KeyError, ValueError) as err:
                out.append(f"| `{slug}` | {run} | no estimate: {err} | | | | | | | |")
                continue
            shared = max(shared, est.shared_gpu_hours * seeds)
            if run in runs and runs[run].optional:
                optional_hours += est.gpu_hours * seeds
            else:
                hours += est.gpu_hours * seeds
            out.append(
                f"| `{slug}` | {run} | {'; '.join(est.models)} | {'; '.join(est.datasets)} | "
                f"{human(est.params_total)} ({human(est.params_trainable)}) | {gib(est.memory_bytes)} | "
                f"{human(est.flops)} | {est.gpu_hours:,.3g} | {est.gpus} | {seeds} |"
            )
        totals.append(f"| `{slug}` | {hours + shared:,.3g} | {optional_hours:,.3g} |")
    out += [
        "",
        "Per card: the H100 GPU-hours of its runs over its seeds, with a stage they share once per seed (a cached",
        "source model), the optional runs (`--all`) apart.",
        "",
        "| card | GPU-hours, default runs x seeds | optional runs x seeds |",
        "|---|---|---|",
        *totals,
    ]
    return "\n".join(out) + "\n"
