"""The adapter core every LoRA-family method in litlab stands on (named branches as in LoRA, Hu et al., arXiv 2106.09685; the Khatri–Rao branch of KRAdapter, arXiv 2508.00230, and LoKRA, ICML 2026).

``AdapterLinear`` wraps a frozen ``nn.Linear`` and holds named *branches*; each branch adds a trainable
update ``ΔW`` to the frozen weight:

    y = W₀x + b₀ + Σ_k branch_k(x),        branch_k(x) = ΔW_k · dropout(x)

Two branch kinds cover the methods we ship:

* ``LowRankBranch``   ΔW = s · B diag(c) A        (LoRA, LoKRA, and every subspace method)
* ``KhatriRaoBranch`` ΔW = s · (D ⊙ C)[:d_out]    (LoKRA+)

A method adds its *rule* on top of this layer, not a layer of its own: a regulariser over the branch
factors (LoKRA), a gradient transform between backward and the optimizer step (GPM / InfLoRA / LoDA), an
update transform right after the step (Janus-LoRA), per-module ranks (CSPLoRA), given initial factors
(Gap-Init, LoDA), or input second moments collected during forward (subspace estimation).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import OrderedDict
from collections.abc import Callable, ItemsView, Iterable, Mapping, ValuesView
from pathlib import Path
from typing import ClassVar, Literal, cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from litlab.lit_modules.core.io import atomic_path
from litlab.lit_modules.core.kruskal import khatri_rao

BranchKind = Literal["lora", "khatri_rao"]
InitMode = Literal["kaiming_A_zero_B", "given", "orthonormal_in_complement", "zeros"]
PerModule = float | int | Mapping[str, float | int]


class AdapterBranch(nn.Module):
    """One trainable update ΔW of an ``AdapterLinear``: its factors by name (what optimizers, penalties and the
    PEFT export read), ``delta_weight``, ``kruskal_factors`` and ``forward``."""

    kind: ClassVar[str]

    def factors(self) -> dict[str, nn.Parameter]:
        raise NotImplementedError

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.factors().values())).dtype


class LowRankBranch(AdapterBranch):
    """ΔW = s · B diag(coeff) A, with A ∈ R^{r×d_in} (reads the input) and B ∈ R^{d_out×r} (writes it)."""

    kind = "lora"

    def __init__(
        self,
        d_in: int,
        d_out: int,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        init: InitMode = "kaiming_A_zero_B",
        train_A: bool = True,
        train_B: bool = True,
        A0: Tensor | None = None,
        B0: Tensor | None = None,
        complement_basis: Tensor | None = None,
    ):
        super().__init__()
        if rank < 1:
            raise ValueError(f"adapter rank must be >= 1, got {rank}")
        self.rank, self.alpha, self.scale = rank, float(alpha), float(alpha) / rank
        self.A = nn.Parameter(torch.zeros(rank, d_in), requires_grad=train_A)
        self.B = nn.Parameter(torch.zeros(d_out, rank), requires_grad=train_B)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        with torch.no_grad():
            if init == "kaiming_A_zero_B":
                nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # PEFT's default
            elif init == "given":
                if A0 is None or B0 is None:
                    raise ValueError("init='given' needs both A0 and B0")
                self.A.copy_(A0)
                self.B.copy_(B0)
            elif init == "orthonormal_in_complement":
                self.A.copy_(_orthonormal_rows_in_complement(rank, d_in, complement_basis))
            elif init != "zeros":
                raise ValueError(f"unknown adapter init {init!r}; expected one of {InitMode.__args__}")

    def factors(self) -> dict[str, nn.Parameter]:
        return {"A": self.A, "B": self.B}

    def kruskal_factors(self) -> list[Tensor]:
        """Matrices whose columns should be k-independent: A and Bᵀ (LoKRA's Kruskal-rank condition on the factors)."""
        return [self.A, self.B.T]

    def delta_weight(self, coeff: Tensor | None = None) -> Tensor:
        B = self.B if coeff is None else self.B * coeff.to(self.B)
        return self.scale * (B @ self.A)

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * ((self.dropout(x) @ self.A.T) @ self.B.T)


class KhatriRaoBranch(AdapterBranch):
    """ΔW = s · (D ⊙ C)[:d_out], D ∈ R^{r₁×d_in} Kaiming, C ∈ R^{r₂×d_in} zero (LoKRA+, the Khatri–Rao parameterisation of KRAdapter, arXiv 2508.00230).

    Reconstructed (LoKRA's text could not be read; chosen): r₂ = ⌈d_out/r₁⌉ by default, scale α/r₁, Khatri–Rao over the input
    columns with surplus rows dropped. ``factored=True`` uses the einsum path instead of materialising ΔW.
    """

    kind = "khatri_rao"

    def __init__(
        self,
        d_in: int,
        d_out: int,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        r2: int | None = None,
        factored: bool = False,
    ):
        super().__init__()
        r2 = math.ceil(d_out / rank) if r2 is None else r2
        if rank < 1 or rank * r2 < d_out:
            raise ValueError(f"Khatri-Rao branch needs r1*r2 >= d_out, got r1={rank}, r2={r2}, d_out={d_out}")
        self.rank, self.r2, self.d_out = rank, r2, d_out
        self.alpha, self.scale, self.factored = float(alpha), float(alpha) / rank, factored
        self.D = nn.Parameter(torch.empty(rank, d_in))
        self.C = nn.Parameter(torch.zeros(r2, d_in))  # C = 0 keeps ΔW = 0 at init
        nn.init.kaiming_uniform_(self.D, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def factors(self) -> dict[str, nn.Parameter]:
        return {"D": self.D, "C": self.C}

    def kruskal_factors(self) -> list[Tensor]:
        return [self.D, self.C]

    def delta_weight(self, coeff: Tensor | None = None) -> Tensor:
        if coeff is not None:
            raise ValueError("merge coefficients are defined for low-rank branches only, not Khatri-Rao")
        return self.scale * khatri_rao(self.D, self.C)[: self.d_out]

    def forward(self, x: Tensor) -> Tensor:
        x = self.dropout(x)
        if not self.factored:
            return x @ self.delta_weight().T
        # z[..., a, c] = Σ_j D[a, j] x[..., j] C[c, j], flattened to the Khatri–Rao row order a·r₂ + c
        z = torch.einsum("aj,...j,cj->...ac", self.D, x, self.C)
        return self.scale * z.flatten(-2)[..., : self.d_out]


Branch = LowRankBranch | KhatriRaoBranch


class Branches(nn.ModuleDict):
    """An adapter layer's branches by name: a ``ModuleDict`` that type checkers know to hold branches."""

    def __getitem__(self, name: str) -> Branch:
        return cast("Branch", super().__getitem__(name))

    def items(self) -> ItemsView[str, Branch]:
        return cast("ItemsView[str, Branch]", super().items())

    def values(self) -> ValuesView[Branch]:
        return cast("ValuesView[Branch]", super().values())


class AdapterLinear(nn.Module):
    """A frozen ``nn.Linear`` plus named adapter branches; merge/unmerge like PEFT."""

    def __init__(self, base: nn.Linear):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"AdapterLinear wraps nn.Linear, got {type(base).__name__}")
        self.base = base
        self.base.weight.requires_grad_(False)
        if self.base.bias is not None:
            self.base.bias.requires_grad_(False)
        self.branches = Branches()
        self._merged: dict[str, Tensor | None] = {}  # branch name -> coeff it was merged with
        self.stats_mode: Literal["off", "accumulate"] = "off"
        self.reset_stats()

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    # ---- branches -------------------------------------------------------------------------------
    def add_branch(
        self,
        name: str,
        kind: BranchKind = "lora",
        rank: int = 8,
        alpha: float = 16.0,
        dropout: float = 0.0,
        **kwargs,
    ) -> Branch:
        if name in self.branches:
            raise ValueError(f"branch {name!r} already exists on this layer")
        cls = {"lora": LowRankBranch, "khatri_rao": KhatriRaoBranch}.get(kind)
        if cls is None:
            raise ValueError(f"unknown branch kind {kind!r}; expected 'lora' or 'khatri_rao'")
        branch = cls(self.in_features, self.out_features, rank, alpha, dropout, **kwargs)
        self.branches[name] = branch.to(self.base.weight.device)
        return branch

    def remove_branch(self, name: str) -> None:
        """Drop a branch; a merged one stays folded into W₀ (unmerge first to take it out)."""
        self._merged.pop(name, None)
        del self.branches[name]

    def delta_weight(self, name: str | None = None) -> Tensor:
        names = list(self.branches) if name is None else [name]
        delta = torch.zeros_like(self.base.weight)
        for n in names:
            delta = delta + self.branches[n].delta_weight().to(delta.dtype)
        return delta

    def effective_weight(self) -> Tensor:
        unmerged = [n for n in self.branches if n not in self._merged]
        return self.base.weight + sum(
            (self.delta_weight(n) for n in unmerged), torch.zeros_like(self.base.weight)
        )

    # ---- merge --------------------------------------------------------------------------------
    @torch.no_grad()
    def merge(self, name: str | None = None, coeff: Tensor | None = None, remove: bool = False) -> None:
        """W₀ ← W₀ + s·B diag(coeff) A. ``remove=True`` folds the branch in for good (LoDA's per-task merge)."""
        for n in [name] if name is not None else [b for b in self.branches if b not in self._merged]:
            if n in self._merged:
                raise RuntimeError(f"branch {n!r} is already merged")
            delta = self.branches[n].delta_weight(coeff).double()
            self.base.weight.copy_((self.base.weight.double() + delta).to(self.base.weight.dtype))
            if remove:
                del self.branches[n]
            else:
                self._merged[n] = None if coeff is None else coeff.detach().clone()

    @torch.no_grad()
    def fold_in(self, name: str, coeff: Tensor | None = None) -> None:
        """W₀ ← W₀ + s·B diag(coeff) A, then B ← 0: the task's update becomes part of the base while the branch
        keeps its parameters (and its place in the optimizer), adding nothing until it is re-initialised —
        the per-task merge of LoDA, InfLoRA and O-LoRA inside one fit."""
        branch = self.branches[name]
        if not isinstance(branch, LowRankBranch):
            raise ValueError(f"fold_in needs a low-rank branch; {name!r} is {type(branch).__name__}")
        if name in self._merged:
            raise RuntimeError(f"branch {name!r} is merged; unmerge it before folding it in")
        delta = branch.delta_weight(coeff).double()
        self.base.weight.copy_((self.base.weight.double() + delta).to(self.base.weight.dtype))
        branch.B.zero_()

    @torch.no_grad()
    def unmerge(self, name: str | None = None) -> None:
        for n in [name] if name is not None else list(self._merged):
            coeff = self._merged.pop(n)
            delta = self.branches[n].delta_weight(coeff).double()
            self.base.weight.copy_((self.base.weight.double() - delta).to(self.base.weight.dtype))

    # W₀ in a checkpoint already holds merged branches: which ones must travel with it, or a reload
    # would add them a second time.
    def get_extra_state(self) -> dict:
        return {"merged": dict(self._merged)}

    def set_extra_state(self, state: dict) -> None:
        self._merged = dict(state.get("merged", {}))

    # ---- input statistics (subspace estimation) -----------------------------------------------
    def reset_stats(self) -> None:
        self.input_second_moment: Tensor | None = None  # (1/n) Σ x xᵀ, float64
        self.n_tokens = 0

    @torch.no_grad()
    def _accumulate(self, x: Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1]).double()
        total = flat.T @ flat
        n = self.n_tokens + flat.shape[0]
        if self.input_second_moment is None:
            self.input_second_moment = total / n
        else:
            self.input_second_moment = self.input_second_moment * (self.n_tokens / n) + total / n
        self.n_tokens = n

    # The fused LoRA kernel (kernel c2, ``kernels/lora_linear.py``: W₀x + b₀ + s·B(Ax) in one pass) replaces the
    # unfused sum when exactly one unmerged branch is active, it is a plain ``LowRankBranch`` without dropout, and
    # x, W₀ and the factors share one dtype. ``auto``: on CUDA only; ``triton``: also on the CPU (needs
    # TRITON_INTERPRET=1, for tests); ``reference``: never.
    fused_impl: ClassVar[Literal["auto", "triton", "reference"]] = "auto"

    def fused_branch(self, x: Tensor) -> LowRankBranch | None:
        """The branch the fused kernel would compute for this input, or None (unfused path)."""
        if self.fused_impl == "reference" or (self.fused_impl == "auto" and not x.is_cuda):
            return None
        active = [n for n in self.branches if n not in self._merged]
        if len(active) != 1:
            return None
        branch = self.branches[active[0]]
        if (
            type(branch) is not LowRankBranch
            or not isinstance(branch.dropout, nn.Identity)
            or branch.rank > 128
        ):
            return None
        if not (x.dtype == self.base.weight.dtype == branch.A.dtype == branch.B.dtype):
            return None
        return branch

    def forward(self, x: Tensor) -> Tensor:
        if self.stats_mode == "accumulate":
            self._accumulate(x)
        fused = self.fused_branch(x)
        if fused is not None:
            from litlab.kernels.lora_linear import lora_linear  # imports triton: only when it runs

            return lora_linear(
                x, self.base.weight, fused.A, fused.B, fused.scale, self.base.bias, impl="triton"
            )
        y = self.base(x)
        for name, branch in self.branches.items():
            if name not in self._merged:
                # factors stay float32 on a bf16/fp16 base (as in PEFT): compute in theirs, add in the base's
                y = y + branch(x.to(branch.dtype)).to(y.dtype)
        return y

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, branches={list(self.branches)}"


