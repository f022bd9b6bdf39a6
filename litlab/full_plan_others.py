"""Full-scale estimates of the models that are not Hugging Face LMs: ViT continual learners, RL networks and ResNet
domain adaptation (the diffusion backbones: ``full_plan_diffusion``). Conv nets and UNets are counted on
the meta device at the config's sizes (FlopCounterMode; tensors saved for backward); see ``litlab.full_plan``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from litlab.full_plan_base import Estimate, compute_dtype, get
from litlab.full_plan_estimators import ENV_DIMS, dataset_records, import_class, memory, n_params
from litlab.full_plan_formulas import (
    MatmulWeights,
    Stack,
    counted_flops,
    lm_activation_bytes,
    lm_flops,
    saved_tensor_bytes,
)
from litlab.model_shapes import MODEL_SHAPES, build_on_meta

Config = dict[str, Any]


# ---- ResNets, as torchvision builds them (He et al., arXiv 1512.03385, Table 1; torchvision's v1.5 strides) ----
class _Block(nn.Module):
    def __init__(self, cin: int, planes: int, stride: int, bottleneck: bool) -> None:
        super().__init__()
        out = planes * (4 if bottleneck else 1)
        if bottleneck:
            convs = [(cin, planes, 1, 1), (planes, planes, 3, stride), (planes, out, 1, 1)]
        else:
            convs = [(cin, planes, 3, stride), (planes, planes, 3, 1)]
        layers: list[nn.Module] = []
        for i, (a, b, k, s) in enumerate(convs):
            layers += [nn.Conv2d(a, b, k, s, k // 2, bias=False), nn.BatchNorm2d(b)]
            if i < len(convs) - 1:
                layers.append(nn.ReLU())
        self.body = nn.Sequential(*layers)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))
            if stride != 1 or cin != out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.down(x))


RESNETS = {
    "resnet18": ((2, 2, 2, 2), False),
    "resnet34": ((3, 4, 6, 3), False),
    "resnet50": ((3, 4, 6, 3), True),
    "resnet101": ((3, 4, 23, 3), True),
}


def resnet(name: str, classes: int | None = 1000) -> nn.Sequential:
    """torchvision's ``resnet18/34/50/101`` layer for layer (``classes`` None: without the fc layer)."""
    blocks, bottleneck = RESNETS[name]
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for stage, count in enumerate(blocks):
        planes = 64 * 2**stage
        for i in range(count):
            layers.append(_Block(cin, planes, 2 if i == 0 and stage > 0 else 1, bottleneck))
            cin = planes * (4 if bottleneck else 1)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    if classes:
        layers.append(nn.Linear(cin, classes))
    return nn.Sequential(*layers)


_TRACES: dict[tuple, tuple[int, int]] = {}


def meta_train_step(
    model: nn.Module, make_input: Callable[[], Any], train: bool, key: tuple = ()
) -> tuple[int, int]:
    """(FLOPs of one step, bytes saved for backward) of ``model`` on the meta device; ``key`` names the model and
    its inputs, so that runs of the same shapes trace it once."""
    if key and key in _TRACES:
        return _TRACES[key]

    def step() -> torch.Tensor:
        with torch.device("meta"):
            out = model(*make_input())
        return out if isinstance(out, torch.Tensor) else out[0]

    saved = saved_tensor_bytes(step, list(model.parameters())) if train else 0
    result = counted_flops(step, backward=train), saved
    if key:
        _TRACES[key] = result
    return result


def conv_run(
    cfg: Config,
    backbone: str,
    batch: int,
    size: int,
    steps: int,
    steps_text: str,
    data: list[str],
    head: int,
    notes: list[str],
    states: int,
    source_steps: int = 0,
) -> Estimate:
    """A ResNet trained ``steps`` batches; ``source_steps`` batches of the source stage every run of a seed
    shares (``lit_modules/domain/source.py`` trains it once and caches it)."""
    with torch.device("meta"):
        net = resnet(backbone, classes=None)
    flops, saved = meta_train_step(
        net, lambda: (torch.empty(batch, 3, size, size),), train=True, key=(backbone, batch, size)
    )
    total = n_params(net) + head
    weights, grads, optim = memory(total, total, 4, 4, states)
    return Estimate(
        [f"torchvision {backbone} (ImageNet weights) + heads"],
        data,
        total,
        total,
        weights,
        grads,
        optim,
        saved,
        flops * steps,
        steps_text,
        compute_dtype(cfg),
        flops_method="meta-device count",
        notes=notes,
        shared_flops=flops * source_steps,
        shared_what=f"the source stage ({source_steps:,} batches)",
    )


def sfda_regression(cfg: Config) -> Estimate:
    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    net, src = m.get("net") or {}, m.get("source_stage") or {}
    records = dataset_records(str(d.get("benchmark", "dsprites")), 10000) or 10000
    batch = int(d.get("batch_size", 36))
    source_steps = int(src.get("epochs", 1)) * math.ceil(records / int(src.get("batch_size", batch)))
    steps = int(get(cfg, "trainer.max_epochs", 1)) * math.ceil(records / batch)
    feat = int(net.get("feat_dim", 256))
    head = (
        512 * (4 if net.get("backbone") in ("resnet50", "resnet101") else 1) * feat + 3 * feat + feat * 3 + 3
    )
    return conv_run(
        cfg,
        str(net.get("backbone", "resnet18")),
        batch,
        int(d.get("size", 224)),
        steps,
        f"{steps:,} adaptation steps of {batch} images (one epoch = {records:,} images)",
        [f"{d.get('benchmark')} {d.get('source')} -> {d.get('target')}"],
        head,
        ["the baselines' extra passes (teacher, k-NN bank) not counted"],
        states=1,
        source_steps=source_steps,
    )


