"""Adapters trained in litlab, written in Hugging Face PEFT's LoRA layout, so ``peft.PeftModel.from_pretrained``
(and servers that read PEFT adapters) load them onto the untouched base model.

PEFT's layout (LoRA, Hu et al., arXiv 2106.09685, as PEFT stores it): a folder with

* ``adapter_config.json``: ``peft_type: LORA``, ``target_modules``, ``r`` and ``lora_alpha`` (scaling α/r), and
  for per-module ranks (a CSPLoRA rank plan) ``rank_pattern`` / ``alpha_pattern``: module name → r / α where it
  differs from the common one;
* ``adapter_model.safetensors``: ``base_model.model.<module>.lora_A.weight`` (r × d_in) and ``….lora_B.weight``
  (d_out × r) per wrapped linear.

Our ``LowRankBranch`` is the same map (A reads the input, B writes it, ΔW = (α/r)·BA), so the factors are copied
as they are. What PEFT's LoRA cannot hold is refused with the module's name: a Khatri–Rao branch (LoKRA+), a
branch merged into W₀ (the base PEFT loads would then differ from ours: unmerge first), a second branch on the
same layer, or dropout that differs between modules.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from litlab.lit_modules.core.adapters import AdapterLinear, LowRankBranch, find_adapters
from litlab.lit_modules.core.frozen import tensor_digest
from litlab.lit_modules.core.io import atomic_path

PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"


def _branch_to_export(name: str, layer: AdapterLinear, branch: str | None) -> LowRankBranch:
    names = list(layer.branches)
    chosen = branch if branch is not None else (names[0] if len(names) == 1 else None)
    if chosen is None or chosen not in layer.branches:
        raise ValueError(
            f"module {name!r} has branches {names}; PEFT's LoRA holds one per layer: name the one to export "
            f"(branch=...){'' if chosen is None else f', not {chosen!r}'}"
        )
    if len(names) > 1:
        raise ValueError(
            f"module {name!r} has branches {names}: PEFT's LoRA layout holds one branch per layer"
        )
    if layer._merged:
        raise ValueError(
            f"module {name!r} has branch {chosen!r} merged into its weight: PEFT loads the adapter onto the "
            "original base weight, so unmerge it first (AdapterLinear.unmerge)"
        )
    b = layer.branches[chosen]
    if not isinstance(b, LowRankBranch):
        raise ValueError(
            f"module {name!r}: a {b.kind} branch has no PEFT LoRA form (only low-rank branches do)"
        )
    return b


def _common_and_pattern(values: Mapping[str, float | int]) -> tuple[float | int, dict[str, float | int]]:
    common = Counter(values.values()).most_common(1)[0][0]
    return common, {n: v for n, v in values.items() if v != common}


def peft_lora_config(
    model: nn.Module,
    branch: str | None = None,
    base_model_name_or_path: str | None = None,
    task_type: str | None = None,
) -> tuple[dict, dict[str, torch.Tensor]]:
    """The ``adapter_config.json`` dict and the state dict (PEFT key names) of ``model``'s adapters; module
    names are relative to ``model``, the module PEFT will wrap (the Hugging Face model, not a LightningModule
    around it)."""
    adapted = find_adapters(model)
    if not adapted:
        raise ValueError(f"{type(model).__name__} holds no AdapterLinear: nothing to export")
    branches = {n: _branch_to_export(n, m, branch) for n, m in adapted.items()}
    dropouts = {float(b.dropout.p) if isinstance(b.dropout, nn.Dropout) else 0.0 for b in branches.values()}
    if len(dropouts) > 1:
        raise ValueError(
            f"PEFT's LoRA has one lora_dropout for all modules; these branches use {sorted(dropouts)}"
        )
    r, rank_pattern = _common_and_pattern({n: b.rank for n, b in branches.items()})
    alpha, alpha_pattern = _common_and_pattern({n: b.alpha for n, b in branches.items()})
    # PEFT reads a pattern key as a regex matched against a name's suffix: a plain module name must not also
    # match another module (it cannot here unless names are nested oddly; refuse rather than mis-rank)
    for key in {**rank_pattern, **alpha_pattern}:
        hits = [n for n in adapted if re.match(rf"(.*\.)?({key})$", n)]
        if hits != [key]:
            raise ValueError(f"module name {key!r} would also select {hits} as a PEFT rank/alpha pattern")
    config = {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_model_name_or_path,
        "target_modules": sorted(branches),
        "r": int(r),
        "lora_alpha": float(alpha),
        "rank_pattern": {n: int(v) for n, v in rank_pattern.items()},
        "alpha_pattern": {n: float(v) for n, v in alpha_pattern.items()},
        "lora_dropout": dropouts.pop(),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }
    state = {}
    for n, b in branches.items():
        state[f"base_model.model.{n}.lora_A.weight"] = b.A.detach().to("cpu").contiguous()
        state[f"base_model.model.{n}.lora_B.weight"] = b.B.detach().to("cpu").contiguous()
    return config, state


def save_peft_adapter(
    model: nn.Module,
    folder: str | os.PathLike,
    branch: str | None = None,
    base_model_name_or_path: str | None = None,
    task_type: str | None = None,
) -> Path:
    """Write ``model``'s adapters as a PEFT LoRA adapter folder. The folder is built beside its place and moved
    there whole, so a reader never sees half of it; an earlier export there is replaced."""
    config, state = peft_lora_config(model, branch, base_model_name_or_path, task_type)
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
    try:
        tmp.mkdir()
        with atomic_path(tmp / PEFT_CONFIG_FILE) as f:
            f.write_text(json.dumps(config, indent=2) + "\n")
        save_file(state, str(tmp / PEFT_WEIGHTS_FILE), metadata={"format": "pt"})
        if folder.exists():
            os.replace(folder, old)
        os.replace(tmp, folder)
    finally:
        for leftover in (tmp, old):
            shutil.rmtree(leftover, ignore_errors=True)
    return folder


def base_weight_digests(model: nn.Module) -> dict[str, str]:
    """SHA-256 of every tensor of ``model``'s state dict but its adapters' factors: the weights a PEFT adapter is
    applied to. Equal digests before and after a run mean its adapter on the untouched base is the run's model."""
    factors = {
        f"{layer_name}.branches.{branch_name}.{factor}"
        for layer_name, layer in find_adapters(model).items()
        for branch_name, branch in layer.branches.items()
        for factor in branch.factors()
    }
    state = model.state_dict()
    return {name: tensor_digest(t) for name, t in state.items() if name not in factors and torch.is_tensor(t)}


