"""The pieces of ``litlab.full_plan`` its estimators share: the resolved config, the precision, the H100's peaks and
the ``Estimate`` of one run (no torch here: ``litlab repro`` imports this at start-up)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

# H100 SXM dense peaks (NVIDIA H100 datasheet; the datasheet's headline numbers are with 2:4 sparsity, twice these)
H100_PEAK_FLOPS = {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 66.9e12}
UTILISATION = 0.40
GIB = 1024**3


def load_config(path: str | Path, overrides: Iterable[str] = ()) -> dict[str, Any]:
    """The config file with ``--a.b.c=value`` overrides applied as LightningCLI would (``--model=<class>``
    replaces the class and keeps the init_args; values are YAML)."""
    cfg = yaml.safe_load(Path(path).read_text()) or {}
    for arg in overrides:
        key, sep, text = arg.removeprefix("--").partition("=")
        if not sep:
            raise ValueError(f"override {arg!r} is not of the form --key=value")
        value = yaml.safe_load(text) if text else None
        parts = key.split(".")
        node = cfg
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        leaf = parts[-1]
        if isinstance(value, str) and isinstance(node.get(leaf), dict) and "class_path" in node[leaf]:
            node[leaf] = {**node[leaf], "class_path": value}
        else:
            node[leaf] = value
    return cfg


def get(cfg: dict[str, Any], dotted: str, default: Any = None) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return default
        node = node[part]
    return node


def compute_dtype(cfg: dict[str, Any], model_dtype: str | None = None) -> str:
    """bf16 / fp16 where the trainer's precision or the model's dtype says so, else fp32."""
    precision = str(get(cfg, "trainer.precision", "32"))
    if precision.startswith("bf16") or model_dtype == "bfloat16":
        return "bf16"
    if precision.startswith("16") or model_dtype == "float16":
        return "fp16"
    return "fp32"


@dataclasses.dataclass
class Estimate:
    """One run of a card at full scale. ``flops`` is the whole run on all its GPUs; memory is one GPU's."""

    models: list[str]
    datasets: list[str]
    params_total: int
    params_trainable: int
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    flops: float
    steps: str
    dtype: str
    gpus: int = 1
    flops_method: str = "formula"
    notes: list[str] = dataclasses.field(default_factory=list)
    # a stage every run of a seed shares (trained once and cached, e.g. a source model): not in ``flops``
    shared_flops: float = 0.0
    shared_what: str = ""

    @property
    def memory_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes

    @property
    def gpu_hours(self) -> float:
        return self.flops / (UTILISATION * H100_PEAK_FLOPS[self.dtype]) / 3600

    @property
    def shared_gpu_hours(self) -> float:
        return self.shared_flops / (UTILISATION * H100_PEAK_FLOPS[self.dtype]) / 3600

    @property
    def wall_hours(self) -> float:
        return self.gpu_hours / self.gpus


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= 0.05 * GIB else f"{n / 1024**2:.0f} MiB"


def human(n: float) -> str:
    for unit, size in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n:.0f}"
