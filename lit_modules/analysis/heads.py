"""Per-head views of attention projections in a plain state dict, and head rewinding (Diffract §3.1, §3.5).

A head block is read by exact slicing, in PyTorch's ``[out, in]`` layout: ``Q_h = W_q[h·d_h:(h+1)·d_h, :]``,
``K_g``, ``V_g`` likewise for kv-group ``g``, ``O_h = W_o[:, h·d_h:(h+1)·d_h]``. Three naming schemes are
recognised: litlab's TinyGPT (``blocks.{l}.attn.{q,k,v,o}_proj``), Llama / OLMo / Qwen / SmolLM
(``model.layers.{l}.self_attn.{q,k,v,o}_proj``, GQA) and GPT-2 (``transformer.h.{l}.attn.c_attn`` / ``c_proj``,
``Conv1D`` weights stored ``[in, out]``: q, k, v are column ranges of ``c_attn``).

The rewinding unit is one kv-group: its query heads (rows of ``W_q`` and their ``O`` columns) and its ``K_g, V_g``
rows (with the q/k/v biases); under MHA a group is one head. ``rewind(θd, θ0, units)`` copies those slices back from
``θ0``; everything else stays at ``θd``, i.e. ``θ_R = θd - M_R ⊙ (θd - θ0)`` with a 0/1 mask ``M_R``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

PROJ = ("q", "k", "v", "o")


@dataclass(frozen=True)
class Slot:
    """Where one projection's head slices live: tensor ``name``, the head ``axis`` of the stored tensor, the
    ``offset`` of head 0 on it, and whether the stored layout is ``[in, out]`` (GPT-2 ``Conv1D``)."""

    name: str
    axis: int
    offset: int = 0
    transposed: bool = False


@dataclass(frozen=True)
class AttnLayer:
    layer: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    weights: dict[str, Slot]  # q, k, v, o
    biases: dict[str, Slot] = field(default_factory=dict)  # q, k, v (the o bias is not per head)

    @property
    def group_size(self) -> int:
        return self.n_heads // self.n_kv_heads

    def heads_of(self, proj: str) -> int:
        return self.n_kv_heads if proj in ("k", "v") else self.n_heads


_TINY = re.compile(r"^(?P<pre>(?:.*\.)?blocks\.(?P<l>\d+)\.attn\.)q_proj\.weight$")
_LLAMA = re.compile(r"^(?P<pre>(?:.*\.)?layers\.(?P<l>\d+)\.self_attn\.)q_proj\.weight$")
_GPT2 = re.compile(r"^(?P<pre>(?:.*\.)?h\.(?P<l>\d+)\.attn\.)c_attn\.weight$")


def find_attention(
    state: Mapping[str, Tensor], n_heads: int, n_kv_heads: int | None = None
) -> list[AttnLayer]:
    """The attention layers of ``state``, in layer order; ``n_kv_heads`` defaults to ``n_heads`` (MHA)."""
    n_kv = n_kv_heads or n_heads
    if n_heads % n_kv:
        raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv}")
    layers = []
    for name in state:
        for pattern in (_TINY, _LLAMA):
            m = pattern.match(name)
            if m:
                pre = m["pre"]
                d_h = state[name].shape[0] // n_heads
                weights = {
                    "q": Slot(pre + "q_proj.weight", 0),
                    "k": Slot(pre + "k_proj.weight", 0),
                    "v": Slot(pre + "v_proj.weight", 0),
                    "o": Slot(pre + "o_proj.weight", 1),
                }
                biases = {
                    p: Slot(pre + f"{p}_proj.bias", 0) for p in "qkv" if pre + f"{p}_proj.bias" in state
                }
                layers.append(AttnLayer(int(m["l"]), n_heads, n_kv, d_h, weights, biases))
        m = _GPT2.match(name)
        if m:
            pre = m["pre"]
            d = state[name].shape[0]
            d_h = d // n_heads
            if n_kv != n_heads:
                raise ValueError(
                    "GPT-2's fused c_attn is multi-head attention: n_kv_heads must equal n_heads"
                )
            weights = {p: Slot(name, 1, i * d, transposed=True) for i, p in enumerate("qkv")}
            weights["o"] = Slot(pre + "c_proj.weight", 0, 0, transposed=True)
            bias = pre + "c_attn.bias"
            biases = {p: Slot(bias, 0, i * d) for i, p in enumerate("qkv")} if bias in state else {}
            layers.append(AttnLayer(int(m["l"]), n_heads, n_kv, d_h, weights, biases))
    if not layers:
        raise ValueError(
            "found no attention projections (expected blocks.N.attn.q_proj, layers.N.self_attn.q_proj or "
            f"h.N.attn.c_attn) among {len(state)} tensors, e.g. {list(state)[:4]}"
        )
    return sorted(layers, key=lambda a: a.layer)


def head_block(state: Mapping[str, Tensor], att: AttnLayer, proj: str, h: int) -> Tensor:
    """Head (or kv-group) ``h``'s block of projection ``proj`` in ``[out, in]`` layout (a view, no copy)."""
    slot = att.weights[proj]
    block = state[slot.name].narrow(slot.axis, slot.offset + h * att.head_dim, att.head_dim)
    return block.mT if slot.transposed else block


