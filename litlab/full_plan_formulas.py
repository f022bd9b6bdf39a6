"""The FLOP and activation formulas of ``litlab.full_plan`` (its docstring states them), and the meta-device counts
for models that are not transformer stacks."""

from __future__ import annotations

import dataclasses
import re
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from litlab.lit_modules.core.adapters import AdapterLinear, KhatriRaoBranch, LowRankBranch

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# the first layer's projections of the (frozen) embedding: their input needs no gradient
# linears of one layer that read the same tensor
SAME_INPUT = re.compile(r"(\.)(q_proj|k_proj|v_proj|query|key|value|gate_proj|up_proj)$")
FIRST_LAYER_QKV = re.compile(
    r"(^|\.)(layers|layer|h)\.0\.(self_attn|attention)\.(q_proj|k_proj|v_proj|query|key|value)$"
)


@dataclasses.dataclass
class Stack:
    """A transformer stack's numbers, read off the built model (meta device) and its config."""

    layers: int
    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    intermediate: int
    vocab: int
    gated_mlp: bool = True

    @property
    def d_q(self) -> int:
        return self.heads * self.head_dim

    @property
    def d_kv(self) -> int:
        return self.kv_heads * self.head_dim

    @classmethod
    def of(cls, config, vocab: int | None = None, gated_mlp: bool = True) -> Stack:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            heads=heads,
            head_dim=head_dim,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            intermediate=getattr(config, "intermediate_size", None) or config.ffn_dim,  # OPT: ffn_dim
            vocab=getattr(config, "vocab_size", 0) if vocab is None else vocab,
            gated_mlp=gated_mlp and not hasattr(config, "ffn_dim"),
        )


@dataclasses.dataclass
class MatmulWeights:
    """The matmul weights of a model after its trainability is set: frozen, trained, adapter branches (a
    Khatri-Rao branch as its materialised d_in x d_out), and what needs no input gradient (``FIRST_LAYER_QKV``)."""

    frozen: int = 0
    trained: int = 0
    adapter: int = 0
    skip: int = 0
    skip_adapter: int = 0
    # what adapted linears keep for their factors' gradients: their input (once per group of linears reading the
    # same tensor, or once per linear where autocast casts each apart) and the low-rank middle
    adapted_inputs_shared: int = 0
    adapted_inputs_each: int = 0
    adapter_middle: int = 0
    dropout_inputs: int = 0  # a branch with dropout keeps its own dropped copy and the mask (1 byte) instead

    @classmethod
    def of(cls, model: nn.Module, input_needs_grad: bool = False) -> MatmulWeights:
        w = cls()
        groups: set[str] = set()
        for name, module in model.named_modules():
            if isinstance(module, AdapterLinear):
                first = FIRST_LAYER_QKV.search(name) is not None and not input_needs_grad
                dropout = any(isinstance(b.dropout, nn.Dropout) for b in module.branches.values())
                group = SAME_INPUT.sub(r"\1<in>", name)
                if dropout:
                    w.dropout_inputs += module.in_features
                elif group not in groups:
                    groups.add(group)
                    w.adapted_inputs_shared += module.in_features
                w.adapted_inputs_each += 0 if dropout else module.in_features
                for branch in module.branches.values():
                    if isinstance(branch, KhatriRaoBranch):  # x @ ΔWᵀ with ΔW materialised
                        w.adapter += module.in_features * module.out_features
                        w.skip_adapter += module.in_features * module.out_features if first else 0
                    elif isinstance(branch, LowRankBranch):
                        w.adapter += branch.A.numel() + branch.B.numel()
                        w.skip_adapter += branch.A.numel() if first else 0
                        w.adapter_middle += branch.rank
            elif isinstance(module, (nn.Linear, nn.Conv2d)):
                n = module.weight.numel()
                if module.weight.requires_grad:
                    w.trained += n
                else:
                    w.frozen += n
                    base_name = name.removesuffix(".base")
                    if FIRST_LAYER_QKV.search(base_name) and not input_needs_grad:
                        w.skip += n
        return w


