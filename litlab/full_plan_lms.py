"""Full-scale estimates of the whole-LM methods: continued pre-training and fine-tuning (Diffract, lock-in, task
complexity), LMs trained from scratch (SALAAD, LoRDO) and long-context prefill (SALE, xKV); see ``litlab.full_plan``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from litlab.full_plan_base import Estimate, compute_dtype, get
from litlab.full_plan_estimators import lm_run, memory, n_params
from litlab.full_plan_formulas import MatmulWeights, Stack, lm_activation_bytes, lm_flops
from litlab.model_shapes import MODEL_SHAPES, resolve_id

Config = dict[str, Any]


# ---- training and fine-tuning of whole LMs ------------------------------------------------------
def whole_lm(
    cfg: Config, model_id: str, batch: int, seq: int, steps: int, datasets: list[str], **kw: Any
) -> Estimate:
    accumulate = int(get(cfg, "trainer.accumulate_grad_batches", 1))
    return lm_run(
        model_id,
        cfg,
        batch=batch,
        seq=seq,
        steps=steps * accumulate,
        steps_text=f"{steps:,} optimiser steps x {accumulate} micro-batches of {batch} x {seq} tokens",
        datasets=datasets,
        train="full",
        **kw,
    )


def corpus_names(d: Config, default: str) -> list[str]:
    """The Hub corpora a ``HubCorpusDataModule`` streams (the domain's and the general one; unset, the corpus
    ``DOMAIN_SOURCES`` names for the domain), else ``default``."""
    from litlab.datamodules.hub_corpus import DOMAIN_SOURCES

    names = []
    for role, key, source in (
        ("train", "domain", d.get("domain_source")),
        ("evaluation", "general_domain", d.get("general_source")),
    ):
        dataset = source.get("dataset") if isinstance(source, dict) else None
        if dataset is None and d.get(key) in DOMAIN_SOURCES:
            dataset = DOMAIN_SOURCES[d[key]].dataset
        if dataset:
            names.append(f"{dataset} ({role})")
    return names or [default]


def domain_lm(cfg: Config, default_seq: int, corpus: str, note: str) -> Estimate:
    """A whole LM fine-tuned on a domain's text (Diffract, lock-in): ``batch_size`` windows (default 8) of
    ``block_size`` tokens (default ``default_seq``) for ``trainer.max_steps`` steps (default 1000); ``corpus`` names
    the domain's data where the config names no source; ``note`` says what the estimate leaves out."""
    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    batch, seq = int(d.get("batch_size", 8)), int(d.get("block_size", default_seq))
    steps = int(get(cfg, "trainer.max_steps", 1000))
    est = whole_lm(
        cfg,
        m["backbone"],
        batch,
        seq,
        steps,
        corpus_names(d, f"{d.get('domain')} {corpus}"),
        model_dtype=m.get("dtype"),
    )
    est.notes.append(note)
    return est


def diffract(cfg: Config) -> Estimate:
    return domain_lm(
        cfg, 4096, "corpus", "the spectral probes (SVDs of the weights every few thousand steps) not counted"
    )


def lock_in(cfg: Config) -> Estimate:
    d = get(cfg, "data.init_args") or {}
    return domain_lm(
        cfg,
        int(d.get("max_length", 512)),
        "data",
        "the curvature probes (Lanczos) and the broad evaluation every eval_every steps not counted",
    )


def task_complexity(cfg: Config) -> Estimate:
    """Online coding fine-tunes every weight once per n (``steps`` steps each); the LoRA strategy trains its
    adapters ``steps`` steps; ICL and decoding are forward only (not counted)."""
    from litlab.lit_modules.analysis.task_complexity import LORA_TARGETS
    from litlab.lit_modules.core.adapters import inject_adapters

    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    plan = m.get("plan") or {}
    batch, seq, steps = int(plan.get("batch_size", 8)), 256, int(plan.get("steps", 150))
    online = list(plan.get("online_n") or [])
    data = [f"{d.get('task', 'the task')} examples ({d.get('n_examples', '?')})"]
    est = lm_run(
        m["backbone"],
        cfg,
        batch=batch,
        seq=seq,
        steps=steps * len(online),
        steps_text=f"{len(online)} online-coding fits (n in {online}) + 1 LoRA fit, {steps} steps each of "
        f"{batch} x {seq} tokens",
        datasets=data,
        train="full",
        model_dtype=m.get("dtype"),
        notes=[f"{seq} tokens an example assumed (GSM8K question + answer); ICL and decoding not counted"],
    )
    if plan.get("lora_examples"):
        targets, rank = tuple(plan.get("lora_targets") or LORA_TARGETS), int(plan.get("lora_rank", 1))
        lora = lm_run(
            m["backbone"],
            cfg,
            batch=batch,
            seq=seq,
            steps=steps,
            steps_text="",
            datasets=data,
            train="adapters",
            adapt=lambda model: inject_adapters(
                model, list(targets), rank=rank, alpha=float(plan.get("lora_alpha", 8))
            ),
            adapt_key=("lora", rank, targets),
            model_dtype=m.get("dtype"),
        )
        est.flops += lora.flops
    return est


