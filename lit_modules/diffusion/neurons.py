"""Concept neurons: rows of the cross-attention key/value projections, their per-probe saliency, their diagonal
Fisher, and the row-selective update (SCNS, "Submodular Concept Neuron Selection", ICML 2026; the neuron
definition follows its predecessor CNS, "Continual Personalization for Diffusion Models", arXiv 2510.02296).

* ``ground_set(unet, kinds)``: the neurons ``(layer, proj, row)`` of every cross-attention ``attn2.to_k`` /
  ``attn2.to_v`` (``kinds="kv"``; ``"kv+q+out"`` adds ``to_q`` rows and ``to_out.0`` rows) of a diffusers UNet,
  with a flat index ↔ (module, row) map and the parameter cost ``c_n = d_in (+1 with a bias)``. [R]
* ``per_sample_row_grads``: the per-sample gradients of the projection weights for a batch of independent
  samples in ONE backward, from the layers' inputs and output gradients (``G_i = Σ_tokens g_iᵀ x_i``; exact,
  because nothing in the UNet mixes samples of a batch). Saliency (first-order Taylor, as in Cones / SNIP)
  ``a_n^(m) = |<W_n, G_n^(m)>|`` and the diagonal empirical Fisher ``F(n) = Σ_i mean_m (G^(m)_{n,i})²`` (EWC,
  Kirkpatrick et al. 2017; squared per-sample gradients, not the squared mean gradient) come from it. [R]
* ``RowDeltaBranch``: a branch for the adapter core's ``AdapterLinear`` holding ``delta`` for the selected rows
  only: ``W_eff = W + scatter_rows(delta, idx)``; merged with ``AdapterLinear.merge(remove=True)``, after which
  ``unwrap_row_deltas`` puts the plain ``nn.Linear`` back (fusion-free: nothing per concept is kept). [R]
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from litlab.lit_modules.core.adapters import AdapterLinear

GROUND_SETS = {
    "kv": ("attn2.to_k", "attn2.to_v"),
    "kv+q+out": ("attn2.to_k", "attn2.to_v", "attn2.to_q", "attn2.to_out.0"),
}


@dataclass(frozen=True)
class GroundSet:
    """The neurons of a model: ``modules[i]`` (dotted name) owns flat indices ``offsets[i] … offsets[i+1]-1``."""

    modules: tuple[str, ...]
    rows: tuple[int, ...]  # output rows of each module
    costs: Tensor  # (N,) parameters per neuron

    @property
    def offsets(self) -> list[int]:
        out = [0]
        for r in self.rows:
            out.append(out[-1] + r)
        return out

    @property
    def size(self) -> int:
        return sum(self.rows)

    def split(self, flat: Tensor | list[int]) -> dict[str, Tensor]:
        """Flat neuron indices -> {module: sorted row indices} (modules without a selected row are left out)."""
        flat = torch.as_tensor(flat, dtype=torch.long)
        out: dict[str, Tensor] = OrderedDict()
        offs = self.offsets
        for i, name in enumerate(self.modules):
            sel = flat[(flat >= offs[i]) & (flat < offs[i + 1])] - offs[i]
            if len(sel):
                out[name] = torch.sort(sel).values
        return out

    def ref(self, flat: int) -> tuple[str, int]:
        offs = self.offsets
        for i, name in enumerate(self.modules):
            if flat < offs[i + 1]:
                return name, flat - offs[i]
        raise IndexError(f"neuron {flat} is outside the ground set of {self.size}")


def ground_set(model: nn.Module, kinds: str = "kv") -> GroundSet:
    if kinds not in GROUND_SETS:
        raise ValueError(f"ground_set must be one of {sorted(GROUND_SETS)}, got {kinds!r}")
    suffixes = GROUND_SETS[kinds]
    mods, rows, costs = [], [], []
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and any(name.endswith(s) for s in suffixes):
            mods.append(name)
            rows.append(m.out_features)
            costs += [m.in_features + (1 if m.bias is not None else 0)] * m.out_features
    if not mods:
        raise ValueError(f"no cross-attention projection {suffixes} in {type(model).__name__}")
    return GroundSet(tuple(mods), tuple(rows), torch.tensor(costs, dtype=torch.float64))


def per_sample_row_grads(model: nn.Module, gs: GroundSet, loss_fn: Callable[[], Tensor]) -> dict[str, Tensor]:
    """{module: (B, d_out, d_in)} gradients of each sample's loss w.r.t. the module's weight, for ``loss_fn()``
    returning the (B,) per-sample losses of a batch of independent samples (one backward of their sum)."""
    inputs: dict[str, Tensor] = {}
    grads: dict[str, Tensor] = {}
    handles = []
    weights = [model.get_submodule(name).weight for name in gs.modules]
    was = [w.requires_grad for w in weights]
    for w in weights:
        w.requires_grad_(True)  # the graph must run through the projections
    for name in gs.modules:
        mod = model.get_submodule(name)

        def fwd(m, args, out, name=name):
            inputs[name] = args[0].detach()

            def keep(g, name=name):
                grads[name] = g.detach()

            out.register_hook(keep)

        handles.append(mod.register_forward_hook(fwd))
    try:
        with torch.enable_grad():
            losses = loss_fn()
            if losses.ndim != 1:
                raise ValueError(
                    f"loss_fn must return per-sample losses (B,), got shape {tuple(losses.shape)}"
                )
            losses.sum().backward()
    finally:
        for h in handles:
            h.remove()
        for w, flag in zip(weights, was):
            w.requires_grad_(flag)
            w.grad = None
    out = {}
    for name in gs.modules:
        x, g = inputs[name], grads[name]
        out[name] = torch.einsum(
            "b...o,b...i->boi", g.reshape(g.shape[0], -1, g.shape[-1]), x.reshape(x.shape[0], -1, x.shape[-1])
        )
    return out


def row_saliency(model: nn.Module, gs: GroundSet, grads: dict[str, Tensor]) -> Tensor:
    """(M, N) first-order Taylor saliency ``a_n^(m) = |<W_n, G_n^(m)>|`` of every neuron on every probe."""
    cols = []
    for name in gs.modules:
        w = model.get_submodule(name).weight.detach()
        cols.append((grads[name] * w.unsqueeze(0)).sum(-1).abs())
    return torch.cat(cols, dim=1).double()


def diag_empirical_fisher(grads_per_sample: dict[str, Tensor]) -> dict[str, Tensor]:
    """Element-wise ``mean_m (dL_m/dW)²`` of per-sample gradients ``{name: (M, *shape)}``."""
    return {k: (g.double() ** 2).mean(0) for k, g in grads_per_sample.items()}


def neuron_fisher(gs: GroundSet, fisher: dict[str, Tensor]) -> Tensor:
    """Per-neuron Fisher ``F(n) = Σ_i F[n, i]`` (the row sum), flat over the ground set."""
    return torch.cat([fisher[name].reshape(fisher[name].shape[0], -1).sum(1) for name in gs.modules])


class RowDeltaBranch(nn.Module):
    """ΔW = scatter_rows(delta, idx): trainable ``delta`` (|idx|, d_in), zero-initialised, for the rows ``idx``
    only; a branch of ``AdapterLinear`` (the adapter core's layer), so merge / unmerge are the core's."""

    kind = "rows"

    def __init__(self, d_in: int, d_out: int, idx: Tensor):
        super().__init__()
        self.d_out = d_out
        self.register_buffer("idx", torch.as_tensor(idx, dtype=torch.long).clone())
        self.delta = nn.Parameter(torch.zeros(len(self.idx), d_in))

    def factors(self) -> dict[str, nn.Parameter]:
        return {"delta": self.delta}

    @property
    def dtype(self) -> torch.dtype:
        return self.delta.dtype

    def delta_weight(self, coeff: Tensor | None = None) -> Tensor:
        full = torch.zeros(self.d_out, self.delta.shape[1], dtype=self.delta.dtype, device=self.delta.device)
        d = self.delta if coeff is None else self.delta * coeff
        return full.index_add(0, self.idx, d)

    def forward(self, x: Tensor) -> Tensor:
        # only the selected output rows change: y[..., idx] += x @ deltaᵀ
        out = torch.zeros(*x.shape[:-1], self.d_out, dtype=x.dtype, device=x.device)
        return out.index_add(-1, self.idx, x @ self.delta.T)


def attach_row_deltas(
    model: nn.Module, rows: dict[str, Tensor], branch: str = "rows"
) -> OrderedDict[str, AdapterLinear]:
    """Wrap each named projection in ``AdapterLinear`` with a ``RowDeltaBranch`` for its selected rows."""
    out: OrderedDict[str, AdapterLinear] = OrderedDict()
    for name, idx in rows.items():
        mod = model.get_submodule(name)
        layer = mod if isinstance(mod, AdapterLinear) else AdapterLinear(mod)
        layer.branches[branch] = RowDeltaBranch(layer.in_features, layer.out_features, idx).to(
            layer.base.weight.device
        )
        if layer is not mod:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, layer)
        out[name] = layer
    return out


@torch.no_grad()
def merge_row_deltas(model: nn.Module, adapted: dict[str, AdapterLinear], branch: str = "rows") -> None:
    """W[S_t] += delta (through ``AdapterLinear.merge(remove=True)``), then put the plain ``nn.Linear`` back."""
    for name, layer in adapted.items():
        layer.merge(branch, remove=True)
        if not layer.branches:
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, layer.base)
