"""One dispatch rule for every kernel in `kernels/`.

``impl="auto"``: Triton on CUDA tensors, the PyTorch reference elsewhere. ``impl="triton"`` forces the kernel;
on CPU tensors that needs the Triton interpreter (``TRITON_INTERPRET=1``). ``impl="reference"`` forces PyTorch.

Kernels are compiled lazily (``lazy_jit``): ``triton.jit`` reads ``TRITON_INTERPRET`` when it wraps a function,
so wrapping at first launch, not at import, lets a test set the variable at the top of its module even when
another module imported ``kernels`` earlier in the same process.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch

IMPLS = ("auto", "triton", "reference")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(impl: str, *tensors: torch.Tensor) -> bool:
    """Whether to launch the Triton kernel for these tensors; clear errors for impossible requests."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
    on_cuda = all(t.is_cuda for t in tensors)
    if impl == "reference":
        return False
    if impl == "auto":
        return on_cuda
    if not on_cuda and not interpreting():
        raise RuntimeError(
            "impl='triton' on CPU tensors needs the Triton interpreter: set TRITON_INTERPRET=1"
        )
    return True


_jitted: dict[tuple[Callable, bool], object] = {}


def lazy_jit(fn: Callable, autotune_configs: list | None = None, key: list[str] | None = None):
    """``triton.jit(fn)`` made at first use (per interpreter mode); autotuned on GPU only (one config under the
    interpreter, where every program runs serially in numpy)."""
    import triton  # half a second, and absent where pyproject does not install it: only when a kernel is built

    mode = interpreting()
    if (fn, mode) not in _jitted:
        kernel = triton.jit(fn)
        if autotune_configs and not mode:
            kernel = triton.autotune(autotune_configs, key=key or [])(kernel)
        _jitted[(fn, mode)] = kernel
    return _jitted[(fn, mode)]


# Tests set this: every kernel output starts as NaN (floats) or 0xFF (integers), so an element the kernel
# forgot to write fails the comparison with the reference instead of passing by luck.
poison_outputs = False


def alloc(shape, dtype: torch.dtype, device) -> torch.Tensor:
    out = torch.empty(shape, dtype=dtype, device=device)
    if poison_outputs:
        out.fill_(float("nan") if dtype.is_floating_point else 255)
    return out


# CPU paths built on torch.compile (inductor needs a C++ compiler at run time): "unknown" until the first call,
# then "ok", or the reason it failed; impl="auto" takes the reference once a path has failed.
_compiled_paths: dict[str, str] = {}


def compiled_path_usable(name: str) -> bool:
    return _compiled_paths.get(name, "unknown") in ("unknown", "ok")


def run_compiled_or_fallback(name: str, compiled: Callable, reference: Callable, forced: bool):
    """``compiled()`` on the first call of ``name`` in this process, and from then on while it works; when
    that first call fails (no C++ compiler for inductor, an unsupported op) and the path was not ``forced``,
    warn once naming the cause and return ``reference()``, as every later call of ``name`` does."""
    if _compiled_paths.get(name) == "ok" or forced:
        return compiled()
    if not compiled_path_usable(name):
        return reference()
    try:
        out = compiled()
    except Exception as err:  # inductor's failures have no common base class
        _compiled_paths[name] = f"{type(err).__name__}: {err}"
        warnings.warn(
            f"{name}: the torch.compile path failed ({type(err).__name__}: {str(err)[:200]}); using the "
            "PyTorch reference for the rest of this process (slower on long prompts, same results)",
            RuntimeWarning,
            stacklevel=3,
        )
        return reference()
    _compiled_paths[name] = "ok"
    return out
