"""Frozen modules and trainable fractions: the arithmetic behind ``litlab.callbacks.frozen_guard`` and
``litlab.callbacks.trainable_fraction`` (several families adapt a frozen backbone: the diffusion family's LiteVSR,
arXiv 2606.09250, and SCNS).

* ``tensor_digest`` / ``module_digests``: SHA-256 of every tensor of a module's state dict (parameters and
  buffers, by name; dtype and shape included), to tell "bit-identical" from "close".
* ``resolve_module(root, "a.b")``: ``root.a.b``, with an error naming the path and the missing attribute.
* ``param_count`` / ``param_fraction(trainable, reference)``: ``|phi| / |theta|`` over distinct tensors (a tied
  weight counts once), the number adapter papers report (e.g. LiteVSR's Table 1: 11.25 % of the DiT).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import torch
from torch import nn


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes, dtype and shape."""
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(str((t.dtype, tuple(t.shape))).encode())
    h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def module_digests(modules: Mapping[str, nn.Module]) -> dict[str, str]:
    """``{"<prefix>.<tensor name>": digest}`` over every tensor of each module's state dict."""
    return {
        f"{prefix}.{name}": tensor_digest(t)
        for prefix, m in modules.items()
        for name, t in m.state_dict(keep_vars=True).items()
    }


def resolve_module(root: nn.Module, path: str) -> nn.Module:
    """``root.a.b`` for ``path = "a.b"``; a clear error naming the path and the first missing attribute."""
    obj: object = root
    for part in path.split("."):
        if not hasattr(obj, part):
            raise ValueError(
                f"{type(root).__name__} has no module at {path!r} (no attribute {part!r} on "
                f"{type(obj).__name__})"
            )
        obj = getattr(obj, part)
    if not isinstance(obj, nn.Module):
        raise ValueError(f"{type(root).__name__}.{path} is a {type(obj).__name__}, not an nn.Module")
    return obj


def param_count(params: Iterable[torch.Tensor]) -> int:
    """Number of elements over distinct tensors."""
    seen: set[int] = set()
    total = 0
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def param_fraction(trainable: Iterable[torch.Tensor], reference: Iterable[torch.Tensor]) -> float:
    """``param_count(trainable) / param_count(reference)``; an error when the reference has no parameters."""
    ref = param_count(reference)
    if ref == 0:
        raise ValueError("the reference module has no parameters")
    return param_count(trainable) / ref
