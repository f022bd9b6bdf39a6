"""Kernel b on the CPU: SALE's selection pass (arXiv 2505.24179) with int8 matrix products.

Same decision as ``block_select_reference`` and the Triton kernel: a middle block is selected iff some causal entry
has ``s_hat - T_i > 0`` with ``s_hat = s_q s_k <Qi, Ki> + c`` and ``T_i = (m_i + ln(tau l_i)) / scale`` over the
reserved blocks. The integer dot products ``<Qi, Ki>`` of the 4-bit codes are exact int32 (``torch._int_mm``, which
oneDNN runs on VNNI/AMX int8 units), then dequantised in fp32 exactly as the Triton kernel does (the reference
instead multiplies the dequantised codes in fp32: the two agree except on blocks whose margin is within fp32
rounding of 0, the "don't care" band of the kernel tests). Work is done per chunk of query blocks (one int8 product
per KV head and chunk, all query heads of the group stacked), the dequantise + block max in one compiled pass
(``torch.compile``, built once per process; a few seconds the first time).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from litlab.kernels.block_select import reserved_blocks

# ``quant_qk_block_select(impl="auto")`` on the CPU takes this path from this many tokens on (the same threshold as
# the flex computation pass); shorter prompts (the quick card's 256 tokens) keep the reference
INT8_MIN_TOKENS = 1024
_COMPILED: dict[bool, object] = {}


def _block_margins(acc, sq, sk, c, thr, rows0, cols0, block_q: int, block_k: int, causal: bool):
    """max over each block_q x block_k tile of s_hat - T (raw-logit units): acc [g,R,C] int32, sq/thr [g,R],
    sk [C], c [g,C] -> [g, R/block_q, C/block_k]; ``causal`` masks entries with column > row (absolute)."""
    diff = acc.float() * sq[..., None] * sk[None, None, :] + c[:, None, :] - thr[..., None]
    if causal:
        row = rows0 + torch.arange(acc.shape[1], device=acc.device)
        col = cols0 + torch.arange(acc.shape[2], device=acc.device)
        diff = diff.masked_fill(col[None, None, :] > row[None, :, None], float("-inf"))
    g, R, C = acc.shape
    return diff.view(g, R // block_q, block_q, C // block_k, block_k).amax(4).amax(2)


def block_margins_fn():
    if True not in _COMPILED:
        _COMPILED[True] = torch.compile(_block_margins, dynamic=True)
    return _COMPILED[True]


def int8_selection_supported(qi: torch.Tensor, block_k: int) -> bool:
    return qi.dtype == torch.int8 and not qi.is_cuda and qi.shape[-1] % 8 == 0 and block_k % 8 == 0


@torch.no_grad()
def block_select_int8(
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
    chunk_blocks=8,
):
    """Block mask uint8 [B,H,nQ,nK] from ``smooth_quantize`` outputs (int8 codes, prefill), like the reference."""
    B, H, N, d = q.shape
    Hk = k_s.shape[1]
    g = H // Hk
    scale = sm_scale or d**-0.5
    n_qb, n_kb = math.ceil(N / block_q), math.ceil(N / block_k)
    tau = torch.as_tensor(tau, dtype=torch.float32).expand(H)
    geo = [reserved_blocks(b, N, block_q, block_k, local_blocks, seg_blocks) for b in range(n_qb)]
    n_max = torch.tensor([x[0] for x in geo])
    n_loc = torch.tensor([x[1] for x in geo])
    mid_stop = torch.tensor([x[2].stop for x in geo])  # middle blocks: 1 .. mid_stop - 1
    kb = torch.arange(n_kb)
    causal_blk = kb[None, :] < n_max[:, None]
    res_blk = (kb[None, :] == 0) | ((kb[None, :] >= (n_max - n_loc)[:, None]) & causal_blk)
    middle_blk = (kb[None, :] >= 1) & (kb[None, :] < mid_stop[:, None])
    dense_head = (tau < 1e-5)[None, :, None, None]
    mask = torch.where(dense_head, causal_blk, res_blk).expand(B, H, n_qb, n_kb).clone()

    # thresholds T_i from the exact logits of the reserved keys (sink block + last n_loc blocks), all query blocks
    # at once: gather each query block's reserved columns (padded, masked) -> [B, H, nQ, block_q, W]
    w_loc = int(n_loc.max()) * block_k
    local_start = (n_max - n_loc) * block_k
    cols = torch.cat(
        [torch.arange(block_k).expand(n_qb, -1), local_start[:, None] + torch.arange(w_loc)[None, :]], 1
    )  # [nQ, W]
    col_ok = torch.cat(
        [
            torch.ones(n_qb, block_k, dtype=torch.bool),
            torch.arange(w_loc)[None, :] < (n_loc * block_k)[:, None],
        ],
        1,
    ) & (cols < N)
    cols = cols.clamp_max(N - 1)
    pad = n_qb * block_q - N
    qf = F.pad(q.float(), (0, 0, 0, pad)).view(B, Hk, g, n_qb, block_q, d).transpose(2, 3)
    kg = k_s.float()[:, :, cols]  # [B, Hk, nQ, W, d]
    # one plain batched product per (b, KV head, query block): the g query heads' rows stacked
    z = qf.reshape(B, Hk, n_qb, g * block_q, d) @ kg.transpose(-1, -2)  # [B, Hk, nQ, g*bq, W]
    z = z.view(B, Hk, n_qb, g, block_q, -1).transpose(2, 3).reshape(B, H, n_qb, block_q, -1) * scale
    rows = torch.arange(n_qb * block_q).view(n_qb, block_q, 1)
    allowed = col_ok[:, None, :] & (cols[:, None, :] <= rows)  # [nQ, bq, W]
    z = z.masked_fill(~allowed, float("-inf"))
    m = z.amax(-1)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    thr = (
        m + torch.log(tau)[None, :, None, None] + torch.log(torch.exp(z - m_safe[..., None]).sum(-1))
    ) / scale
    thr = thr.flatten(2)  # [B, H, nQ*bq]
    thr[:, :, N:] = float("inf")  # padded rows never select
    thr = thr.masked_fill(~torch.isfinite(m.flatten(2)), float("inf"))

    # middle blocks: one int8 product per (batch, KV head, chunk of query blocks)
    qi_p, sq_p = F.pad(qi, (0, 0, 0, pad)), F.pad(sq.float(), (0, pad))
    sk, c = sk.float(), c.float()
    margins = block_margins_fn()
    for c0 in range(0, n_qb, chunk_blocks):
        c1 = min(c0 + chunk_blocks, n_qb)
        stop = int(mid_stop[c0:c1].max())
        if stop <= 1:
            continue
        r0, r1 = c0 * block_q, c1 * block_q
        k0, k1 = block_k, stop * block_k
        # entry-level causal mask only if some middle block of the chunk reaches its query block's first row
        crosses = bool(((mid_stop[c0:c1] * block_k - 1) > torch.arange(c0, c1) * block_q).any())
        for b in range(B):
            for hk in range(Hk):
                hs = slice(hk * g, (hk + 1) * g)
                acc = torch._int_mm(qi_p[b, hs, r0:r1].reshape(-1, d), ki[b, hk, k0:k1].t())
                mg = margins(  # small operands copied: slices' storage offsets would be recompile guards
                    acc.view(g, r1 - r0, k1 - k0),
                    sq_p[b, hs, r0:r1].contiguous(),
                    sk[b, hk, k0:k1].contiguous(),
                    c[b, hs, k0:k1].contiguous(),
                    thr[b, hs, r0:r1].contiguous(),
                    r0,
                    k0,
                    block_q,
                    block_k,
                    crosses,
                )  # [g, c1 - c0, stop - 1]
                mid = middle_blk[c0:c1, 1:stop]
                cur = mask[b, hs, c0:c1, 1:stop]
                mask[b, hs, c0:c1, 1:stop] = torch.where(mid & ~dense_head[0, hs], mg > 0, cur)
    return mask.to(torch.uint8)