def u3cf(cfg: Config) -> Estimate:
    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    net, src = m.get("net") or {}, m.get("source_stage") or {}
    targets = list(d.get("targets") or [])
    batch = int(src.get("batch_size", 32))
    adapt = int(get(m, "curriculum.iters_per_target", 0)) * len(targets) + int(get(m, "causal.iters", 0))
    steps = 2 * adapt  # a source and a target batch per adaptation step
    feat = 2048 if net.get("backbone") in ("resnet50", "resnet101") else 512
    head = feat * int(net.get("feat_dim", 256)) + 256 * 31
    return conv_run(
        cfg,
        str(net.get("backbone", "resnet50")),
        batch,
        int(d.get("image_size", 224)),
        steps,
        f"{steps:,} batches of {batch} images",
        [f"{d.get('benchmark')} {d.get('source')} -> {targets}"],
        head,
        ["heads (bottleneck, classifier) approximated; the graph head's pairwise terms not counted"],
        states=1,
        source_steps=int(src.get("iters", 0)),
    )


# ---- ViT continual learners ------------------------------------------------------------------------
@functools.cache
def vit_numbers(
    model_id: str, targets: tuple[str, ...], rank: int, alpha: float, branches: tuple[str, ...]
) -> tuple[Stack, MatmulWeights, int, int]:
    """The ViT with each branch of LoRA injected by the shared adapter core: (stack, matmul weights, total,
    trainable)."""
    from litlab.lit_modules.core.adapters import inject_adapters

    model = build_on_meta(model_id).requires_grad_(False)
    for branch in branches:
        inject_adapters(model, list(targets), rank=rank, alpha=alpha, branch=branch)
    stack = Stack.of(model.config, vocab=0, gated_mlp=False)
    return stack, MatmulWeights.of(model), n_params(model), n_params(model, True)


def continual(cfg: Config) -> Estimate:
    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    model_id = get(m, "backbone.name", "google/vit-base-patch16-224-in21k")
    rank = int(m.get("rank", 8))
    branches = ("general", "isolated") if cfg["model"]["class_path"].endswith("LoDA") else ("default",)
    targets = tuple(m.get("targets") or ("q_proj", "v_proj"))
    stack, w, n_total, n_trainable = vit_numbers(
        model_id, targets, rank, float(m.get("alpha", rank)), branches
    )
    benchmark, batch = str(d.get("benchmark", "imagenet_r")), int(d.get("batch_size", 128))
    records = dataset_records(benchmark, 24000) or 24000
    steps = int(d.get("epochs_per_task", 1)) * math.ceil(records / batch)
    seq = (224 // 16) ** 2 + 1
    dtype = compute_dtype(cfg)
    head = {"imagenet_r": 200, "cifar100": 100, "domainnet": 345}.get(
        benchmark, 200
    ) * stack.hidden  # cosine head
    total, trainable = n_total + head, n_trainable + head
    states = 1 if str(m.get("optimizer", "sgd")) == "sgd" and "momentum" in m else 2
    weights, grads, optim = memory(total, trainable, 4, 4, states)
    return Estimate(
        [f"{model_id} (ViTModel, {MODEL_SHAPES[model_id].source})"],
        [f"{benchmark} ({records:,} training images, {d.get('num_tasks')} tasks)"],
        total,
        trainable,
        weights,
        grads,
        optim,
        lm_activation_bytes(stack, w, batch, seq, dtype, trained=False, fp32_residual=True, with_loss=False),
        lm_flops(w, stack, batch, seq, train=True) * steps,
        f"{steps:,} steps of {batch} images x {seq} tokens ({d.get('epochs_per_task')} epochs per task)",
        dtype,
        notes=["per-task subspace SVDs / GPM bases and the evaluation passes not counted"],
    )


# ---- RL ------------------------------------------------------------------------------------------
def rl(cfg: Config) -> Estimate:
    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    env = str(d.get("env_id", "Hopper-v4"))
    obs, act = ENV_DIMS.get(env, (11, 3))
    module = import_class(cfg["model"]["class_path"])(**m, obs_dim=obs, act_dim=act)
    trained = sum(n_params(c) for name, c in module.named_children() if "target" not in name)
    targets = sum(n_params(c) for name, c in module.named_children() if "target" in name)
    if "offline_steps" in m:
        updates = int(m["offline_steps"]) + int(m["online_steps"])
        batch = int(get(m, "optim.batch_offline", 256))
    else:
        updates = int(get(m, "schedule.env_steps", 1))
        batch = int(get(m, "schedule.batch_size", 256)) + int(get(m, "schedule.expert_batch_size", 0))
    flops = (6 * trained + 2 * targets) * batch * updates
    capacity = int(d.get("buffer_capacity", 1_000_000))
    buffer = capacity * (2 * obs + act + 2) * 4
    weights, grads, optim = memory(trained + targets, trained, 4, 4, 2)
    return Estimate(
        [
            f"{type(module).__name__} networks ({', '.join(n for n, c in module.named_children() if n_params(c))})"
        ],
        [f"{env} (obs {obs}, action {act}), {get(d, 'offline.level', 'online')} data"],
        trained + targets,
        trained,
        weights,
        grads,
        optim,
        buffer,
        flops,
        f"{updates:,} updates of {batch} transitions",
        compute_dtype(cfg),
        notes=[
            "a FLOP lower bound: small MLPs run far below the peak, and the MuJoCo steps run on the CPU",
            f"activations hold the replay buffer ({capacity:,} transitions)",
        ],
    )


OTHER_ESTIMATORS: dict[str, Callable[[Config], Estimate]] = {
    "SFDARegression": sfda_regression,
    "U3CF": u3cf,
    "family:continual": continual,
    "family:rl": rl,
}
