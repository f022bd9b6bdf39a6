"""Kernel b: low-bit Q·Kᵀ block selection, the selection pass of SALE (low-bit estimation for sparse attention in
long-context prefilling, arXiv 2505.24179).

Per query block ``b`` and head ``h``: reserved key blocks (sink block 0 + the last ``n_loc`` causal blocks) get
exact logits ``z = scale·q·k'`` and row statistics ``m_i, l_i``; the threshold is ``T_i = m_i + ln(tau·l_i)``
(raw-logit units ``/scale``). A middle block is selected iff some entry's 4-bit estimate
``s_hat = s_q·s_k·<Qi, Ki> + c`` exceeds ``T_i``, i.e. its Relative Attention Score ``exp(z - m_i)/l_i > tau``.
Reconstructed from the official CUDA kernel (reconstructed: the paper's text could not be read).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from litlab.kernels import block_select_cpu
from litlab.kernels.block_layout import reserved_blocks
from litlab.kernels.dispatch import alloc, interpreting, lazy_jit, run_compiled_or_fallback, use_triton

QUANT_MODES = (2, 3)


def _half_op(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One arithmetic result rounded as a ``dtype`` (fp16/bf16) kernel stores it: computed exactly in float64 and
    rounded once (fp32 inputs stay fp32)."""
    return x.double().to(dtype) if dtype in (torch.float16, torch.bfloat16) else x.float()