def attention_flops(stack: Stack, batch: int, seq: int) -> int:
    """Scores and weighted sum over the full s x s matrix, every layer, forward."""
    return 4 * stack.layers * batch * seq * seq * stack.d_q


def lm_flops(
    w: MatmulWeights, stack: Stack, batch: int, seq: int, train: bool, recompute: bool = False
) -> int:
    """One step's FLOPs (the formula in ``litlab.full_plan``'s docstring)."""
    tokens = batch * seq
    forward = 2 * (w.frozen + w.trained + w.adapter) * tokens + attention_flops(stack, batch, seq)
    if not train:
        return forward
    backward = (
        2 * (w.frozen - w.skip) * tokens
        + 4 * w.trained * tokens
        + 4 * w.adapter * tokens
        - 2 * w.skip_adapter * tokens
        + 2 * attention_flops(stack, batch, seq)
    )
    return forward + backward + (forward if recompute else 0)


def lm_activation_bytes(
    stack: Stack,
    w: MatmulWeights,
    batch: int,
    seq: int,
    dtype: str,
    trained: bool,
    fp32_residual: bool,
    fp32_weights: bool = True,
    with_loss: bool = True,
    dropout_mask_bytes: int = 1,
) -> int:
    """Bytes kept for backward by one step (the formula in ``litlab.full_plan``'s docstring). An adapter with
    dropout keeps its dropped input and the mask: a bool on CUDA (``dropout_mask_bytes`` 1); the CPU's dropout keeps
    a mask of the input's dtype."""
    a = DTYPE_BYTES[dtype]
    r = 4 if fp32_residual else a
    h, i = stack.hidden, stack.intermediate
    autocast = a != r
    if trained:
        c_attn, c_mlp = (3, 2 if stack.gated_mlp else 1) if autocast else (1, 1)
        mlp = 4 * a * i if stack.gated_mlp else 2 * a * i
        per_token = (
            4 * r * h
            + 2 * r
            + (c_attn + c_mlp) * a * h
            + a * (3 * stack.d_q + 2 * stack.d_kv)
            + 4 * stack.heads
            + mlp
        )
        adapted = 0
    else:
        mlp = 3 * a * i if stack.gated_mlp else a * i
        per_token = 2 * r * h + 2 * r + a * (2 * stack.d_q + 2 * stack.d_kv) + 4 * stack.heads + mlp
        adapted = a * ((w.adapted_inputs_each if autocast else w.adapted_inputs_shared) + w.adapter_middle)
        adapted += (a + dropout_mask_bytes) * w.dropout_inputs
    total = stack.layers * per_token * batch * seq + adapted * batch * seq
    if autocast and fp32_weights:  # autocast's bf16 copies of the weights, kept for the input gradients
        total += 2 * (w.frozen + w.trained)
    if with_loss:
        total += 4 * stack.vocab * batch * seq
    return total


def saved_tensor_bytes(step: Callable[[], torch.Tensor], exclude: list[torch.Tensor] = ()) -> int:  # type: ignore[assignment]
    """Bytes of the distinct storages autograd keeps for backward while ``step()`` runs its forward (parameters in
    ``exclude`` not counted). Works on the meta device (storages told apart by identity, not address)."""
    skip = {t.untyped_storage()._cdata for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in skip:
            seen[storage._cdata] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = step()
    del out
    return sum(seen.values())


def counted_flops(step: Callable[[], torch.Tensor], backward: bool) -> int:
    """FlopCounterMode's count of ``step()`` (and of its backward), on whatever device its tensors are."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        out = step()
        if backward:
            out.float().sum().backward()
    return int(counter.get_total_flops())


class LiveStoragePeak(TorchDispatchMode):
    """The peak of the bytes held by live storages (the tracked tensors' and every op's outputs) while it is
    active: what a step needs at its fullest, measured on any device (a CPU has no allocator statistics)."""

    def __init__(self, tracked: list[torch.Tensor] = ()) -> None:  # type: ignore[assignment]
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0
        for t in tracked:
            self.track(t)

    def track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.live:
            return
        self.live[key] = size = storage.nbytes()
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out