def _orthonormal_rows_in_complement(rank: int, d_in: int, basis: Tensor | None) -> Tensor:
    """``rank`` orthonormal rows inside the orthogonal complement of ``basis`` ([d_in, k], orthonormal)."""
    g = torch.randn(d_in, rank, dtype=torch.float64)
    if basis is not None and basis.numel():
        V = basis.double()
        if d_in - V.shape[1] < rank:
            raise ValueError(f"complement of a {V.shape[1]}-dim basis in R^{d_in} cannot hold rank {rank}")
        g = g - V @ (V.T @ g)
    q, _ = torch.linalg.qr(g)
    return q.T.float()


# ---- injection ------------------------------------------------------------------------------------
def _matches(name: str, targets: str | Iterable[str]) -> bool:
    if isinstance(targets, str):
        return re.fullmatch(targets, name) is not None
    return any(name == t or name.endswith("." + t) for t in targets)


def _per_module(value: PerModule, name: str, what: str) -> float | int:
    """A scalar, or a dict keyed by full module name or name suffix (longest suffix wins; "default")."""
    if not isinstance(value, Mapping):
        return value
    if name in value:
        return value[name]
    hits = sorted((k for k in value if name.endswith("." + k)), key=len, reverse=True)
    if hits:
        return value[hits[0]]
    if "default" in value:
        return value["default"]
    raise KeyError(f"no {what} given for module {name!r}; keys were {sorted(value)} (add it or a 'default')")