def split_heads(state: Mapping[str, Tensor], att: AttnLayer) -> dict[str, Tensor]:
    """``{q: [H, d_h, d], k: [G, d_h, d], v: [G, d_h, d], o: [H, d, d_h]}`` (copies)."""
    return {p: torch.stack([head_block(state, att, p, h) for h in range(att.heads_of(p))]) for p in PROJ}


def merge_heads(
    state: Mapping[str, Tensor], att: AttnLayer, blocks: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """The inverse of ``split_heads``: new tensors for the projections' names, with the blocks written back."""
    out = {slot.name: state[slot.name].clone() for slot in att.weights.values()}
    for p, stacked in blocks.items():
        slot = att.weights[p]
        for h in range(att.heads_of(p)):
            target = out[slot.name].narrow(slot.axis, slot.offset + h * att.head_dim, att.head_dim)
            target.copy_(stacked[h].mT if slot.transposed else stacked[h])
    return out


Unit = tuple[int, int]  # (layer index in find_attention's list, kv-group)


def units(layers: list[AttnLayer]) -> list[Unit]:
    return [(i, g) for i, att in enumerate(layers) for g in range(att.n_kv_heads)]


def unit_slices(att: AttnLayer, g: int) -> list[tuple[str, int, int, int]]:
    """``(tensor name, axis, start, length)`` of everything kv-group ``g`` owns: its query heads' q rows and o
    columns, its k and v rows, and the matching q/k/v bias entries."""
    d_h, gs = att.head_dim, att.group_size
    out = []
    for p, slot in list(att.weights.items()) + [(f"{p}_bias", s) for p, s in att.biases.items()]:
        kind = p[0]
        first, count = (g, 1) if kind in ("k", "v") else (g * gs, gs)
        out.append((slot.name, slot.axis, slot.offset + first * d_h, count * d_h))
    return out


def rewind_mask(
    state: Mapping[str, Tensor], layers: list[AttnLayer], chosen: Iterable[Unit]
) -> dict[str, Tensor]:
    """The 0/1 mask ``M_R`` (float, only for the tensors it touches) of the units in ``chosen``."""
    masks: dict[str, Tensor] = {}
    for i, g in chosen:
        for name, axis, start, length in unit_slices(layers[i], g):
            m = masks.setdefault(name, torch.zeros_like(state[name]))
            m.narrow(axis, start, length).fill_(1.0)
    return masks


def rewind(
    tuned: Mapping[str, Tensor], base: Mapping[str, Tensor], layers: list[AttnLayer], chosen: Iterable[Unit]
) -> dict[str, Tensor]:
    """``θ_R``: ``tuned`` with the slices of the ``chosen`` units copied back from ``base`` (exact copies)."""
    out = dict(tuned)
    for name, mask in rewind_mask(tuned, layers, chosen).items():
        out[name] = torch.where(mask.bool(), base[name], tuned[name])
    return out
