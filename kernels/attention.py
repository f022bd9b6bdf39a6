"""The shared dense attention entry point: ``attention(q, k, v)`` for [B, H, M, d] queries and [B, H_kv, N, d] keys
and values (no mask, not causal; H a multiple of H_kv), differentiable.

``impl`` follows ``kernels.dispatch`` with one difference, because the Triton kernel of this folder
(``block_sparse_attention``, kernel a) is forward-only:

* ``"auto"``: ``torch.nn.functional.scaled_dot_product_attention`` (its fused flash / memory-efficient kernels on
  CUDA, the math path on CPU); gradients flow.
* ``"triton"``: kernel a with every block allowed and ``causal=False`` (a dense flash attention), only where no
  gradient is wanted (``torch.no_grad()`` or inputs that need none); on CPU tensors under ``TRITON_INTERPRET=1``.
* ``"reference"``: fp32 softmax(QKᵀ·scale)V, the reference both are tested against.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from litlab.kernels.dispatch import IMPLS, use_triton


def _check(q, k, v) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(
            f"q [B,H,M,d], k/v [B,H_kv,N,d] expected; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[1] % k.shape[1] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"need equal batch, H % H_kv == 0 and equal head dims; got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )


def attention_reference(q, k, v, sm_scale: float | None = None):
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1).float(), v.repeat_interleave(g, 1).float()
    s = (q.float() @ k.transpose(-1, -2)) * (sm_scale or 1.0 / math.sqrt(q.shape[-1]))
    return (torch.softmax(s, -1) @ v).to(q.dtype)


def attention(q, k, v, sm_scale: float | None = None, impl: str = "auto"):
    """o [B, H, M, d] = softmax(q kᵀ · scale) v (see the module docstring for ``impl``)."""
    _check(q, k, v)
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is not one of {IMPLS}")
    if impl == "reference":
        return attention_reference(q, k, v, sm_scale)
    if impl == "triton":
        if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
            raise RuntimeError(
                "impl='triton' is forward-only (kernel a has no backward): call it under torch.no_grad()"
            )
        use_triton(impl, q, k, v)  # the interpreter check on CPU tensors
        from litlab.kernels.block_sparse_attention import block_sparse_attention  # imports triton: only here

        block_q, block_k = 16, 16
        if q.shape[2] > k.shape[2]:
            raise ValueError(f"impl='triton' needs M <= N (kernel a); got M={q.shape[2]}, N={k.shape[2]}")
        mask = torch.ones(
            q.shape[0],
            q.shape[1],
            -(-q.shape[2] // block_q),
            -(-k.shape[2] // block_k),
            dtype=torch.bool,
            device=q.device,
        )
        return block_sparse_attention(
            q, k, v, mask, block_q, block_k, causal=False, sm_scale=sm_scale, impl="triton"
        )
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    return F.scaled_dot_product_attention(q, k, v, scale=sm_scale)
