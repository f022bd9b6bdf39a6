"""Kernel a: block-sparse flash attention with a block mask (SALE's computation pass) (SALE, arXiv 2505.24179; FlashAttention's online softmax, arXiv 2205.14135).

Query row ``i`` (absolute position ``i + N - M``: bottom-right aligned) attends to key ``j`` iff
``block_mask[b, h, i // block_q, j // block_k]`` and (not causal or ``j <= i + N - M``). Softmax over the allowed
keys; a row with no allowed key outputs 0 and lse = -inf. The host turns the mask into a LUT once per call
(count of allowed key blocks per query block, their indices first in ascending order), so each program loops
only over its allowed tiles.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from litlab.kernels.dispatch import alloc, interpreting, lazy_jit, run_compiled_or_fallback, use_triton
from litlab.kernels.flex_block_sparse import block_sparse_attention_flex

LOG2E = 1.4426950408889634
# ``impl="auto"`` on the CPU: the compiled flex_attention path from this many query rows on (it skips the
# unselected blocks; compiling costs ~9-25 s once per process), the fp32 masked reference below (dense, N^2 memory)
FLEX_MIN_TOKENS = 1024


def _block_sparse_attn_fwd(
    Q,
    K,
    V,
    O,
    LSE,
    CNT,
    IDX,
    s_qb,
    s_qh,
    s_qm,
    s_kb,
    s_kh,
    s_kn,
    s_vb,
    s_vh,
    s_vn,
    s_ob,
    s_oh,
    s_om,
    H,
    G,
    M,
    N,
    N_QB,
    N_KB,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CAUSAL: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // G  # GQA: query head h reads KV head h // (H / H_kv)
    offs_m = qb * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(
        Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qm + offs_d[None, :],
        mask=offs_m[:, None] < M,
        other=0.0,
    )
    if (
        UPCAST
    ):  # the interpreter's tl.dot is wrong on bf16 (upcast under TRITON_INTERPRET: see kernels/dispatch.py)
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    acc = tl.zeros([BLOCK_Q, HEAD_DIM], tl.float32)
    lut = bh * N_QB + qb
    cnt = tl.load(CNT + lut)
    for i in range(0, cnt):
        kb = tl.load(IDX + lut * N_KB + i)
        offs_n = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        k = tl.load(
            K + b * s_kb + hk * s_kh + offs_n[:, None] * s_kn + offs_d[None, :],
            mask=offs_n[:, None] < N,
            other=0.0,
        )
        v = tl.load(
            V + b * s_vb + hk * s_vh + offs_n[:, None] * s_vn + offs_d[None, :],
            mask=offs_n[:, None] < N,
            other=0.0,
        )
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2  # log2 units: exp2 below
        allowed = offs_n[None, :] < N
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + (N - M))
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # fully masked rows stay finite
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(
        O + b * s_ob + h * s_oh + offs_m[:, None] * s_om + offs_d[None, :],
        out.to(O.dtype.element_ty),
        mask=offs_m[:, None] < M,
    )
    if RETURN_LSE:
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
        tl.store(LSE + bh * M + offs_m, lse, mask=offs_m < M)


_AUTOTUNE = [triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8) for s in (2, 3, 4)]


def _check(q, k, v, block_mask, block_q, block_k):
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        raise ValueError(
            f"q [B,H,M,d], k/v [B,H_kv,N,d] expected; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    B, H, M, d = q.shape
    if H % k.shape[1] or M > k.shape[2] or d != k.shape[3]:
        raise ValueError(
            f"need H % H_kv == 0, M <= N and equal head dims; got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    want = (B, H, math.ceil(M / block_q), math.ceil(k.shape[2] / block_k))
    if tuple(block_mask.shape) != want:
        raise ValueError(
            f"block_mask shape {tuple(block_mask.shape)} != {want} for blocks {block_q}x{block_k}"
        )


def block_sparse_attention_reference(
    q, k, v, block_mask, block_q=64, block_k=32, causal=True, sm_scale=None, return_lse=False
):
    """Dense fp32 attention with the block mask expanded to elements (the reference the kernel is tested against)."""
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, 1).float()
    v = v.repeat_interleave(g, 1).float()
    M, N = q.shape[2], k.shape[2]
    allow = block_mask.bool().repeat_interleave(block_q, 2).repeat_interleave(block_k, 3)[..., :M, :N]
    if causal:
        allow = allow & (
            torch.arange(N, device=q.device)[None, :] <= torch.arange(M, device=q.device)[:, None] + N - M
        )
    s = (q.float() @ k.transpose(-1, -2)) * (sm_scale or q.shape[-1] ** -0.5)
    s = s.masked_fill(~allow, float("-inf"))
    o = (torch.softmax(s, -1).nan_to_num(0.0) @ v).to(q.dtype)
    return (o, torch.logsumexp(s, -1)) if return_lse else o


@torch.no_grad()
def block_sparse_attention(
    q,
    k,
    v,
    block_mask,
    block_q: int = 64,
    block_k: int = 32,
    causal: bool = True,
    sm_scale: float | None = None,
    return_lse: bool = False,
    impl: str = "auto",
):
    """o [B,H,M,d] (and lse [B,H,M] fp32) of attention restricted to the allowed blocks (see module doc).

    ``impl``: the dispatch rules of ``kernels.dispatch``, plus ``"flex"`` (the compiled ``flex_attention`` path of
    ``kernels.flex_block_sparse``, no lse), which ``"auto"`` takes on CPU tensors from ``FLEX_MIN_TOKENS`` query
    rows on (shorter prompts: the reference)."""
    _check(q, k, v, block_mask, block_q, block_k)
    if impl == "flex" or (
        impl == "auto" and not q.is_cuda and q.shape[2] >= FLEX_MIN_TOKENS and not return_lse
    ):
        if return_lse:
            raise ValueError("impl='flex' returns no lse (compiled CPU flex_attention cannot)")
        return run_compiled_or_fallback(
            "block_sparse_attention flex",
            lambda: block_sparse_attention_flex(q, k, v, block_mask, block_q, block_k, causal, sm_scale),
            lambda: block_sparse_attention_reference(q, k, v, block_mask, block_q, block_k, causal, sm_scale),
            forced=impl == "flex",
        )
    if not use_triton(impl, q, k, v):
        return block_sparse_attention_reference(
            q, k, v, block_mask, block_q, block_k, causal, sm_scale, return_lse
        )
    B, H, M, d = q.shape
    N = k.shape[2]
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    mask = block_mask.bool()
    n_qb, n_kb = mask.shape[2], mask.shape[3]
    cnt = mask.sum(-1, dtype=torch.int32).contiguous()
    idx = torch.argsort((~mask).to(torch.int8), dim=-1, stable=True).to(torch.int32).contiguous()
    o = alloc(q.shape, q.dtype, q.device)
    lse = alloc((B, H, M), torch.float32, q.device) if return_lse else o
    kernel = lazy_jit(_block_sparse_attn_fwd, _AUTOTUNE, key=["HEAD_DIM", "BLOCK_Q", "BLOCK_K"])
    scale = sm_scale or d**-0.5
    kernel[(n_qb, B * H)](
        q,
        k,
        v,
        o,
        lse,
        cnt,
        idx,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *o.stride()[:3],
        H,
        H // k.shape[1],
        M,
        N,
        n_qb,
        n_kb,
        scale * LOG2E,
        HEAD_DIM=d,
        BLOCK_Q=block_q,
        BLOCK_K=block_k,
        CAUSAL=causal,
        RETURN_LSE=return_lse,
        UPCAST=interpreting(),
    )
    return (o, lse) if return_lse else o


def dense_causal_attention(q, k, v, sm_scale=None):
    """Bottom-right causal SDPA for M <= N with GQA (SDPA's own `is_causal` is top-left aligned when M != N)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    M, N = q.shape[2], k.shape[2]
    if M == N:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=sm_scale)
    if M == 1:
        return F.scaled_dot_product_attention(q, k, v, scale=sm_scale)
    allow = torch.arange(N, device=q.device)[None, :] <= torch.arange(M, device=q.device)[:, None] + N - M
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allow, scale=sm_scale)


