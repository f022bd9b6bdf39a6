"""Frozen parts of an adapted model: freezing, the bit-identity guard and the trainable fraction.

* ``freeze_(module)``: ``requires_grad_(False)`` and ``eval()``; returns the module.
* ``FrozenGuard``: a SHA-256 of every tensor of the frozen modules (parameters and buffers, by name, in
  state-dict order) taken when training starts; ``check(optimizer)`` raises naming the first tensor that changed,
  that holds a ``.grad``, or that the optimizer holds. ``changed()`` returns the names without raising.
* ``param_count`` / ``param_fraction(trainable, reference)``: ``|phi| / |theta|`` counted over distinct tensors
  (a tied weight counts once), the number the adapter papers report (e.g. LiteVSR's Table 1, arXiv 2606.09250).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import torch
from torch import nn


def freeze_(module: nn.Module) -> nn.Module:
    module.requires_grad_(False)
    module.eval()
    return module


def tensor_digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(str((t.dtype, tuple(t.shape))).encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def module_digests(modules: Mapping[str, nn.Module]) -> dict[str, str]:
    return {
        f"{prefix}.{name}": tensor_digest(t)
        for prefix, m in modules.items()
        for name, t in m.state_dict(keep_vars=True).items()
    }


def param_count(params: Iterable[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def param_fraction(trainable: Iterable[torch.Tensor], reference: Iterable[torch.Tensor]) -> float:
    ref = param_count(reference)
    if ref == 0:
        raise ValueError("the reference module has no parameters")
    return param_count(trainable) / ref


class FrozenGuard:
    """Bit-identity of named frozen modules across training (see the module docstring)."""

    def __init__(self, modules: Mapping[str, nn.Module]):
        self.modules = dict(modules)
        self.before = module_digests(self.modules)

    def changed(self) -> list[str]:
        after = module_digests(self.modules)
        return [k for k, v in self.before.items() if after.get(k) != v]

    def with_grad(self) -> list[str]:
        return [
            f"{prefix}.{name}"
            for prefix, m in self.modules.items()
            for name, p in m.named_parameters()
            if p.grad is not None or p.requires_grad
        ]

    def check(self, optimizers: Iterable[torch.optim.Optimizer] = ()) -> None:
        changed = self.changed()
        if changed:
            raise RuntimeError(
                f"frozen tensors changed during training: {changed[:5]} ({len(changed)} in all)"
            )
        with_grad = self.with_grad()
        if with_grad:
            raise RuntimeError(f"frozen parameters hold a .grad or require one: {with_grad[:5]}")
        frozen = {id(p) for m in self.modules.values() for p in m.parameters()}
        for opt in optimizers:
            held = [i for g in opt.param_groups for i, p in enumerate(g["params"]) if id(p) in frozen]
            if held:
                raise RuntimeError(f"the optimizer holds {len(held)} frozen parameter tensors")