def target_linear_names(model: nn.Module, targets: str | Iterable[str]) -> list[str]:
    """The names of the ``nn.Linear`` modules (wrapped or not) that ``targets`` selects, in model order: the
    modules a rank plan must give ranks to."""
    if not isinstance(targets, str):
        targets = list(targets)
    inner = {id(m.base) for m in find_adapters(model).values()}
    return [
        n
        for n, m in model.named_modules()
        if isinstance(m, (nn.Linear, AdapterLinear)) and id(m) not in inner and _matches(n, targets)
    ]


def inject_adapters(
    model: nn.Module,
    targets: str | Iterable[str],
    rank: PerModule = 8,
    alpha: PerModule = 16.0,
    dropout: PerModule = 0.0,
    kind: BranchKind = "lora",
    branch: str = "default",
    keep_trainable: Iterable[str] = (),
    **branch_kwargs,
) -> OrderedDict[str, AdapterLinear]:
    """Wrap every ``nn.Linear`` whose name matches ``targets`` and freeze everything else.

    ``targets``: a list of name suffixes (``["q_proj", "v_proj"]``) or one regex matched against the full
    module name. ``rank``/``alpha``/``dropout``: a scalar or a per-module dict (a rank plan); rank 0 skips
    the module. A module already wrapped gets a new branch named ``branch`` (several branches per layer).
    ``keep_trainable``: name suffixes of parameters that stay trainable (a classifier head, say).
    Returns ``{module name: AdapterLinear}`` in model order.
    """
    if not isinstance(targets, str):
        targets = list(targets)
    wrapped_bases = {id(m.base) for m in find_adapters(model).values()}
    candidates = [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, (nn.Linear, AdapterLinear)) and id(m) not in wrapped_bases
    ]
    chosen = [(n, m) for n, m in candidates if _matches(n, targets)]
    if not chosen:
        names = [n for n, _ in candidates]
        raise ValueError(
            f"adapter targets {targets!r} match no linear module; the model's linear modules "
            f"include {names[:12]}{' …' if len(names) > 12 else ''}"
        )
    adapted: OrderedDict[str, AdapterLinear] = OrderedDict()
    for name, module in chosen:
        r = int(_per_module(rank, name, "rank"))
        if r == 0:
            continue
        layer = module if isinstance(module, AdapterLinear) else AdapterLinear(module)
        layer.add_branch(
            branch,
            kind,
            r,
            float(_per_module(alpha, name, "alpha")),
            float(_per_module(dropout, name, "dropout")),
            **branch_kwargs,
        )
        if layer is not module:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
        adapted[name] = layer
    freeze_non_adapters(model, keep_trainable)
    return adapted