def block_sparse_attention_gathered(q, k, v, block_mask, block_q=64, block_k=32, sm_scale=None):
    """CPU reference that skips disallowed blocks (cost ~ density): per query block, gather the allowed key blocks
    of every head (padded to the largest count) and attend over them. Causal, M == N. Used for CPU timing."""
    B, H, N, d = q.shape
    g = H // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    n_kb = block_mask.shape[-1]
    pad = n_kb * block_k - N
    kb_ = torch.nn.functional.pad(k, (0, 0, 0, pad)).unflatten(2, (n_kb, block_k))
    vb_ = torch.nn.functional.pad(v, (0, 0, 0, pad)).unflatten(2, (n_kb, block_k))
    scale = sm_scale or d**-0.5
    out = torch.empty_like(q)
    mask = block_mask.bool()
    for qb in range(mask.shape[2]):
        r0, r1 = qb * block_q, min((qb + 1) * block_q, N)
        m = mask[:, :, qb]
        cnt = int(m.sum(-1).max())
        idx = torch.argsort((~m).to(torch.int8), dim=-1, stable=True)[..., :cnt]  # allowed blocks first
        valid = torch.gather(m, -1, idx)
        gi = idx[..., None, None].expand(-1, -1, -1, block_k, d)
        kk = torch.gather(kb_, 2, gi).flatten(2, 3)
        vv = torch.gather(vb_, 2, gi).flatten(2, 3)
        pos = (idx[..., None] * block_k + torch.arange(block_k)).flatten(-2)  # [B, H, cnt*bk]
        allow = valid.repeat_interleave(block_k, -1)[..., None, :] & (
            pos[..., None, :] <= torch.arange(r0, r1)[:, None]
        )
        s = (q[:, :, r0:r1] @ kk.transpose(-1, -2)) * scale
        p = torch.softmax(s.masked_fill(~allow, float("-inf")), -1).nan_to_num(0.0)
        out[:, :, r0:r1] = p @ vv
    return out
