"""xKV: cross-layer SVD of the KV-cache with Selective Reconstruction.

Paper: "xKV: Cross-Layer SVD for KV-Cache Compression" (v2: "xKV: Cross-Layer KV-Cache Compression via Aligned
Singular Vector Extraction"), arXiv 2503.18893, ICML 2026; official code github.com/abdelfattah-lab/xKV. Only the
paper's abstract could be read: the algorithm below follows the official code.

Algorithm (per request, nothing trained):
    prefill with exact K/V                                     # compression never touches prefill attention
    for each group g of G consecutive layers:
        X_K = [K_l1 | ... | K_lG]   (pre-RoPE, L x G*H_kv*d)   # inverse RoPE recovers the pre-RoPE keys
        X_K ≈ U_r S_r W_r^T;  A_K = U_r,  B_K = S_r W_r^T      # truncated SVD (Eckart-Young optimal rank r)
        B_K -> per-layer, per-head blocks B_K[l, h] (r x d)     # values the same with rank r_v
    decode, method "xkv":     attend over [RoPE(A_K B_K[l]) ; exact new tokens]
    decode, method "xkv_sr":  score chunk landmarks with q, reconstruct only the top S/c chunks (Selective
                              Reconstruction, built on ShadowKV, arXiv 2410.21465)
Baselines: G=1 = single-layer SVD; "xk_sr"/"shadowkv" keep V exact (ShadowKV: G=1); MiniCache ("MiniCache: KV
Cache Compression in Depth Dimension for Large Language Models") = SLERP merge of layer pairs. The official code
buffers a group until its last layer prefilled; here compression runs after the whole prefill forward, which
gives identical numbers (prefill attention is exact either way).
Reconstructed: the paper's exact rules could not be read; chosen: the SR details are ShadowKV's (as the official
README says xKV-SR is built on it), GQA aggregation is the max over a KV head's query heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from litlab.kernels.block_sparse_attention import dense_causal_attention
from litlab.kernels.lowrank import apply_rope, gather_lowrank_reconstruct, inverse_rope
from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.results import CardResult, ReportExtras
from litlab.lit_modules.longctx.harness import EVAL, TINY_LM, EvalSettings, FrozenLM, LongContextEval
from litlab.lit_modules.longctx.kv_cache import (
    ExactLayer,
    KVMethod,
    MethodCache,
    dense_attention,
    head_dim,
    method_cache,
)
from litlab.lit_modules.longctx.report import acc_vs_cr_report

Method = Literal["dense", "xkv", "xkv_sr", "xk_sr", "shadowkv", "minicache"]


# ---- typed argument groups ----------------------------------------------------------------------------------
@config_part
class CompressionPlan:
    """Which layers are compressed and at what rank. Ranks are PER GROUP of ``group_size`` consecutive layers;
    ``rank_per_layer`` (if set) gives ``rank_k = group_size * rank_per_layer`` and ``rank_v = round(v_to_k *
    rank_k)`` (equal average rank per layer across G, the paper's "equal compression"); ``v_to_k`` defaults to
    the official protocol's K:V rank ratio 1:1.5 (rank_k 512 / rank_v 768 for xKV-4, 128 / 192 for G=1). ``merge_k`` / ``merge_v``: compress keys / values (the other stays
    exact). Layers outside [start_layer, end_layer] (end -1: the last) stay exact. ``svd_impl``: ``exact``
    (``torch.linalg.svd``) or ``lowrank`` (``torch.svd_lowrank``, randomised, the official efficiency path)."""

    group_size: int = 4
    rank_k: int = 384
    rank_v: int = 576
    rank_per_layer: int | None = None
    v_to_k: float = 1.5
    merge_k: bool = True
    merge_v: bool = True
    start_layer: int = 0
    end_layer: int = -1
    svd_impl: Literal["exact", "lowrank"] = "exact"

    @property
    def key_rank(self) -> int:
        return self.rank_k if self.rank_per_layer is None else self.group_size * self.rank_per_layer

    @property
    def value_rank(self) -> int:
        if self.rank_per_layer is None:
            return self.rank_v
        return max(1, round(self.v_to_k * self.group_size * self.rank_per_layer))


@config_part
class SelectiveReconstruction:
    """xKV-SR / ShadowKV decode: ``sparse_budget`` tokens reconstructed per step, in chunks of ``chunk_size``; the
    last ``local_chunks`` chunks and ``outlier_chunks`` outlier chunks (None: ShadowKV's 24 * (budget // 1024))
    stay exact. Defaults are the official code's."""

    sparse_budget: int = 2048
    chunk_size: int = 8
    local_chunks: int = 4
    outlier_chunks: int | None = None

    @property
    def n_outliers(self) -> int:
        return 24 * (self.sparse_budget // 1024) if self.outlier_chunks is None else self.outlier_chunks


@config_part
class MiniCacheMerge:
    """MiniCache's SLERP merge: interpolation ``slerp_t``, threshold ``slerp_gamma``: rows whose angle exceeds
    min + gamma * (max - min) are merged, the others keep their own vectors (the official xKV code's
    ``fake_minicache_merge``; larger gamma merges fewer rows). Defaults are the official xKV evaluation's."""

    slerp_t: float = 0.5
    slerp_gamma: float = 0.05


PLAN, SR, MERGE = CompressionPlan(), SelectiveReconstruction(), MiniCacheMerge()  # defaults


# ---- cross-layer SVD and the compression ratio --------------------------------------------------------------
def layer_groups(n_layers: int, group_size: int, start: int = 0, end: int = -1) -> list[list[int]]:
    """Consecutive groups over [start, end] (end=-1: last layer); a trailing partial group is allowed."""
    end = n_layers - 1 if end < 0 else end
    if group_size < 1 or not 0 <= start <= end < n_layers:
        raise ValueError(
            f"bad grouping: group_size={group_size}, start_layer={start}, end_layer={end}, "
            f"n_layers={n_layers}"
        )
    return [list(range(s, min(s + group_size, end + 1))) for s in range(start, end + 1, group_size)]


def truncated_svd(x: torch.Tensor, rank: int, impl: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, L, F] -> A = U_r [B, L, r], B = S_r W_r^T [B, r, F], in fp32 (the official SR engine's split of S)."""
    xf = x.float()
    rank = min(rank, *xf.shape[-2:])
    if impl == "exact":
        u, s, vh = torch.linalg.svd(xf, full_matrices=False)
        u, s, vh = u[..., :rank], s[..., :rank], vh[..., :rank, :]
    elif impl == "lowrank":
        u, s, v = torch.svd_lowrank(xf, q=rank)
        vh = v.transpose(-1, -2)
    else:
        raise ValueError(f"svd_impl={impl!r}; use 'exact' or 'lowrank'")
    return u, s[..., None] * vh


def compression_ratio(
    n_layers: int, L: int, h_kv: int, d: int, group_size: int, rank_k: int, rank_v: int
) -> float:
    """Whole-model CR with every layer compressed: dense K+V over the groups' token factors A plus the per-layer
    B blocks, 2 N_L L H_kv d / (ceil(N_L / G) L (r_k + r_v) + N_L H_kv d (r_k + r_v)) (the official
    ``scripts/calc_kv_comp_rate.py``)."""
    stored = math.ceil(n_layers / group_size) * L * (rank_k + rank_v) + n_layers * h_kv * d * (
        rank_k + rank_v
    )
    return 2 * n_layers * L * h_kv * d / stored


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of two [L, F] matrices (columns centred), the paper's alignment diagnostic."""
    x, y = x - x.mean(0), y - y.mean(0)
    return float((x.T @ y).norm() ** 2 / ((x.T @ x).norm() * (y.T @ y).norm()))


def _flat(x: torch.Tensor) -> torch.Tensor:  # [B, H, L, d] -> [B, L, H*d]
    return x.transpose(1, 2).flatten(2)


def _heads(b: torch.Tensor, h_kv: int) -> torch.Tensor:  # [B, r, H*d] -> [B, H, r, d]
    return b.unflatten(-1, (h_kv, -1)).permute(0, 2, 1, 3).contiguous()


@dataclass
class SRState:
    """What Selective Reconstruction keeps of one layer's prompt after compression."""

    landmarks: torch.Tensor  # [B, H_kv, n_chunks, d]: mean post-RoPE key of each non-outlier context chunk
    chunk_ids: torch.Tensor  # [B, H_kv, n_chunks]: which chunk each landmark stands for
    budget_chunks: int  # chunks reconstructed per decode step (sparse_budget // chunk_size)
    chunk: int
    prompt_len: int
    a_k: (
        torch.Tensor
    )  # the group's token factor A_K [B, L, r_k] and this layer's blocks B_K [B, H_kv, r_k, d]
    b_k: torch.Tensor
    a_v: torch.Tensor | None  # None: values kept exact (xk_sr, shadowkv) in v_exact
    b_v: torch.Tensor | None
    v_exact: torch.Tensor | None
    last_frac: float | None = None  # fraction of the prompt reconstructed at the last decode step


class XKVLayer(ExactLayer):
    """Exact layer + the compressed prompt: either materialised reconstructions (``n_recon`` leading rows, not
    counted as stored) or, for SR, the factors and landmarks that ``select`` reconstructs from."""

    def __init__(self, layer_idx: int):
        super().__init__(layer_idx)
        self.n_recon = 0
        self.compressed_elements = 0
        self.sr: SRState | None = None  # SR state after compression

    def stored_elements(self) -> int:
        if not self.is_initialized:
            return 0
        exact_rows = self.keys.shape[-2] - self.n_recon
        per_row = self.keys.shape[0] * self.keys.shape[1] * self.keys.shape[-1]
        return self.compressed_elements + 2 * exact_rows * per_row

    def select(self, q: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """SR at one decode step: landmark scores (softmax over chunks, summed over query tokens, max over the GQA
        group), top-(S/c) chunks per KV head, reconstruct those rows (kernel ``gather_lowrank_reconstruct``)."""
        st = self.sr
        h_kv, g = st.landmarks.shape[1], q.shape[1] // st.landmarks.shape[1]
        logits = q.float() @ st.landmarks.repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
        score = torch.softmax(logits, -1).sum(2).unflatten(1, (h_kv, g)).amax(2)  # [B, H_kv, n_chunks]
        top = score.topk(min(st.budget_chunks, score.shape[-1]), -1).indices
        chunks = torch.gather(st.chunk_ids, -1, top).sort(-1).values
        c = st.chunk
        k_sel = gather_lowrank_reconstruct(st.a_k, st.b_k, chunks, cos, sin, chunk_size=c)
        if st.a_v is not None:
            v_sel = gather_lowrank_reconstruct(st.a_v, st.b_v, chunks, chunk_size=c)
        else:  # xk_sr / shadowkv: exact values of the selected tokens
            t = (chunks[..., None] * c + torch.arange(c, device=chunks.device)).flatten(-2)
            v_sel = torch.gather(st.v_exact, 2, t[..., None].expand(-1, -1, -1, st.v_exact.shape[-1]))
        st.last_frac = chunks.shape[-1] * c / st.prompt_len
        return k_sel.to(q.dtype), v_sel.to(q.dtype)


def xkv_sr_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """Exact prefill; at decode, attend over [reconstructed selected ; exact tail, outliers, new tokens]."""
    cache = method_cache(kwargs)
    layer = cache.layers[module.layer_idx]
    if layer.sr is None:
        return dense_attention(module, query, key, value, scaling=scaling)
    k_sel, v_sel = layer.select(query, cache.cos, cache.sin)
    out = dense_causal_attention(query, torch.cat([k_sel, key], 2), torch.cat([v_sel, value], 2), scaling)
    return out.transpose(1, 2).contiguous(), None


class XKV(KVMethod):
    """Dense-reconstruction xKV; ``plan.group_size=1`` is the single-layer SVD baseline. ``exact_tail``: the
    last prompt tokens kept exact (0 here; the tests use it to compare with SR's exact tail). ``shared_svd``: one
    prompt's store of each group's factors at the largest rank asked so far, which methods of several ranks on the
    same prefilled cache share (a rank-r truncated SVD is the first r components of any larger one)."""

    name = "xkv"

    def __init__(self, plan: CompressionPlan = PLAN, exact_tail: int = 0, shared_svd: dict | None = None):
        self.plan, self.exact_tail, self.shared_svd = plan, exact_tail, shared_svd

    def _svd(self, x: torch.Tensor, rank: int, key: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        store = self.shared_svd
        if store is None or self.plan.svd_impl != "exact":
            return truncated_svd(x, rank, self.plan.svd_impl)
        if key not in store or store[key][0].shape[-1] < min(rank, *x.shape[-2:]):
            store[key] = truncated_svd(x, rank)
        a, b = store[key]
        return a[..., :rank], b[..., :rank, :]

    def make_layer(self, layer_idx, n_layers):
        return XKVLayer(layer_idx)

    def _factorise(self, cache: MethodCache, group: list[int], values: bool):
        layers = [cache.layers[i] for i in group]
        L = cache.prompt_len
        cos, sin = cache.cos[:L], cache.sin[:L]
        mats = [layer.values if values else inverse_rope(layer.keys.float(), cos, sin) for layer in layers]
        h_kv = mats[0].shape[1]
        x = torch.cat([_flat(m.float()) for m in mats], -1)  # [B, L, G*H_kv*d], layer-major then head-major
        rank = self.plan.value_rank if values else self.plan.key_rank
        a, b = self._svd(x, rank, (tuple(group), values))
        width = x.shape[-1] // len(group)
        blocks = [_heads(b[..., i * width : (i + 1) * width], h_kv) for i in range(len(group))]
        errs = [
            float(
                (_flat(m.float()) - a @ b[..., i * width : (i + 1) * width]).norm() / _flat(m.float()).norm()
            )
            for i, m in enumerate(mats)
        ]
        layers[0].compressed_elements += a.numel() + b.numel()  # A shared by the group; B is per layer
        return a, blocks, errs

    def after_prefill(self, cache: MethodCache) -> None:
        L = cache.prompt_len
        errs = {"k": [], "v": []}
        plan = self.plan
        for group in layer_groups(len(cache.layers), plan.group_size, plan.start_layer, plan.end_layer):
            fk = self._factorise(cache, group, values=False) if plan.merge_k else None
            fv = self._factorise(cache, group, values=True) if plan.merge_v else None
            for i, idx in enumerate(group):
                layer = cache.layers[idx]
                errs["k"] += fk[2][i : i + 1] if fk else []
                errs["v"] += fv[2][i : i + 1] if fv else []
                self.install(cache, layer, fk and (fk[0], fk[1][i]), fv and (fv[0], fv[1][i]), L)
        for kind in ("k", "v"):
            if errs[kind]:
                cache.metrics[f"recon_rel_err_{kind}"] = sum(errs[kind]) / len(errs[kind])

    def install(self, cache, layer: XKVLayer, fk, fv, L: int) -> None:
        """Dense mode: materialise RoPE(A_K B_K[l]) and A_V B_V[l] once (the same numbers as reconstructing them at
        every decode step)."""
        B, h_kv = layer.keys.shape[:2]
        keep = L - min(self.exact_tail, L)
        idx = torch.arange(keep, device=layer.keys.device).expand(B, h_kv, keep)
        if fk:
            k_hat = gather_lowrank_reconstruct(fk[0], fk[1], idx, cache.cos, cache.sin).to(layer.dtype)
            layer.keys = torch.cat([k_hat, layer.keys[:, :, keep:]], 2)
        if fv:
            v_hat = gather_lowrank_reconstruct(fv[0], fv[1], idx).to(layer.dtype)
            layer.values = torch.cat([v_hat, layer.values[:, :, keep:]], 2)
        if fk and fv:
            layer.n_recon = keep
        elif fk or fv:  # one of K/V is still exact: count the exact half as stored
            layer.compressed_elements += keep * B * h_kv * layer.keys.shape[-1]
            layer.n_recon = keep


class XKVSelective(XKV):
    """xKV-SR (values low-rank too), xK-SR (``values_lowrank=False``), ShadowKV = xK-SR with G=1.

    At prefill, per layer (ShadowKV's recipe): the prompt's first ``n_ch = L // c - local_chunks`` chunks are the
    context, the rest stays exact; each chunk's landmark is its mean post-RoPE key; the ``outlier_chunks`` chunks
    whose keys are least similar to their landmark (lowest min-cosine) stay exact too."""

    name = "xkv_sr"
    attn_implementation = "xkv_sr"
    attention_fn = staticmethod(xkv_sr_attention)

    def __init__(
        self,
        plan: CompressionPlan = PLAN,
        sr: SelectiveReconstruction = SR,
        values_lowrank: bool = True,
    ):
        super().__init__(replace(plan, merge_v=values_lowrank))
        self.budget, self.chunk, self.local_chunks = sr.sparse_budget, sr.chunk_size, sr.local_chunks
        self.outliers = sr.n_outliers
        self.values_lowrank = values_lowrank

    def install(self, cache, layer: XKVLayer, fk, fv, L: int) -> None:
        c = self.chunk
        n_ch = L // c - self.local_chunks  # context chunks; the rest (tail) stays exact
        if n_ch <= self.outliers or fk is None:
            raise ValueError(
                f"prompt of {L} tokens leaves {n_ch} chunks of {c}: too few for local_chunks="
                f"{self.local_chunks}, outlier_chunks={self.outliers}"
            )
        keys, values = layer.keys, layer.values
        B, h_kv, _, d = keys.shape
        ctx = keys[:, :, : n_ch * c].float().unflatten(2, (n_ch, c))  # [B, H, n_ch, c, d] post-RoPE
        landmarks = ctx.mean(3)
        cos_sim = torch.nn.functional.cosine_similarity(landmarks[:, :, :, None], ctx, dim=-1).amin(-1)
        order = cos_sim.argsort(-1)  # lowest min-cosine chunks are outliers, kept exact
        outl, rest = order[..., : self.outliers].sort(-1).values, order[..., self.outliers :].sort(-1).values
        t_out = (outl[..., None] * c + torch.arange(c, device=keys.device)).flatten(-2)

        def rows(x, t):
            return torch.gather(x, 2, t[..., None].expand(-1, -1, -1, d))

        layer.sr = SRState(
            landmarks=torch.gather(landmarks, 2, rest[..., None].expand(-1, -1, -1, d)),
            chunk_ids=rest,
            budget_chunks=self.budget // c,
            chunk=c,
            prompt_len=L,
            a_k=fk[0],
            b_k=fk[1],
            a_v=fv[0] if fv else None,
            b_v=fv[1] if fv else None,
            v_exact=None if fv else values,
        )
        layer.keys = torch.cat([keys[:, :, n_ch * c :], rows(keys, t_out)], 2)
        layer.values = torch.cat([values[:, :, n_ch * c :], rows(values, t_out)], 2)
        layer.n_recon = 0
        if not fv:  # exact V of the whole prompt is kept (the official system offloads it to CPU)
            layer.compressed_elements += values.numel()
        layer.compressed_elements += layer.sr.landmarks.numel()

    def metrics(self, cache: MethodCache) -> dict[str, float]:
        fracs = [layer.sr.last_frac for layer in cache.layers if layer.sr and layer.sr.last_frac is not None]
        out = super().metrics(cache)
        if fracs:
            out["tokens_reconstructed_frac"] = sum(fracs) / len(fracs)
        return out


def slerp_merge(x: torch.Tensor, y: torch.Tensor, t: float = 0.5, gamma: float = 0.05):
    """MiniCache merge of two layers' [B, H, L, d] rows, as the official xKV code's ``fake_minicache_merge``.

    Per row (one (batch, head, token) vector of size d): the angle ``omega`` between the two layers' rows; min and
    max over all rows. Rows with ``omega > min + gamma * (max - min)`` (the official ``diverge_mask``) are MERGED:
    both layers get the SLERP direction at ``t``, rescaled to their own row norms; the other rows, the
    near-parallel ones, keep their own vectors (the official ``E1[~diverge_mask] = X1[~diverge_mask]``). So at the
    official gamma = 0.05 nearly every row is merged. Returns (x', y', n_merged, n_retained)."""
    nx, ny = x.norm(dim=-1, keepdim=True), y.norm(dim=-1, keepdim=True)
    ux, uy = x / nx.clamp_min(1e-12), y / ny.clamp_min(1e-12)
    omega = torch.arccos((ux * uy).sum(-1, keepdim=True).clamp(-1 + 1e-7, 1 - 1e-7))
    so = torch.sin(omega)
    direction = (torch.sin((1 - t) * omega) * ux + torch.sin(t * omega) * uy) / so
    merged = omega > omega.min() + gamma * (omega.max() - omega.min())
    x_new = torch.where(merged, direction * nx, x)
    y_new = torch.where(merged, direction * ny, y)
    n_merged = int(merged.sum())
    return x_new, y_new, n_merged, merged.numel() - n_merged


class MiniCache(KVMethod):
    """MiniCache baseline: merge layer pairs (l, l+1) in [start, end] by SLERP of pre-RoPE K and V rows. Stored per
    merged pair: merged rows as one direction + two norms (d + 2), retained rows in full (2 d)."""

    name = "minicache"

    def __init__(self, start_layer: int = 0, end_layer: int = -1, merge: MiniCacheMerge = MERGE):
        self.start, self.end, self.t, self.gamma = start_layer, end_layer, merge.slerp_t, merge.slerp_gamma

    def make_layer(self, layer_idx, n_layers):
        return XKVLayer(layer_idx)

    def after_prefill(self, cache: MethodCache) -> None:
        L = cache.prompt_len
        cos, sin = cache.cos[:L], cache.sin[:L]
        for pair in layer_groups(len(cache.layers), 2, self.start, self.end):
            if len(pair) < 2:
                continue
            la, lb = (cache.layers[i] for i in pair)
            d = la.keys.shape[-1]
            ka, kb, mk, rk = slerp_merge(
                inverse_rope(la.keys.float(), cos, sin),
                inverse_rope(lb.keys.float(), cos, sin),
                self.t,
                self.gamma,
            )
            va, vb, mv, rv = slerp_merge(la.values.float(), lb.values.float(), self.t, self.gamma)
            la.keys, lb.keys = (apply_rope(k, cos, sin).to(la.dtype) for k in (ka, kb))
            la.values, lb.values = va.to(la.dtype), vb.to(la.dtype)
            la.compressed_elements = (mk + mv) * (d + 2) + (rk + rv) * 2 * d
            la.n_recon = lb.n_recon = L


def make_method(
    method: Method,
    plan: CompressionPlan = PLAN,
    sr: SelectiveReconstruction = SR,
    merge: MiniCacheMerge = MERGE,
) -> KVMethod:
    """The xKV family and its baselines by name."""
    if method == "dense":
        return KVMethod()
    if method == "xkv":
        return XKV(plan)
    if method in ("xkv_sr", "xk_sr"):
        return XKVSelective(plan, sr, values_lowrank=method == "xkv_sr")
    if method == "shadowkv":  # per-layer key SVD at the plan's (already resolved) ranks
        per_layer = replace(
            plan, group_size=1, rank_k=plan.key_rank, rank_v=plan.value_rank, rank_per_layer=None
        )
        return XKVSelective(per_layer, sr, values_lowrank=False)
    if method == "minicache":
        return MiniCache(plan.start_layer, plan.end_layer, merge)
    raise ValueError(f"method={method!r}; use one of dense, xkv, xkv_sr, xk_sr, shadowkv, minicache")


class XKVCompressionModule(LongContextEval):
    """A frozen causal LM evaluated with an xKV-family KV cache, the question asked after compression (the paper's
    multi-turn setting). ``cr_inf`` = 2 G H_kv d / (r_k + r_v), the compression ratio as L -> inf (features / per
    layer rank at equal rank), is logged beside the measured one.

    Argument groups: ``lm`` (the frozen model), ``method``, ``plan`` (layers and ranks), ``selective`` (SR
    methods), ``minicache`` (the MiniCache baseline), ``evaluation``.
    """

    # the baselines have no asymptotic ratio: their cr_inf is NaN on purpose (litlab.callbacks.divergence)
    nonfinite_metrics_allowed = ("*/cr_inf",)

    def __init__(
        self,
        lm: FrozenLM = TINY_LM,
        method: Method = "xkv",
        plan: CompressionPlan = PLAN,
        selective: SelectiveReconstruction = SR,
        minicache: MiniCacheMerge = MERGE,
        evaluation: EvalSettings = EVAL,
    ):
        super().__init__(lm, evaluation, query_after_compression=True)
        self.save_hyperparameters()
        plan = as_config(CompressionPlan, plan, "plan")
        selective = as_config(SelectiveReconstruction, selective, "selective")
        self.method = make_method(method, plan, selective, as_config(MiniCacheMerge, minicache, "minicache"))
        cfg = self.lm.config
        feats = cfg.num_key_value_heads * head_dim(cfg)
        self.cr_inf = (
            2 * plan.group_size * feats / (plan.key_rank + plan.value_rank)
            if method in ("xkv", "xkv_sr")
            else float("nan")
        )

    def extra_metrics(self) -> dict[str, float]:
        return {"cr_inf": self.cr_inf}


def report(result: CardResult, out_dir: Path) -> ReportExtras:
    """Card hook: accuracy vs compression ratio per run (plot + table), and the highest CR reached within one point
    of dense accuracy by single-layer SVD (G=1) and by xKV (G>1), per model."""
    return acc_vs_cr_report(result, Path(out_dir))