def find_adapters(model: nn.Module) -> OrderedDict[str, AdapterLinear]:
    return OrderedDict((n, m) for n, m in model.named_modules() if isinstance(m, AdapterLinear))


def freeze_non_adapters(model: nn.Module, keep_trainable: Iterable[str] = ()) -> None:
    """Only adapter factors (those their branch marked trainable) and ``keep_trainable`` stay trainable."""
    keep = list(keep_trainable)
    trainable_factors = {
        id(p)
        for m in find_adapters(model).values()
        for b in m.branches.values()
        for p in b.factors().values()
        if p.requires_grad
    }
    for name, p in model.named_parameters():
        p.requires_grad_(
            id(p) in trainable_factors
            or any(
                name == k or name.startswith(k + ".") or name.endswith("." + k) or ("." + k + ".") in name
                for k in keep
            )
        )


def adapter_parameters(adapted: Mapping[str, AdapterLinear]) -> list[nn.Parameter]:
    return [
        p
        for m in adapted.values()
        for b in m.branches.values()
        for p in b.factors().values()
        if p.requires_grad
    ]


# ---- method hook points ---------------------------------------------------------------------------
Factors = dict[str, Tensor]


def adapter_regularizer(
    adapted: Mapping[str, AdapterLinear], fn: Callable[[str, str, Branch], Tensor]
) -> Tensor:
    """Mean over every (module, branch) of ``fn(module_name, branch_name, branch)`` (e.g. LoKRA's penalty)."""
    terms = [
        fn(mn, bn, b) for mn, m in adapted.items() for bn, b in m.branches.items() if bn not in m._merged
    ]
    if not terms:
        raise ValueError("adapter_regularizer found no unmerged branch")
    return torch.stack(terms).mean()