def hf_model_holding_adapters(module: nn.Module) -> nn.Module | None:
    """The outermost ``transformers.PreTrainedModel`` inside ``module`` (a LightningModule, say) that holds every
    adapter of it: the model PEFT wraps, to which the adapters' module names are relative. None if none does."""
    try:  # deferred: transformers costs seconds to import, and a module without it has no such model
        from transformers import PreTrainedModel
    except ImportError:
        return None
    adapted = find_adapters(module)
    for name, inner in module.named_modules():
        if isinstance(inner, PreTrainedModel):
            prefix = f"{name}." if name else ""
            if all(a.startswith(prefix) for a in adapted):
                return inner
    return None


def save_module_peft_adapter(module: nn.Module, folder: str | os.PathLike) -> Path:
    """``save_peft_adapter`` of the Hugging Face model inside ``module`` that holds all its adapters, with that
    model's hub id or folder as ``base_model_name_or_path`` (what PEFT applies the adapter to) and, for a causal
    LM, ``task_type: CAUSAL_LM``; ``ValueError`` naming why when there is none or PEFT cannot hold the adapters."""
    adapted = find_adapters(module)
    if not adapted:
        raise ValueError(f"{type(module).__name__} holds no AdapterLinear: nothing to export")
    base = hf_model_holding_adapters(module)
    if base is None:
        raise ValueError(
            f"no Hugging Face model inside {type(module).__name__} holds all its adapters ({list(adapted)[:4]}...); "
            "PEFT loads adapters onto a Hugging Face base"
        )
    return save_peft_adapter(
        base,
        folder,
        base_model_name_or_path=getattr(base.config, "_name_or_path", None) or None,
        task_type="CAUSAL_LM" if type(base).__name__.endswith("ForCausalLM") else None,
    )
