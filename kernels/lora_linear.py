"""Kernel c2: fused LoRA linear ``y = x W^T + bias + scaling (x A^T) B^T`` with autograd (LoRA, Hu et al., arXiv 2106.09685).

Forward is one Triton kernel (both products accumulated in one pass over ``in``, the rank-r intermediate kept in
registers); backward uses PyTorch matmuls. For adapter code: call ``lora_linear(x, base.weight, A, B, s,
base.bias)`` in place of ``base(x) + s * F.linear(F.linear(x, A), B)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from litlab.kernels.dispatch import alloc, interpreting, lazy_jit, use_triton


def lora_linear_reference(x, weight, lora_a, lora_b, scaling: float, bias=None):
    return F.linear(x, weight, bias) + scaling * F.linear(F.linear(x, lora_a), lora_b)


def _lora_linear_fwd(
    X,
    W,
    A,
    Bm,
    BIAS,
    Y,
    T,
    IN,
    OUT,
    R,
    scaling,
    HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_O: tl.constexpr,
    BLOCK_K: tl.constexpr,
    R_PAD: tl.constexpr,
    UPCAST: tl.constexpr,
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_o = tl.program_id(1) * BLOCK_O + tl.arange(0, BLOCK_O)
    offs_r = tl.arange(0, R_PAD)
    acc = tl.zeros([BLOCK_T, BLOCK_O], tl.float32)
    low = tl.zeros(
        [BLOCK_T, R_PAD], tl.float32
    )  # x A^T, recomputed per output tile instead of an HBM round trip
    for k0 in range(0, IN, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < IN
        x = tl.load(
            X + offs_t[:, None] * IN + offs_k[None, :], mask=(offs_t[:, None] < T) & k_ok[None, :], other=0.0
        )
        w = tl.load(
            W + offs_o[:, None] * IN + offs_k[None, :],
            mask=(offs_o[:, None] < OUT) & k_ok[None, :],
            other=0.0,
        )
        a = tl.load(
            A + offs_r[:, None] * IN + offs_k[None, :], mask=(offs_r[:, None] < R) & k_ok[None, :], other=0.0
        )
        if UPCAST:
            x, w, a = x.to(tl.float32), w.to(tl.float32), a.to(tl.float32)
        acc += tl.dot(x, tl.trans(w))
        low += tl.dot(x, tl.trans(a))
    bt = tl.load(
        Bm + offs_o[:, None] * R + offs_r[None, :],
        mask=(offs_o[:, None] < OUT) & (offs_r[None, :] < R),
        other=0.0,
    )
    if UPCAST:
        bt = bt.to(tl.float32)
    acc += scaling * tl.dot(low.to(bt.dtype), tl.trans(bt))
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_o, mask=offs_o < OUT, other=0.0).to(tl.float32)[None, :]
    tl.store(
        Y + offs_t[:, None] * OUT + offs_o[None, :],
        acc.to(Y.dtype.element_ty),
        mask=(offs_t[:, None] < T) & (offs_o[None, :] < OUT),
    )


def _lora_linear_triton(x2, weight, lora_a, lora_b, scaling, bias):
    T, IN = x2.shape
    OUT, R = lora_b.shape
    if R > 128:
        raise ValueError(f"lora_linear supports rank <= 128, got {R}")
    y = alloc((T, OUT), x2.dtype, x2.device)
    block_t = 16 if T <= 16 else 64
    grid = (triton.cdiv(T, block_t), triton.cdiv(OUT, 64))
    lazy_jit(_lora_linear_fwd)[grid](
        x2,
        weight.contiguous(),
        lora_a.contiguous(),
        lora_b.contiguous(),
        bias if bias is not None else y,
        y,
        T,
        IN,
        OUT,
        R,
        float(scaling),
        HAS_BIAS=bias is not None,
        BLOCK_T=block_t,
        BLOCK_O=64,
        BLOCK_K=64,
        R_PAD=max(16, triton.next_power_of_2(R)),
        UPCAST=interpreting() and x2.dtype == torch.bfloat16,
    )
    return y


class _LoRALinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, lora_a, lora_b, scaling, bias):
        ctx.save_for_backward(x, weight, lora_a, lora_b)
        ctx.scaling, ctx.has_bias = scaling, bias is not None
        y = _lora_linear_triton(
            x.reshape(-1, x.shape[-1]).contiguous(), weight, lora_a, lora_b, scaling, bias
        )
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, gy):
        x, weight, lora_a, lora_b = ctx.saved_tensors
        s = ctx.scaling
        x2, g2 = x.reshape(-1, x.shape[-1]), gy.reshape(-1, gy.shape[-1])
        gb_low = g2 @ lora_b  # [T, r]
        gx = gw = ga = gb = gbias = None
        if ctx.needs_input_grad[0]:
            gx = (g2 @ weight + s * gb_low @ lora_a).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            gw = g2.t() @ x2
        if ctx.needs_input_grad[2]:
            ga = s * gb_low.t() @ x2
        if ctx.needs_input_grad[3]:
            gb = s * g2.t() @ (x2 @ lora_a.t())
        if ctx.has_bias and ctx.needs_input_grad[5]:
            gbias = g2.sum(0)
        return gx, gw, ga, gb, None, gbias


def lora_linear(x, weight, lora_a, lora_b, scaling: float, bias=None, impl: str = "auto"):
    """x [..., in], weight [out, in], lora_a [r, in], lora_b [out, r] -> y [..., out]; differentiable."""
    if (
        weight.shape[1] != x.shape[-1]
        or lora_a.shape != (lora_b.shape[1], x.shape[-1])
        or lora_b.shape[0] != weight.shape[0]
    ):
        raise ValueError(
            f"shapes do not chain: x {tuple(x.shape)}, weight {tuple(weight.shape)}, "
            f"lora_a {tuple(lora_a.shape)}, lora_b {tuple(lora_b.shape)}"
        )
    if not use_triton(impl, x, weight):
        return lora_linear_reference(x, weight, lora_a, lora_b, scaling, bias)
    return _LoRALinear.apply(x, weight, lora_a, lora_b, scaling, bias)