def transform_adapter_grads(
    adapted: Mapping[str, AdapterLinear], fn: Callable[[str, str, Branch, Factors], Factors]
) -> None:
    """Between backward and ``optimizer.step()``: replace factor gradients by ``fn(...)`` (GPM, LoDA)."""
    for mn, m in adapted.items():
        for bn, b in m.branches.items():
            grads = {k: p.grad for k, p in b.factors().items() if p.grad is not None}
            for k, g in fn(mn, bn, b, grads).items():
                b.factors()[k].grad = g


@torch.no_grad()
def snapshot_factors(adapted: Mapping[str, AdapterLinear]) -> dict[tuple[str, str], Factors]:
    """Copy of every factor, taken just before ``optimizer.step()`` for ``transform_adapter_updates``."""
    return {
        (mn, bn): {k: p.detach().clone() for k, p in b.factors().items()}
        for mn, m in adapted.items()
        for bn, b in m.branches.items()
    }


@torch.no_grad()
def transform_adapter_updates(
    adapted: Mapping[str, AdapterLinear],
    before: Mapping[tuple[str, str], Factors],
    fn: Callable[[str, str, Branch, Factors, Factors], Factors],
) -> None:
    """Right after ``optimizer.step()``: ``fn(module, branch_name, branch, old, new) -> factors`` (Janus-LoRA)."""
    for mn, m in adapted.items():
        for bn, b in m.branches.items():
            new = {k: p.detach() for k, p in b.factors().items()}
            for k, v in fn(mn, bn, b, before[(mn, bn)], new).items():
                b.factors()[k].copy_(v)