def scratch_lm(
    cfg: Config,
    numbers: dict[str, int],
    label: str,
    batch: int,
    seq: int,
    steps: int,
    data: str,
    gpus: int,
    notes: list[str],
    states: int = 2,
) -> Estimate:

    from litlab.lit_modules.core.models import tiny_llama

    with torch.device("meta"):
        model = tiny_llama(**numbers)
    accumulate = int(get(cfg, "trainer.accumulate_grad_batches", 1))
    stack = Stack.of(model.config)
    w = MatmulWeights.of(model)
    dtype = compute_dtype(cfg)
    total = n_params(model)
    flops = lm_flops(w, stack, batch, seq, train=True) * steps * accumulate * gpus
    activations = lm_activation_bytes(stack, w, batch, seq, dtype, trained=True, fp32_residual=True)
    weights, grads, optim = memory(total, total, 4, 4, states)
    return Estimate(
        [f"{label} (LlamaForCausalLM built from the config, from scratch)"],
        [data],
        total,
        total,
        weights,
        grads,
        optim,
        activations,
        flops,
        f"{steps:,} optimiser steps x {accumulate} micro-batches of {batch} x {seq} tokens"
        + (f" on each of {gpus} GPUs" if gpus > 1 else ""),
        dtype,
        gpus,
        notes=notes,
    )


def salaad(cfg: Config) -> Estimate:
    net, d = get(cfg, "model.init_args.net") or {}, get(cfg, "data.init_args") or {}
    numbers = dict(
        vocab_size=net["vocab_size"],
        hidden_size=net["hidden_size"],
        intermediate_size=net["intermediate_size"],
        num_layers=net["num_layers"],
        num_heads=net["num_heads"],
        num_kv_heads=net.get("num_kv_heads") or net["num_heads"],
        max_positions=net["max_positions"],
    )
    return scratch_lm(
        cfg,
        numbers,
        f"LLaMA {net['hidden_size']}x{net['num_layers']}",
        int(d.get("batch_size", 64)),
        int(d.get("block_size", 256)),
        int(get(cfg, "trainer.max_steps", 1)),
        f"{d.get('dataset')} ({d.get('subset')}, streamed)",
        1,
        ["SALAAD's ADMM updates (SVD, projections) not counted"],
    )


def lordo(cfg: Config) -> Estimate:
    net, d = get(cfg, "model.init_args.net") or {}, get(cfg, "data.init_args") or {}
    numbers = dict(
        vocab_size=net["vocab_size"],
        hidden_size=net["d_model"],
        intermediate_size=net["mlp_hidden"],
        num_layers=net["n_layers"],
        num_heads=net["n_heads"],
        num_kv_heads=net["n_heads"],
        max_positions=net["block_size"],
    )
    gpus = int(get(cfg, "trainer.devices", 1)) * int(get(cfg, "trainer.num_nodes", 1))
    return scratch_lm(
        cfg,
        numbers,
        f"LLaMA {net['d_model']}x{net['n_layers']}",
        int(d.get("batch_size", 32)),
        int(d.get("block_size", 1024)),
        int(get(cfg, "trainer.max_steps", 1)),
        f"{d.get('dataset')} ({d.get('subset')}, streamed)",
        gpus,
        ["optimiser state counted as AdamW's (an upper bound for the low-rank QH-AdamW)"],
    )


def prefill(cfg: Config) -> Estimate:
    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    lengths = [int(x) for x in d.get("lengths", [4096])]
    prompts = int(d.get("num_prompts", 1)) + int(d.get("calib_prompts", 0))
    seq = max(lengths)
    model_id = get(m, "lm.name")
    est = lm_run(
        model_id,
        cfg,
        batch=1,
        seq=seq,
        steps=prompts * len(lengths),
        steps_text=f"{prompts} prompts x {lengths} tokens, prefill (the "
        f"{get(m, 'evaluation.max_new_tokens', 16)} decoded tokens a prompt not counted)",
        datasets=[f"passkey prompts at {lengths} tokens (generated)"],
        train="none",
        model_dtype=get(m, "lm.dtype"),
    )
    shape = MODEL_SHAPES[resolve_id(model_id)].arch
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    kv_cache = 2 * shape["num_hidden_layers"] * seq * shape["num_key_value_heads"] * head_dim * 2
    logits = (
        2 * shape["vocab_size"] * seq
    )  # the prefill's bf16 logits at every position (kv_cache.greedy_generate)
    est.activations_bytes += kv_cache + logits
    est.notes.append(
        f"memory includes the dense bf16 KV cache of one {seq}-token prompt ({kv_cache / 2**30:.1f} GiB) and the "
        f"prefill's logits at every position ({logits / 2**30:.1f} GiB: the harness does not pass logits_to_keep)"
    )
    return est


LM_ESTIMATORS: dict[str, Callable[[Config], Estimate]] = {
    "DiffractCPT": diffract,
    "LockInFT": lock_in,
    "TaskComplexity": task_complexity,
    "SALAADLM": salaad,
    "LoRDOLMModule": lordo,
    "SALEPrefillModule": prefill,
    "XKVCompressionModule": prefill,
}
