"""Kernel c1: gather + low-rank reconstruct with fused RoPE (xKV Selective Reconstruction) (xKV: Cross-Layer SVD for KV-Cache Compression, arXiv 2503.18893, Selective Reconstruction).

``out[b,h,s,:] = RoPE_t(a[b,t,:] @ bmat[b,h])`` with ``t = idx[b,h,s//chunk]*chunk + s%chunk``. RoPE is the
rotate-half convention of Llama: ``x*cos[t] + rotate_half(x)*sin[t]``, ``rotate_half(x) = [-x2, x1]``. The kernel
gets ``rotate_half(a@B) = a@rotate_half(B)`` by loading B's columns in rotated order with their signs, which
needs no register shuffles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from litlab.kernels.dispatch import alloc, interpreting, lazy_jit, use_triton


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE with cos/sin already gathered at each row's position (broadcastable to x)."""
    return x * cos + rotate_half(x) * sin


def inverse_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Exact inverse: rotation by -theta (same cos, negated sin)."""
    return x * cos - rotate_half(x) * sin


def gather_lowrank_reconstruct_reference(a, bmat, idx, cos=None, sin=None, chunk_size=1):
    t = token_positions(idx, chunk_size)  # [B, H, S]
    rows = torch.gather(
        a.float()[:, None].expand(-1, t.shape[1], -1, -1), 2, t[..., None].expand(-1, -1, -1, a.shape[-1])
    )
    out = torch.einsum("bhsr,bhrd->bhsd", rows, bmat.float())
    if cos is not None:
        out = apply_rope(out, cos.float()[t], sin.float()[t])
    return out.to(a.dtype)


def token_positions(idx: torch.Tensor, chunk_size: int) -> torch.Tensor:
    offs = torch.arange(chunk_size, device=idx.device)
    return (idx.long()[..., None] * chunk_size + offs).flatten(-2)


def _gather_lowrank(
    A,
    Bm,
    IDX,
    COS,
    SIN,
    OUT,
    S,
    R,
    s_ab,
    s_at,
    s_bb,
    s_bh,
    s_br,
    s_ib,
    s_ih,
    s_ob,
    s_oh,
    s_os,
    H,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
    CHUNK: tl.constexpr,
    ROPE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    sb = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    offs_s = sb * BLOCK_S + tl.arange(0, BLOCK_S)
    s_ok = offs_s < S
    chunk = tl.load(IDX + b * s_ib + h * s_ih + offs_s // CHUNK, mask=s_ok, other=0)
    t = chunk.to(tl.int64) * CHUNK + offs_s % CHUNK
    offs_d = tl.arange(0, HEAD_DIM)
    half: tl.constexpr = HEAD_DIM // 2
    rot_cols = tl.where(
        offs_d < half, offs_d + half, offs_d - half
    )  # rotate_half(x)[j] = -x[j+d/2] | x[j-d/2]
    rot_sign = tl.where(offs_d < half, -1.0, 1.0)
    acc = tl.zeros([BLOCK_S, HEAD_DIM], tl.float32)
    acc_rot = tl.zeros([BLOCK_S, HEAD_DIM], tl.float32)
    for r0 in range(0, R, BLOCK_R):
        offs_r = r0 + tl.arange(0, BLOCK_R)
        r_ok = offs_r < R
        a = tl.load(
            A + b * s_ab + t[:, None] * s_at + offs_r[None, :], mask=s_ok[:, None] & r_ok[None, :], other=0.0
        )
        bt = tl.load(
            Bm + b * s_bb + h * s_bh + offs_r[:, None] * s_br + offs_d[None, :], mask=r_ok[:, None], other=0.0
        )
        if UPCAST:
            a = a.to(tl.float32)
            bt = bt.to(tl.float32)
        acc += tl.dot(a, bt)
        if ROPE:
            b_rot = tl.load(
                Bm + b * s_bb + h * s_bh + offs_r[:, None] * s_br + rot_cols[None, :],
                mask=r_ok[:, None],
                other=0.0,
            )
            if UPCAST:
                b_rot = b_rot.to(tl.float32)
            acc_rot += tl.dot(a, b_rot)
    if ROPE:
        cos = tl.load(COS + t[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0).to(
            tl.float32
        )
        sin = tl.load(SIN + t[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0).to(
            tl.float32
        )
        acc = acc * cos + acc_rot * rot_sign[None, :] * sin
    tl.store(
        OUT + b * s_ob + h * s_oh + offs_s[:, None] * s_os + offs_d[None, :],
        acc.to(OUT.dtype.element_ty),
        mask=s_ok[:, None],
    )


@torch.no_grad()
def gather_lowrank_reconstruct(
    a,
    bmat,
    idx,
    cos=None,
    sin=None,
    chunk_size: int = 1,
    impl: str = "auto",
    block_s: int = 64,
    block_r: int = 64,
):
    """a [B,L,r], bmat [B,H_kv,r,d], idx [B,H_kv,S/chunk] -> out [B,H_kv,S,d] (RoPE applied iff cos given)."""
    if a.dim() != 3 or bmat.dim() != 4 or idx.dim() != 3 or a.shape[-1] != bmat.shape[2]:
        raise ValueError(
            f"a [B,L,r], b [B,H_kv,r,d], idx [B,H_kv,S/chunk] expected; got a {tuple(a.shape)}, "
            f"b {tuple(bmat.shape)}, idx {tuple(idx.shape)}"
        )
    if (cos is None) != (sin is None):
        raise ValueError("give both cos and sin (keys) or neither (values)")
    if not use_triton(impl, a, bmat):
        return gather_lowrank_reconstruct_reference(a, bmat, idx, cos, sin, chunk_size)
    B, L, R = a.shape
    H, d = bmat.shape[1], bmat.shape[3]
    S = idx.shape[-1] * chunk_size
    a, bmat, idx = a.contiguous(), bmat.contiguous(), idx.contiguous()
    out = alloc((B, H, S, d), a.dtype, a.device)
    rope = cos is not None
    cos_t = cos.contiguous() if rope else out
    sin_t = sin.contiguous() if rope else out
    block_r = max(16, min(block_r, triton.next_power_of_2(R)))
    kernel = lazy_jit(_gather_lowrank)
    kernel[(triton.cdiv(S, block_s), B, H)](
        a,
        bmat,
        idx,
        cos_t,
        sin_t,
        out,
        S,
        R,
        *a.stride()[:2],
        *bmat.stride()[:3],
        *idx.stride()[:2],
        *out.stride()[:3],
        H,
        HEAD_DIM=d,
        BLOCK_S=block_s,
        BLOCK_R=block_r,
        CHUNK=chunk_size,
        ROPE=rope,
        UPCAST=interpreting() and a.dtype == torch.bfloat16,
    )
    return out
