"""One estimator per LightningModule a full config names (``ESTIMATORS``, by class name): what it builds, trains
and runs for how long, read from the resolved config; the cost formulas are ``litlab.full_plan_formulas``."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from torch import nn

from litlab.full_plan_base import Estimate, compute_dtype, get
from litlab.full_plan_formulas import DTYPE_BYTES, MatmulWeights, Stack, lm_activation_bytes, lm_flops
from litlab.model_shapes import DATASETS, MODEL_SHAPES, build_on_meta, resolve_id

Config = dict[str, Any]
# observation and action sizes of the MuJoCo tasks (gymnasium's v4 documentation)
ENV_DIMS = {"Hopper-v4": (11, 3), "Walker2d-v4": (17, 6), "HalfCheetah-v4": (17, 6), "Ant-v4": (27, 8)}


def n_params(module: nn.Module, trainable: bool | None = None) -> int:
    return sum(p.numel() for p in module.parameters() if trainable is None or p.requires_grad == trainable)


def model_label(model_id: str, module: nn.Module) -> str:
    return f"{model_id} ({type(module).__name__}, {MODEL_SHAPES[resolve_id(model_id)].source})"


def memory(
    total: int, trainable: int, weight_bytes: int, train_bytes: int, states: int
) -> tuple[int, int, int]:
    """Weights (frozen at ``weight_bytes``, trained at ``train_bytes``), gradients, optimiser states."""
    frozen = total - trainable
    return (
        frozen * weight_bytes + trainable * train_bytes,
        trainable * train_bytes,
        states * trainable * train_bytes,
    )


_NUMBERS: dict[tuple, tuple[Stack, MatmulWeights, int, int, str]] = {}


def model_numbers(
    model_id: str, train: str, adapt: Callable[[nn.Module], Any] | None, adapt_key: tuple
) -> tuple[Stack, MatmulWeights, int, int, str]:
    """(stack, matmul weights, total and trainable parameters, label) of the model as the run trains it; the
    model is built once a key."""
    key = (resolve_id(model_id), train, adapt_key)
    if key not in _NUMBERS:
        model = build_on_meta(model_id)
        inner: Any = getattr(model, "language_model", model)
        stack = Stack.of(inner.config if hasattr(inner, "config") else model.config)
        if train != "full":
            model.requires_grad_(False)
        if adapt is not None:
            adapt(model)
        w = MatmulWeights.of(inner, input_needs_grad=train == "input")
        if inner is not model and not hasattr(inner, "lm_head") and hasattr(model, "lm_head"):
            w.frozen += model.lm_head.weight.numel()  # a vision-language model: its LM's matmuls and head
        _NUMBERS[key] = (stack, w, n_params(model), n_params(model, True), type(model).__name__)
    return _NUMBERS[key]


def lm_run(
    model_id: str,
    cfg: Config,
    *,
    batch: int,
    seq: int,
    steps: int,
    steps_text: str,
    datasets: list[str],
    train: str,
    adapt: Callable[[nn.Module], Any] | None = None,
    adapt_key: tuple = (),
    model_dtype: str | None = None,
    optimizer_states: int = 2,
    extra_trainable: int = 0,
    gpus: int = 1,
    notes: list[str] | None = None,
) -> Estimate:
    """A Hugging Face LM: ``train`` is "full" (every weight), "adapters" (``adapt`` injects them into the frozen
    model; ``adapt_key`` names what it injects, so that runs with the same adapters count the model once), "input"
    (frozen, gradients to its input: a soft prompt) or "none" (forward only)."""
    stack, w, total, trainable, class_name = model_numbers(model_id, train, adapt, adapt_key)
    trainable += extra_trainable
    dtype = compute_dtype(cfg, model_dtype)
    store = DTYPE_BYTES["bf16"] if model_dtype in ("bfloat16", "float16") else 4
    flops = lm_flops(w, stack, batch, seq, train=train != "none") * steps
    if train == "none":
        activations = (
            batch * seq * (2 * stack.hidden * 4 + 3 * stack.intermediate * 2)
        )  # one layer's, transient
    else:
        activations = lm_activation_bytes(
            stack,
            w,
            batch,
            seq,
            dtype,
            trained=train == "full",
            fp32_residual=store == 4,
            fp32_weights=store == 4,
        )
    train_bytes = store if train == "full" else 4
    weights, grads, states = memory(total + extra_trainable, trainable, store, train_bytes, optimizer_states)
    return Estimate(
        [f"{model_id} ({class_name}, {MODEL_SHAPES[resolve_id(model_id)].source})"],
        datasets,
        total + extra_trainable,
        trainable,
        weights,
        grads,
        states,
        activations,
        flops * gpus,
        steps_text,
        dtype,
        gpus,
        notes=list(notes or []),
    )


def dataset_records(name: str, fallback: int | None = None) -> int | None:
    return DATASETS[name].records if name in DATASETS else fallback


def epochs_steps(cfg: Config, records: int, batch: int) -> int:
    epochs = int(get(cfg, "trainer.max_epochs", 1))
    per_epoch = math.ceil(records / batch)
    limit = get(cfg, "trainer.limit_train_batches")
    if isinstance(limit, int) and limit > 0:
        per_epoch = min(per_epoch, limit)
    steps = epochs * per_epoch
    max_steps = int(get(cfg, "trainer.max_steps", -1) or -1)
    return (
        min(steps, max_steps * int(get(cfg, "trainer.accumulate_grad_batches", 1)))
        if max_steps > 0
        else steps
    )


# ---- adapter fine-tuning ------------------------------------------------------------------------
def lokra(cfg: Config) -> Estimate:
    from litlab.lit_modules.core.config import as_config
    from litlab.lit_modules.peft.lokra import AdapterPlan, inject_lokra

    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args")
    adapter = {k: v for k, v in (m.get("adapter") or {}).items() if k != "rank_plan"}
    plan = as_config(AdapterPlan, adapter, "adapter")
    batch, seq = int(d.get("batch_size", 16)), int(d.get("max_length", 256))
    name = str(d.get("train_path", "zwhe99/commonsense_170k"))
    records = dataset_records(name, dataset_records("zwhe99/commonsense_170k"))
    assert records is not None
    steps = epochs_steps(cfg, records - int(d.get("val_size", 0)), batch)
    notes = ["sequences counted at max_length (padding included)"]
    if (m.get("adapter") or {}).get("rank_plan"):
        notes.append("a rank plan redistributes the same rank budget: counted at the uniform rank")
    return lm_run(
        m["backbone"],
        cfg,
        batch=batch,
        seq=seq,
        steps=steps,
        steps_text=f"{steps:,} steps of {batch} x {seq} tokens",
        datasets=[f"{name} ({records:,} records)"],
        train="adapters",
        adapt=lambda model: inject_lokra(model, m.get("mode", "lokra"), plan),
        adapt_key=("lokra", m.get("mode", "lokra"), repr(plan)),
        model_dtype=m.get("dtype"),
        notes=notes,
    )


def spr_raft(cfg: Config) -> Estimate:
    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    shape = MODEL_SHAPES[resolve_id(m["backbone"])].arch
    hidden, head = int(shape["hidden_size"]), int(m.get("head_hidden", 64))
    extra = int(m.get("prompt_len", 16)) * hidden + hidden + (hidden * head + head) + (head + 1)
    prompt_tokens = int(d.get("max_prompt_tokens", d.get("max_length", 256)))
    batch, seq = int(d.get("batch_size", 16)), prompt_tokens + int(m.get("prompt_len", 16)) + 8
    records = dataset_records(str(d.get("task")), 10000) or 10000
    steps = epochs_steps(cfg, records, batch)
    return lm_run(
        m["backbone"],
        cfg,
        batch=batch,
        seq=seq,
        steps=steps,
        steps_text=f"{steps:,} steps of {batch} x {seq} tokens",
        datasets=[str(d.get("dataset") or d.get("task") or "text-regression records")],
        train="input",
        model_dtype=m.get("dtype", "bfloat16"),
        extra_trainable=extra,
        notes=[
            f"soft prompt + [REG] + head trainable; {records:,} records, sequences at the prompt bound; RAFT's "
            f"grid of {d.get('grid_size', '?')} candidate values (decoded on the prompt's cache) not counted"
        ],
    )


def gap_init(cfg: Config) -> Estimate:
    from litlab.lit_modules.core.adapters import inject_adapters

    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    rank = int(m.get("rank", 1))
    batch, seq = int(d.get("batch_size", 16)), int(m.get("max_text_tokens", 32)) + 32  # 32 Q-Former queries
    records = dataset_records("coco_karpathy")
    assert records is not None
    steps = epochs_steps(cfg, records, batch)

    def adapt(model: Any) -> None:
        targets = list(m.get("targets") or ["q_proj", "v_proj"])
        inject_adapters(model.language_model, targets, rank=rank, alpha=float(m.get("alpha", rank)))

    est = lm_run(
        m["backbone"],
        cfg,
        batch=batch,
        seq=seq,
        steps=steps,
        steps_text=f"{steps:,} steps of {batch} images x {seq} LM tokens",
        datasets=[f"COCO Karpathy captions ({records:,})"],
        train="adapters",
        adapt=adapt,
        adapt_key=("lora", rank, tuple(m.get("targets") or ())),
        model_dtype=m.get("dtype", "bfloat16"),
        notes=[
            "the LM's step by formula; the frozen ViT-g's forward on 257 tokens added as 2·(12·L·h²)·257 an "
            "image; the Q-Former's 32 queries not counted"
        ],
    )
    vision = MODEL_SHAPES[resolve_id(m["backbone"])].arch["vision_config"]
    n_vision = 12 * vision["num_hidden_layers"] * vision["hidden_size"] ** 2  # attention + 4x MLP weights
    est.flops += 2 * n_vision * 257 * batch * steps
    return est


ESTIMATORS: dict[str, Callable[[Config], Estimate]] = {
    "LoKRALanguageModel": lokra,
    "SPRRAFT": spr_raft,
    "GapInitLoRA": gap_init,
    "GapInitCaptioning": gap_init,
}


def import_class(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