# ---- saving adapters apart from the base model ----------------------------------------------------
def adapter_state_dict(adapted: Mapping[str, AdapterLinear]) -> dict[str, Tensor]:
    return {
        f"{mn}::{bn}::{k}": p.detach().contiguous().cpu()
        for mn, m in adapted.items()
        for bn, b in m.branches.items()
        for k, p in b.factors().items()
    }


def _branch_config(b: Branch) -> dict:
    cfg = {"kind": b.kind, "rank": b.rank, "alpha": b.alpha}
    if isinstance(b, KhatriRaoBranch):
        cfg["r2"] = b.r2
    return cfg


def save_adapters(
    adapted: Mapping[str, AdapterLinear], path: str | os.PathLike, extra: Mapping | None = None
) -> Path:
    """Write the adapter factors alone (safetensors) with their layout in the metadata; atomic."""
    path = Path(path)
    layout = {mn: {bn: _branch_config(b) for bn, b in m.branches.items()} for mn, m in adapted.items()}
    meta = {"litlab_adapters": json.dumps(layout), "extra": json.dumps(dict(extra or {}))}
    with atomic_path(path) as tmp:
        save_file(adapter_state_dict(adapted), str(tmp), metadata=meta)
    return path


def load_adapters(
    model: nn.Module, path: str | os.PathLike, keep_trainable: Iterable[str] = ()
) -> OrderedDict[str, AdapterLinear]:
    """Inject the branches recorded in ``path`` (if missing) and load their factors."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if "litlab_adapters" not in meta:
            raise ValueError(f"{path} is not a litlab adapter file (no 'litlab_adapters' metadata)")
        layout = json.loads(meta["litlab_adapters"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    existing = find_adapters(model)
    for mn, branches in layout.items():
        for bn, cfg in branches.items():
            if mn in existing and bn in existing[mn].branches:
                continue
            extra = {"r2": cfg["r2"]} if cfg["kind"] == "khatri_rao" else {}
            inject_adapters(
                model,
                re.escape(mn),
                cfg["rank"],
                cfg["alpha"],
                kind=cfg["kind"],
                branch=bn,
                keep_trainable=keep_trainable,
                **extra,
            )
    adapted = OrderedDict((mn, m) for mn, m in find_adapters(model).items() if mn in layout)
    with torch.no_grad():
        for key, value in tensors.items():
            mn, bn, k = key.split("::")
            adapted[mn].branches[bn].factors()[k].copy_(value)
    return adapted