def smooth_quantize_perwarp(q, k, bits: int = 4, block_k: int = 32):
    """``quant_mode=3``, the official scripts' per-warp scheme (``int4_quant_sub_k_mean_perwarp_SmoothQ_fullsize``):
    one scale for each pair of query rows (r, r+8) of every 16-row group (the two rows one MMA thread holds), and
    one for the key rows r of each ``block_k`` chunk with the same (r mod 8) // 2 (the columns one thread holds),
    so the selection can dequantise a thread's maximum once. Element-wise steps round to the input's dtype as the
    Triton kernel does (fp16/bf16; fp32 inputs stay fp32); codes round half to even. Same outputs as
    `smooth_quantize`, except c, which is here the kernel's ``qmk`` = q̄·k' / s_k (in units of the key scale,
    rounded to fp16 like its store)."""
    if block_k % 16:
        raise ValueError(f"quant_mode=3 groups rows by 16: block_k={block_k} must be a multiple of 16")
    levels = 2 ** (bits - 1) - 1
    dt = q.dtype
    B, H, N, d = q.shape
    n_pad = math.ceil(N / block_k) * block_k - N  # a partial chunk is padded with the mean: 0 after smoothing
    q_bar, k_bar = q.mean(2, keepdim=True), k.mean(2, keepdim=True)
    q_t = _half_op(torch.cat([q, q_bar.expand(-1, -1, n_pad, -1)], 2).double() - q_bar.double(), dt)
    k_s = _half_op(torch.cat([k, k_bar.expand(-1, -1, n_pad, -1)], 2).double() - k_bar.double(), dt)
    groups_q = q_t.unflatten(2, (-1, 2, 8))  # [B, H, N/16, 2, 8, d]: rows r and r+8 share a scale
    q_max = groups_q.abs().amax((3, 5), keepdim=True)
    groups_k = k_s.unflatten(
        2, (-1, block_k // 8, 4, 2)
    )  # [B, Hk, N/bk, bk/8, 4, 2, d]: rows with one (r%8)//2
    k_max = groups_k.abs().amax((3, 5, 6), keepdim=True)
    q_scale, k_scale = _half_op(levels / q_max.double(), dt), _half_op(levels / k_max.double(), dt)
    qi = torch.round(_half_op(groups_q.double() * q_scale.double(), dt).float()).to(torch.int8).flatten(2, 4)
    ki = torch.round(_half_op(groups_k.double() * k_scale.double(), dt).float()).to(torch.int8).flatten(2, 5)
    sq = _half_op(q_max.double() / levels, dt).expand(*groups_q.shape[:-1], 1).flatten(2, 5)
    sk_scale = k_scale.expand(*groups_k.shape[:-1], 1).flatten(2, 6)
    sk = _half_op(1.0 / sk_scale.double(), dt)
    g = H // k.shape[1]
    products = _half_op(q_bar.unsqueeze(3).double() * k_s.repeat_interleave(g, 1).unsqueeze(2).double(), dt)
    c = (products.float().sum(-1).squeeze(2) * sk_scale.repeat_interleave(g, 1).float()).to(
        torch.float16 if dt == torch.float32 else dt
    )
    return k_s[:, :, :N].to(k.dtype), qi[:, :, :N], ki[:, :, :N], sq[:, :, :N], sk[:, :, :N], c[:, :, :N]


def smooth_quantize(q, k, bits: int = 4, quant_mode: int = 2, block_k: int = 32):
    """Quantisation stage: k' = k - mean_t k; symmetric ``bits``-bit codes of q - mean(q) and k', per token
    (``quant_mode=2``) or per warp (``quant_mode=3``, `smooth_quantize_perwarp`, which needs ``block_k``).

    Returns k_s [B,H_kv,N,d], qi [B,H,M,d] int8, ki [B,H_kv,N,d] int8, sq [B,H,M], sk [B,H_kv,N], c [B,H,N] fp32.
    ``bits=16`` emulates no rounding (qi/ki are then the unrounded float codes, fp32).
    """
    if bits not in (2, 3, 4, 5, 6, 7, 8, 16):
        raise ValueError(f"bits={bits} is not supported (2..8, or 16 = no rounding)")
    if quant_mode not in QUANT_MODES:
        raise ValueError(f"quant_mode={quant_mode} is not one of {QUANT_MODES} (2: per token, 3: per warp)")
    if quant_mode == 3:
        if bits > 8:
            raise ValueError(f"quant_mode=3 rounds to codes: bits={bits} must be <= 8")
        return smooth_quantize_perwarp(q, k, bits, block_k)
    qf, kf = q.float(), k.float()
    k_s = kf - kf.mean(2, keepdim=True)
    q_bar = qf.mean(2, keepdim=True)
    q_t = qf - q_bar
    levels = 2 ** (min(bits, 8) - 1) - 1
    sq = (q_t.abs().amax(-1) / levels).clamp_min(1e-12)
    sk = (k_s.abs().amax(-1) / levels).clamp_min(1e-12)
    qi, ki = q_t / sq[..., None], k_s / sk[..., None]
    if bits <= 8:
        qi, ki = torch.round(qi).to(torch.int8), torch.round(ki).to(torch.int8)  # round half to even
    g = q.shape[1] // k.shape[1]
    c = q_bar @ k_s.repeat_interleave(g, 1).transpose(-1, -2)  # c[h, j] = q_bar[h] · k'[h//g, j]
    return k_s.to(k.dtype), qi, ki, sq, sk, c.squeeze(2)


def block_select_reference(
    q,
    k_s,
    qi,
    ki,
    sq,
    sk,
    c,
    tau,
    block_q=64,
    block_k=32,
    local_blocks=4,
    seg_blocks=4,
    sm_scale=None,
    return_margin=False,
    quant_mode=2,
):
    """PyTorch selection, vectorised over heads and key blocks, one loop step per query block; same inputs as the
    kernel. ``margin[b,h,qb,kb] = max(est - T)`` over the block's causal entries (raw-logit units, NaN where not
    a middle block); a middle block is selected iff ``margin > 0``. Memory O(H * block_q * N) per step.
    ``quant_mode=3`` (codes from `smooth_quantize_perwarp`) estimates as the official kernel's per-warp branch:
    s_q s_k (<Qi, Ki> + round(qmk / s_q)) with the q̄·k' term rounded to the integer grid, dequantised and
    compared with T_i in fp16 (bf16 for bf16 inputs)."""
    B, H, N, d = q.shape
    g = H // k_s.shape[1]
    scale = sm_scale or d**-0.5
    kf = k_s.float().repeat_interleave(g, 1)
    qa = torch.cat(
        [qi.float() * sq[..., None], torch.ones_like(sq)[..., None]], -1
    )  # dequantised codes, augmented
    ka = torch.cat([(ki.float() * sk[..., None]).repeat_interleave(g, 1), c[..., None].float()], -1)
    n_qb, n_kb = math.ceil(N / block_q), math.ceil(N / block_k)
    tau = torch.as_tensor(tau, dtype=torch.float32, device=q.device).expand(H)
    dense_head = (tau < 1e-5)[None, :, None]
    mask = torch.zeros(B, H, n_qb, n_kb, dtype=torch.uint8, device=q.device)
    margin = torch.full((B, H, n_qb, n_kb), float("nan"), device=q.device)
    pos = torch.arange(n_kb * block_k, device=q.device)
    for qb in range(n_qb):
        r0, r1 = qb * block_q, min((qb + 1) * block_q, N)
        n_max, n_loc, middle = reserved_blocks(qb, N, block_q, block_k, local_blocks, seg_blocks)
        rows = torch.arange(r0, r1, device=q.device)[:, None]
        causal = pos[None, :N] <= rows  # [rows, N]
        res_cols = torch.cat(
            [pos[: min(block_k, N)], pos[(n_max - n_loc) * block_k : min(n_max * block_k, N)]]
        )
        z = (
            q[:, :, r0:r1].float() @ kf[:, :, res_cols].transpose(-1, -2)
        ) * scale  # exact logits, reserved only
        z = z.masked_fill(res_cols[None, :] > rows, float("-inf"))
        m = z.amax(-1)
        thr = (m + torch.log(tau)[None, :, None] + torch.log(torch.exp(z - m[..., None]).sum(-1))) / scale
        blk = torch.ones(n_kb, dtype=torch.bool, device=q.device)
        blk[n_max:] = False
        res_blk = torch.zeros_like(blk)
        res_blk[0] = True
        res_blk[n_max - n_loc : n_max] = True
        mask[:, :, qb] = torch.where(dense_head, blk, res_blk).to(torch.uint8)
        if len(middle) == 0:
            continue
        cols = slice(block_k, middle.stop * block_k)  # middle keys: blocks 1 .. n - n_loc
        # est = [s_q Qi, 1] . [s_k Ki, c]: one matmul over augmented dequantised codes (equal to s_q s_k <Qi, Ki> + c
        # up to fp32 rounding, absorbed by the kernel tests' 1e-4 "don't care" margin); T_i is subtracted after
        # the max over each block's keys, so only one pass touches the full [rows, keys] tile
        if quant_mode == 3:
            est, thr_cmp = _perwarp_estimate(qi, ki, sq, sk, c, thr, g, r0, r1, cols, q.dtype)
        else:
            est, thr_cmp = qa[:, :, r0:r1] @ ka[:, :, cols].transpose(-1, -2), thr
        if cols.stop - 1 > r0:  # only configs whose middle region reaches the diagonal need the causal mask
            est = est.masked_fill(~causal[:, cols], float("-inf"))
        row_max = est.unflatten(-1, (len(middle), block_k)).amax(-1)  # [B, H, rows, n_middle]
        mg = (row_max - thr_cmp[..., None]).amax(-2)  # [B, H, n_middle]
        margin[:, :, qb, 1 : middle.stop] = mg
        mask[:, :, qb, 1 : middle.stop] = torch.where(dense_head, True, mg > 0).to(torch.uint8)
    return (mask, margin) if return_margin else mask


def _perwarp_estimate(qi, ki, sq, sk, c, thr, g: int, r0: int, r1: int, cols: slice, dtype: torch.dtype):
    """quant_mode 3 estimates of rows r0:r1 against keys ``cols`` and the thresholds they are compared with, both
    rounded to the kernel's element type (fp16, or bf16 for bf16 inputs) as its per-warp branch does."""
    elem = torch.bfloat16 if dtype == torch.bfloat16 else torch.float16
    sq_rows, sk_cols = sq[:, :, r0:r1].to(elem), sk[:, :, cols].repeat_interleave(g, 1).to(elem)
    dot = qi[:, :, r0:r1].float() @ ki[:, :, cols].repeat_interleave(g, 1).float().transpose(-1, -2)  # exact
    sq_recip = (1.0 / sq_rows.float()).to(elem)
    c_int = torch.round(_half_op(c[:, :, None, cols].double() * sq_recip[..., None].double(), elem).float())
    scale = _half_op(sq_rows[..., None].double() * sk_cols[:, :, None, :].double(), elem)
    est = _half_op((dot + c_int).to(elem).double() * scale.double(), elem).float()
    return est, thr.to(elem).float()


def _quant_block_select(
    Q,
    KS,
    QI,
    KI,
    SQ,
    SK,
    C,
    TAU,
    MASK,
    s_qb,
    s_qh,
    s_qm,
    s_kb,
    s_kh,
    s_kn,
    s_qib,
    s_qih,
    s_qim,
    s_kib,
    s_kih,
    s_kin,
    H,
    G,
    N,
    N_QB,
    N_KB,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LOCAL_BLOCKS: tl.constexpr,
    SEG_BLOCKS: tl.constexpr,
    KB_POW2: tl.constexpr,
    UPCAST: tl.constexpr,
):
    qb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // G
    offs_m = qb * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N
    # (1) reserved region: sink block 0 + last n_loc causal blocks, middle = whole segments
    n_max = (tl.minimum((qb + 1) * BLOCK_Q, N) + BLOCK_K - 1) // BLOCK_K
    n = n_max - 1
    n_loc = n
    if n > LOCAL_BLOCKS:
        n_loc = LOCAL_BLOCKS + (n - LOCAL_BLOCKS) % SEG_BLOCKS
    tau = tl.load(TAU + h)
    n_mid_end = n - n_loc + 1  # middle blocks are 1 .. n - n_loc
    if tau < 1e-5:
        n_mid_end = 1
        n_loc = n
    kbs = tl.arange(0, KB_POW2)
    reserved = ((kbs == 0) | (kbs >= n_max - n_loc)) & (kbs < n_max)
    middle = (kbs >= 1) & (kbs < n_mid_end)
    out = MASK + (bh * N_QB + qb) * N_KB
    # every entry is written exactly once: here all but the middle blocks, below each middle block (no
    # write-after-write between threads of one program, which a GPU does not order without a barrier)
    tl.store(out + kbs, reserved.to(tl.uint8), mask=(kbs < N_KB) & ~middle)
    # (2) exact logits on reserved tiles -> row max m_i and sum l_i (natural units)
    q = tl.load(
        Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0
    )
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q], tl.float32)
    for j in range(0, n_loc + 1):
        kb = tl.where(j == 0, 0, n_max - n_loc + j - 1)
        offs_n = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        k = tl.load(
            KS + b * s_kb + hk * s_kh + offs_n[:, None] * s_kn + offs_d[None, :],
            mask=offs_n[:, None] < N,
            other=0.0,
        )
        if UPCAST:
            k = k.to(tl.float32)
        z = tl.dot(q, tl.trans(k)) * sm_scale
        z = tl.where((offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < N), z, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l_i = l_i * tl.exp(m_i - m_safe) + tl.sum(tl.exp(z - m_safe[:, None]), 1)
        m_i = m_new
    # (3) threshold in raw-logit units; padded rows never select
    thr = (m_i + tl.log(tau * l_i)) / sm_scale
    thr = tl.where(row_ok, thr, float("inf"))
    # (4) middle blocks: integer dot product, dequantise, compare the block's best entry with T_i
    qi = tl.load(
        QI + b * s_qib + h * s_qih + offs_m[:, None] * s_qim + offs_d[None, :], mask=row_ok[:, None], other=0
    )
    sq = tl.load(SQ + bh * N + offs_m, mask=row_ok, other=0.0)
    for kb in range(1, n_mid_end):
        offs_n = kb * BLOCK_K + tl.arange(0, BLOCK_K)
        ki = tl.load(
            KI + b * s_kib + hk * s_kih + offs_n[:, None] * s_kin + offs_d[None, :],
            mask=offs_n[:, None] < N,
            other=0,
        )
        acc = tl.dot(qi, tl.trans(ki), out_dtype=tl.int32)
        sk = tl.load(SK + (b * (H // G) + hk) * N + offs_n, mask=offs_n < N, other=0.0)
        cc = tl.load(C + bh * N + offs_n, mask=offs_n < N, other=0.0)
        est = acc.to(tl.float32) * sq[:, None] * sk[None, :] + cc[None, :]
        diff = tl.where(
            (offs_n[None, :] <= offs_m[:, None]) & (offs_n[None, :] < N), est - thr[:, None], float("-inf")
        )
        hit = tl.max(tl.max(diff, 1), 0) > 0
        tl.store(out + kb, hit.to(tl.uint8))


@torch.no_grad()
def quant_qk_block_select(
    q,
    k_s,
    qi,
    ki,
    sq,
    sk,
    c,
    tau,
    block_q=64,
    block_k=32,
    local_blocks=4,
    seg_blocks=4,
    sm_scale=None,
    impl: str = "auto",
    quant_mode: int = 2,
):
    """Block mask uint8 [B,H,ceil(N/block_q),ceil(N/block_k)] from `smooth_quantize` outputs (prefill: M = N).

    ``impl``: the rules of ``kernels.dispatch``, plus ``"int8"`` (``kernels.block_select_cpu``: exact int8 products
    of the codes, CPU), which ``"auto"`` takes on CPU tensors from ``INT8_MIN_TOKENS`` tokens on. ``quant_mode=3``
    (the official per-warp estimate) runs in the PyTorch reference whatever ``impl`` says: the Triton and int8
    kernels implement the per-token ``quant_mode=2``."""
    B, H, N, d = q.shape
    if k_s.shape[2] != N:
        raise ValueError(f"selection is for prefill (M == N); got q {tuple(q.shape)}, k {tuple(k_s.shape)}")
    tau = torch.as_tensor(tau, dtype=torch.float32, device=q.device).expand(H).contiguous()
    if quant_mode == 3:
        return block_select_reference(
            q, k_s, qi, ki, sq, sk, c, tau, block_q, block_k, local_blocks, seg_blocks, sm_scale, quant_mode=3
        )
    if impl == "int8" or (
        impl == "auto"
        and not q.is_cuda
        and N >= block_select_cpu.INT8_MIN_TOKENS
        and block_select_cpu.int8_selection_supported(qi, block_k)
    ):
        args = (q, k_s, qi, ki, sq, sk, c, tau, block_q, block_k, local_blocks, seg_blocks, sm_scale)
        return run_compiled_or_fallback(
            "block_select int8",
            lambda: block_select_cpu.block_select_int8(*args),
            lambda: block_select_reference(*args),
            forced=impl == "int8",
        )
    if not use_triton(impl, q, k_s):
        return block_select_reference(
            q, k_s, qi, ki, sq, sk, c, tau, block_q, block_k, local_blocks, seg_blocks, sm_scale
        )
    if qi.dtype != torch.int8:
        raise ValueError(f"the kernel takes int8 codes (bits <= 8), got {qi.dtype}")
    q, k_s, qi, ki = (t.contiguous() for t in (q, k_s, qi, ki))
    sq, sk, c = (t.float().contiguous() for t in (sq, sk, c))
    n_qb, n_kb = math.ceil(N / block_q), math.ceil(N / block_k)
    mask = alloc((B, H, n_qb, n_kb), torch.uint8, q.device)
    kernel = lazy_jit(_quant_block_select)
    kernel[(n_qb, B * H)](
        q,
        k_s,
        qi,
        ki,
        sq,
        sk,
        c,
        tau,
        mask,
        *q.stride()[:3],
        *k_s.stride()[:3],
        *qi.stride()[:3],
        *ki.stride()[:3],
        H,
        H // k_s.shape[1],
        N,
        n_qb,
        n_kb,
        sm_scale or d**-0.5,
        HEAD_DIM=d,
        BLOCK_Q=block_q,
        BLOCK_K=block_k,
        LOCAL_BLOCKS=local_blocks,
        SEG_BLOCKS=seg_blocks,
        KB_POW2=triton.next_power_of_2(n_kb),
        UPCAST=interpreting() and q.dtype == torch.bfloat16,
    )
    return mask
