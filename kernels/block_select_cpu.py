"""Kernel b on the CPU: SALE's selection pass (arXiv 2505.24179) with int8 matrix products, cache-blocked.

Same decision as ``block_select_reference`` and the Triton kernel: a middle block is selected iff some causal entry
has ``s_hat - T_i > 0`` with ``s_hat = s_q s_k <Qi, Ki> + c`` and ``T_i = (m_i + ln(tau l_i)) / scale`` over the
reserved blocks. The integer dot products ``<Qi, Ki>`` of the 4-bit codes are exact int32 (``torch._int_mm``, which
oneDNN runs on VNNI int8 units), then dequantised in fp32 as the Triton kernel does (the reference instead
multiplies the dequantised codes in fp32: the two agree except on blocks whose margin is within fp32 rounding of 0,
the "don't care" band of the kernel tests).

Work is cut in tiles of ~512 query rows (all query heads of a KV group stacked) x ``tile_cols`` middle keys, so the
int32 product of a tile stays in the core's cache while one compiled pass (``torch.compile``, built once per
process) dequantises it and reduces it to block maxima: first over each block's rows (contiguous, vectorised
along the keys), then over each block's keys. Dense heads (``tau < 1e-5``) skip the estimate. The thresholds
``T_i`` come from one batched product per KV head against a strided window of the keys that covers every query
block's reserved local blocks (no gather) plus the sink block, and one compiled masked log-sum-exp.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from litlab.kernels.block_layout import reserved_blocks

# ``quant_qk_block_select(impl="auto")`` on the CPU takes this path from this many tokens on (the same threshold as
# the flex computation pass); shorter prompts (the quick card's 256 tokens) keep the reference
INT8_MIN_TOKENS = 1024
TILE_ROWS = 512  # query rows (heads x rows) per int8 product
TILE_COLS = 1024  # middle keys per int8 product: a 512 x 1024 int32 tile is 2 MiB
_COMPILED: dict[str, object] = {}


def _block_margins(acc, sq, sk, c, thr, rows0, cols0, block_q: int, block_k: int, causal: bool):
    """max over each block_q x block_k tile of s_hat - T (raw-logit units): acc [g,R,C] int32, sq/thr [g,R],
    sk [C], c [g,C] -> [g, R/block_q, C/block_k]; ``causal`` masks entries with column > row (absolute)."""
    g, R, C = acc.shape
    diff = acc.float() * sq[..., None] * sk[None, None, :] + c[:, None, :] - thr[..., None]
    if causal:
        row = rows0 + torch.arange(R, device=acc.device)
        col = cols0 + torch.arange(C, device=acc.device)
        diff = diff.masked_fill(col[None, None, :] > row[None, :, None], float("-inf"))
    # rows first: an elementwise max of block_q rows, contiguous along the keys; then each block's block_k keys
    rmax = diff.view(g, R // block_q, block_q, C).amax(2)
    return rmax.view(g, R // block_q, C // block_k, block_k).amax(3)


def _row_thresholds(z_sink, z_loc, loc_start, n_tokens, log_tau, scale, block_q: int, win: int):
    """T_i (raw-logit units) from the exact logits of the reserved keys: z_sink [B,Hk,nQ,g,bq,bk] (key block 0),
    z_loc [B,Hk,nQ,g,bq,win] (keys ``(b+1)*bq - win ..`` of query block b, of which those from ``loc_start[b]``
    on are reserved), log_tau [Hk,g] -> [B,Hk,nQ,g,bq]; inf where a row has no reserved key (padded rows)."""
    n_qb, bk = z_sink.shape[2], z_sink.shape[-1]
    qb = torch.arange(n_qb, device=z_sink.device)
    row = qb[:, None] * block_q + torch.arange(block_q, device=z_sink.device)[None, :]  # [nQ, bq]
    col_s = torch.arange(bk, device=z_sink.device)
    col_l = ((qb + 1) * block_q - win)[:, None] + torch.arange(win, device=z_sink.device)[
        None, :
    ]  # [nQ, win]
    ok_s = (col_s[None, None, :] <= row[..., None]) & (col_s < n_tokens)[None, None, :]  # [nQ, bq, bk]
    ok_l = (col_l[:, None, :] <= row[..., None]) & (col_l >= loc_start[:, None])[:, None, :]
    ok_l = ok_l & (col_l < n_tokens)[:, None, :]  # [nQ, bq, win]
    zs = (z_sink * scale).masked_fill(~ok_s[:, None], float("-inf"))
    zl = (z_loc * scale).masked_fill(~ok_l[:, None], float("-inf"))
    m = torch.maximum(zs.amax(-1), zl.amax(-1))  # [B,Hk,nQ,g,bq]
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    l = torch.exp(zs - m_safe[..., None]).sum(-1) + torch.exp(zl - m_safe[..., None]).sum(-1)
    thr = (m + log_tau[None, :, None, :, None] + torch.log(l)) / scale
    return torch.where(torch.isfinite(m), thr, torch.full_like(thr, float("inf")))


def _compiled(name: str, fn):
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=True)
    return _COMPILED[name]


def block_margins_fn():
    return _compiled("margins", _block_margins)


def int8_selection_supported(qi: torch.Tensor, block_k: int) -> bool:
    return qi.dtype == torch.int8 and not qi.is_cuda and qi.shape[-1] % 8 == 0 and block_k % 8 == 0


def row_thresholds(q, k_s, tau, n_max, n_loc, block_q, block_k, scale):
    """T_i [B, H, nQ*block_q] (raw-logit units; inf on padded rows) for every query row."""
    B, H, N, d = q.shape
    Hk = k_s.shape[1]
    g = H // Hk
    n_qb = math.ceil(N / block_q)
    pad = n_qb * block_q - N
    # query block b's reserved local keys that its rows can see are (n_max - n_loc) * block_k .. (b+1)*bq - 1: a
    # window of the ``win`` keys before (b+1)*bq, stepped by bq, holds every block's (a strided view, no gather;
    # a negative front pad crops)
    loc_start = (n_max - n_loc) * block_k
    win = int(((torch.arange(n_qb) + 1) * block_q - loc_start).max())
    q6 = F.pad(q.float(), (0, 0, 0, pad)).view(B, Hk, g, n_qb, block_q, d).transpose(2, 3)  # [B,Hk,nQ,g,bq,d]
    q6 = q6.contiguous()
    kf = k_s.float()
    windows = F.pad(kf, (0, 0, win - block_q, pad)).unfold(2, win, block_q)  # [B,Hk,nQ,d,win] (a view)
    # copied key-major (a few MiB): the batched product runs ~20 % faster on it than on the strided view
    windows = windows.transpose(-1, -2).contiguous().transpose(-1, -2)
    z_loc = q6.view(B, Hk, n_qb, g * block_q, d) @ windows  # [B,Hk,nQ,g*bq,win]
    z_sink = q6.view(B, Hk, n_qb * g * block_q, d) @ kf[:, :, :block_k].transpose(-1, -2)
    log_tau = torch.log(tau.float()).view(Hk, g)
    thr = _compiled("thresholds", _row_thresholds)(
        z_sink.view(B, Hk, n_qb, g, block_q, -1),
        z_loc.view(B, Hk, n_qb, g, block_q, win),
        loc_start.to(q.device),
        N,
        log_tau,
        scale,
        block_q,
        win,
    )  # [B,Hk,nQ,g,bq]
    return thr.transpose(2, 3).reshape(B, H, n_qb * block_q)


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
    tile_rows=TILE_ROWS,
    tile_cols=TILE_COLS,
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
    dense = tau < 1e-5
    mask = torch.where(dense[None, :, None, None], causal_blk, res_blk).expand(B, H, n_qb, n_kb).clone()
    if bool(dense.all()) or int(mid_stop.max()) <= 1:
        return mask.to(torch.uint8)

    thr = row_thresholds(q, k_s, tau, n_max, n_loc, block_q, block_k, scale)
    pad = n_qb * block_q - N
    qi_p, sq_p = F.pad(qi, (0, 0, 0, pad)), F.pad(sq.float(), (0, pad))
    sk, c = sk.float(), c.float()
    margins = block_margins_fn()
    # the estimated (non-dense) heads of each KV group
    groups = [[h for h in range(hk * g, (hk + 1) * g) if not dense[h]] for hk in range(Hk)]
    tile_cols = max(block_k, tile_cols // block_k * block_k)
    for hk, heads in enumerate(groups):
        if not heads:
            continue
        hs = slice(heads[0], heads[-1] + 1) if heads == list(range(heads[0], heads[-1] + 1)) else heads
        ga = len(heads)
        chunk = max(1, round(tile_rows / (ga * block_q)))  # query blocks per tile
        for c0 in range(0, n_qb, chunk):
            c1 = min(c0 + chunk, n_qb)
            stop = int(mid_stop[c0:c1].max())
            if stop <= 1:
                continue
            r0, r1 = c0 * block_q, c1 * block_q
            # entry-level causal mask only if some middle block of the chunk reaches its query block's first row
            crosses = bool(((mid_stop[c0:c1] * block_k - 1) > torch.arange(c0, c1) * block_q).any())
            mid = middle_blk[c0:c1, 1:stop]
            for b in range(B):
                rows = qi_p[b, hs, r0:r1].reshape(-1, d)
                sq_t, thr_t = sq_p[b, hs, r0:r1].contiguous(), thr[b, hs, r0:r1].contiguous()
                out = torch.empty(ga, c1 - c0, stop - 1)
                for k0 in range(block_k, stop * block_k, tile_cols):
                    k1 = min(k0 + tile_cols, stop * block_k)
                    acc = torch._int_mm(rows, ki[b, hk, k0:k1].t())
                    out[..., (k0 - block_k) // block_k : (k1 - block_k) // block_k] = margins(
                        acc.view(ga, r1 - r0, k1 - k0),
                        sq_t,
                        sk[
                            b, hk, k0:k1
                        ].contiguous(),  # copied: slices' storage offsets would be recompile guards
                        c[b, hs, k0:k1].contiguous(),
                        thr_t,
                        r0,
                        k0,
                        block_q,
                        block_k,
                        crosses and k1 - 1 > r0,
                    )
                cur = mask[b, hs, c0:c1, 1:stop]
                mask[b, hs, c0:c1, 1:stop] = torch.where(mid, out > 0, cur)
    return mask.to(torch.uint8)
