"""xKV — cross-layer SVD of the KV-cache with Selective Reconstruction (ICML 2026). Spec: shared/methods/xkv.md.

Algorithm (per request, nothing trained; xkv.md §3):
    prefill with exact K/V                                     # §3.3: compression never touches prefill
    for each group g of G consecutive layers:
        X_K = [K_l1 | ... | K_lG]   (pre-RoPE, L x G*H_kv*d)   # §3.3.1, inverse RoPE recovers pre-RoPE keys
        X_K ≈ U_r S_r W_r^T;  A_K = U_r,  B_K = S_r W_r^T      # §3.3.2-3 (Eckart-Young optimal rank r)
        B_K -> per-layer, per-head blocks B_K[l, h] (r x d)     # §3.3.4; values the same with r_v
    decode, method "xkv":     attend over [RoPE(A_K B_K[l]) ; exact new tokens]                      (§3.5)
    decode, method "xkv_sr":  score chunk landmarks with q, reconstruct only the top S/c chunks    (§3.6)
Baselines: G=1 = single-layer SVD; "xk_sr"/"shadowkv" keep V exact (ShadowKV: G=1); MiniCache = SLERP merge of
layer pairs (§3.6). The official code buffers a group until its last layer prefilled; here compression runs
after the whole prefill forward, which gives identical numbers (prefill attention is exact either way).
Reconstructed, not read from the paper (xkv.md §8): SR details are ShadowKV's, GQA aggregation max over heads.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from litlab.kernels.block_sparse_attention import dense_causal_attention
from litlab.kernels.lowrank import apply_rope, gather_lowrank_reconstruct, inverse_rope
from litlab.lit_modules.longctx.harness import LongContextEval
from litlab.lit_modules.longctx.kv_cache import (
    CACHE_KWARG,
    ExactLayer,
    KVMethod,
    MethodCache,
    dense_attention,
    register_attention,
)

Method = Literal["dense", "xkv", "xkv_sr", "xk_sr", "shadowkv", "minicache"]


# ---- §3.3 cross-layer SVD and §3.4 compression ratio -----------------------------------------------------------
def layer_groups(n_layers: int, group_size: int, start: int = 0, end: int = -1) -> list[list[int]]:
    """§3.2: consecutive groups over [start, end] (end=-1: last layer); a trailing partial group is allowed."""
    end = n_layers - 1 if end < 0 else end
    if group_size < 1 or not 0 <= start <= end < n_layers:
        raise ValueError(
            f"bad grouping: group_size={group_size}, start_layer={start}, end_layer={end}, "
            f"n_layers={n_layers}"
        )
    return [list(range(s, min(s + group_size, end + 1))) for s in range(start, end + 1, group_size)]


def truncated_svd(x: torch.Tensor, rank: int, impl: str = "exact") -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, L, F] -> A = U_r [B, L, r], B = S_r W_r^T [B, r, F], in fp32 (§3.3.2-3)."""
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
    """§3.4 whole-model CR with every layer compressed: dense K+V over token factors + per-layer B blocks."""
    stored = math.ceil(n_layers / group_size) * L * (rank_k + rank_v) + n_layers * h_kv * d * (
        rank_k + rank_v
    )
    return 2 * n_layers * L * h_kv * d / stored


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """§3.7: CKA of two [L, F] matrices (columns centred)."""
    x, y = x - x.mean(0), y - y.mean(0)
    return float((x.T @ y).norm() ** 2 / ((x.T @ x).norm() * (y.T @ y).norm()))


def _flat(x: torch.Tensor) -> torch.Tensor:  # [B, H, L, d] -> [B, L, H*d]
    return x.transpose(1, 2).flatten(2)


def _heads(b: torch.Tensor, h_kv: int) -> torch.Tensor:  # [B, r, H*d] -> [B, H, r, d]
    return b.unflatten(-1, (h_kv, -1)).permute(0, 2, 1, 3).contiguous()


class XKVLayer(ExactLayer):
    """Exact layer + the compressed prompt: either materialised reconstructions (``n_recon`` leading rows, not
    counted as stored) or, for SR, the factors and landmarks that ``select`` reconstructs from."""

    def __init__(self, layer_idx: int):
        super().__init__(layer_idx)
        self.n_recon = 0
        self.compressed_elements = 0
        self.sr = None  # SR state after compression

    def stored_elements(self) -> int:
        if not self.is_initialized:
            return 0
        exact_rows = self.keys.shape[-2] - self.n_recon
        per_row = self.keys.shape[0] * self.keys.shape[1] * self.keys.shape[-1]
        return self.compressed_elements + 2 * exact_rows * per_row

    def select(self, q: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """§3.6 steps 5-7: landmark scores (softmax over chunks, summed over query tokens, max over the GQA group),
        top-(S/c) chunks per KV head, reconstruct those rows (kernel c1)."""
        st = self.sr
        h_kv, g = st["landmarks"].shape[1], q.shape[1] // st["landmarks"].shape[1]
        logits = (
            q.float() @ st["landmarks"].repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
        )
        score = torch.softmax(logits, -1).sum(2).unflatten(1, (h_kv, g)).amax(2)  # [B, H_kv, n_chunks]
        top = score.topk(min(st["budget_chunks"], score.shape[-1]), -1).indices
        chunks = torch.gather(st["chunk_ids"], -1, top).sort(-1).values
        c = st["chunk"]
        k_sel = gather_lowrank_reconstruct(st["a_k"], st["b_k"], chunks, cos, sin, chunk_size=c)
        if st["a_v"] is not None:
            v_sel = gather_lowrank_reconstruct(st["a_v"], st["b_v"], chunks, chunk_size=c)
        else:  # xk_sr / shadowkv: exact values of the selected tokens
            t = (chunks[..., None] * c + torch.arange(c, device=chunks.device)).flatten(-2)
            v_sel = torch.gather(st["v_exact"], 2, t[..., None].expand(-1, -1, -1, st["v_exact"].shape[-1]))
        st["last_frac"] = chunks.shape[-1] * c / st["prompt_len"]
        return k_sel.to(q.dtype), v_sel.to(q.dtype)


def xkv_sr_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """§3.8: exact prefill; at decode, attend over [reconstructed selected ; exact tail, outliers, new tokens]."""
    layer = kwargs[CACHE_KWARG].layers[module.layer_idx]
    if layer.sr is None:
        return dense_attention(module, query, key, value, scaling=scaling)
    cache = kwargs[CACHE_KWARG]
    k_sel, v_sel = layer.select(query, cache.cos, cache.sin)
    out = dense_causal_attention(query, torch.cat([k_sel, key], 2), torch.cat([v_sel, value], 2), scaling)
    return out.transpose(1, 2).contiguous(), None


class XKV(KVMethod):
    """Dense-reconstruction xKV (§3.5); ``group_size=1`` is the single-layer SVD baseline."""

    name = "xkv"

    def __init__(
        self,
        group_size: int = 4,
        rank_k: int = 384,
        rank_v: int = 576,
        merge_k: bool = True,
        merge_v: bool = True,
        start_layer: int = 0,
        end_layer: int = -1,
        svd_impl: str = "exact",
        exact_tail: int = 0,
    ):
        self.group_size, self.rank_k, self.rank_v = group_size, rank_k, rank_v
        self.merge_k, self.merge_v, self.start, self.end = merge_k, merge_v, start_layer, end_layer
        self.svd_impl, self.exact_tail = svd_impl, exact_tail

    def make_layer(self, layer_idx, n_layers):
        return XKVLayer(layer_idx)

    def _factorise(self, cache: MethodCache, group: list[int], values: bool):
        layers = [cache.layers[i] for i in group]
        L = cache.prompt_len
        cos, sin = cache.cos[:L], cache.sin[:L]
        mats = [layer.values if values else inverse_rope(layer.keys.float(), cos, sin) for layer in layers]
        h_kv = mats[0].shape[1]
        x = torch.cat([_flat(m.float()) for m in mats], -1)  # [B, L, G*H_kv*d], layer-major then head-major
        a, b = truncated_svd(x, self.rank_v if values else self.rank_k, self.svd_impl)
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
        for group in layer_groups(len(cache.layers), self.group_size, self.start, self.end):
            fk = self._factorise(cache, group, values=False) if self.merge_k else None
            fv = self._factorise(cache, group, values=True) if self.merge_v else None
            for i, idx in enumerate(group):
                layer = cache.layers[idx]
                errs["k"] += fk[2][i : i + 1] if fk else []
                errs["v"] += fv[2][i : i + 1] if fv else []
                self.install(cache, layer, fk and (fk[0], fk[1][i]), fv and (fv[0], fv[1][i]), L)
        for kind in ("k", "v"):
            if errs[kind]:
                cache.metrics[f"recon_rel_err_{kind}"] = sum(errs[kind]) / len(errs[kind])

    def install(self, cache, layer: XKVLayer, fk, fv, L: int) -> None:
        """Dense mode: materialise RoPE(A_K B_K[l]) and A_V B_V[l] once (identical numerics, §3.5)."""
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
    """§3.6 xKV-SR (values low-rank too), xK-SR (``values_lowrank=False``), ShadowKV = xK-SR with G=1."""

    name = "xkv_sr"
    attn_implementation = "xkv_sr"

    def __init__(
        self,
        sparse_budget: int = 2048,
        chunk_size: int = 8,
        local_chunks: int = 4,
        outlier_chunks: int | None = None,
        values_lowrank: bool = True,
        **xkv_args,
    ):
        super().__init__(merge_v=values_lowrank, **xkv_args)
        self.budget, self.chunk, self.local_chunks = sparse_budget, chunk_size, local_chunks
        self.outliers = 24 * (sparse_budget // 1024) if outlier_chunks is None else outlier_chunks
        self.values_lowrank = values_lowrank

    def prepare(self, model) -> None:
        register_attention("xkv_sr", xkv_sr_attention)
        super().prepare(model)

    def install(self, cache, layer: XKVLayer, fk, fv, L: int) -> None:
        c = self.chunk
        n_ch = L // c - self.local_chunks  # §3.6.1: context chunks; the rest (tail) stays exact
        if n_ch <= self.outliers or fk is None:
            raise ValueError(
                f"prompt of {L} tokens leaves {n_ch} chunks of {c}: too few for local_chunks="
                f"{self.local_chunks}, outlier_chunks={self.outliers}"
            )
        keys, values = layer.keys, layer.values
        B, h_kv, _, d = keys.shape
        ctx = keys[:, :, : n_ch * c].float().unflatten(2, (n_ch, c))  # [B, H, n_ch, c, d] post-RoPE
        landmarks = ctx.mean(3)  # §3.6.2
        cos_sim = torch.nn.functional.cosine_similarity(landmarks[:, :, :, None], ctx, dim=-1).amin(-1)
        order = cos_sim.argsort(-1)  # §3.6.3: lowest min-cosine chunks are outliers, kept exact
        outl, rest = order[..., : self.outliers].sort(-1).values, order[..., self.outliers :].sort(-1).values
        t_out = (outl[..., None] * c + torch.arange(c, device=keys.device)).flatten(-2)

        def rows(x, t):
            return torch.gather(x, 2, t[..., None].expand(-1, -1, -1, d))

        layer.sr = {
            "landmarks": torch.gather(landmarks, 2, rest[..., None].expand(-1, -1, -1, d)),
            "chunk_ids": rest,
            "budget_chunks": self.budget // c,
            "chunk": c,
            "prompt_len": L,
            "a_k": fk[0],
            "b_k": fk[1],
            "a_v": fv[0] if fv else None,
            "b_v": fv[1] if fv else None,
            "v_exact": None if fv else values,
        }
        layer.keys = torch.cat([keys[:, :, n_ch * c :], rows(keys, t_out)], 2)
        layer.values = torch.cat([values[:, :, n_ch * c :], rows(values, t_out)], 2)
        layer.n_recon = 0
        if not fv:  # exact V of the whole prompt is kept (the official system offloads it to CPU)
            layer.compressed_elements += values.numel()
        layer.compressed_elements += layer.sr["landmarks"].numel()

    def metrics(self, cache: MethodCache) -> dict[str, float]:
        fracs = [layer.sr["last_frac"] for layer in cache.layers if layer.sr and "last_frac" in layer.sr]
        out = super().metrics(cache)
        if fracs:
            out["tokens_reconstructed_frac"] = sum(fracs) / len(fracs)
        return out


def slerp_merge(x: torch.Tensor, y: torch.Tensor, t: float = 0.5, gamma: float = 0.05):
    """MiniCache (§3.6): SLERP of two layers' [B, H, L, d] rows, rescaled to each layer's norms; rows whose angle
    exceeds min + gamma*(max - min) are retained. Returns (x', y', n_merged, n_retained)."""
    nx, ny = x.norm(dim=-1, keepdim=True), y.norm(dim=-1, keepdim=True)
    ux, uy = x / nx.clamp_min(1e-12), y / ny.clamp_min(1e-12)
    omega = torch.arccos((ux * uy).sum(-1, keepdim=True).clamp(-1 + 1e-7, 1 - 1e-7))
    so = torch.sin(omega)
    direction = (torch.sin((1 - t) * omega) * ux + torch.sin(t * omega) * uy) / so
    retain = omega > omega.min() + gamma * (omega.max() - omega.min())
    x_new = torch.where(retain, x, direction * nx)
    y_new = torch.where(retain, y, direction * ny)
    n_ret = int(retain.sum())
    return x_new, y_new, retain.numel() - n_ret, n_ret


class MiniCache(KVMethod):
    """MiniCache baseline: merge layer pairs (l, l+1) in [start, end] by SLERP of pre-RoPE K and V rows."""

    name = "minicache"

    def __init__(
        self, start_layer: int = 0, end_layer: int = -1, slerp_t: float = 0.5, slerp_gamma: float = 0.05
    ):
        self.start, self.end, self.t, self.gamma = start_layer, end_layer, slerp_t, slerp_gamma

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


def make_method(method: Method, group_size: int = 4, rank_k: int = 384, rank_v: int = 576, **kw) -> KVMethod:
    """The xKV family and its baselines by name (xkv.md §5)."""
    sr = {k: kw.pop(k) for k in ("sparse_budget", "chunk_size", "local_chunks", "outlier_chunks") if k in kw}
    mini = {k: kw.pop(k) for k in ("slerp_t", "slerp_gamma") if k in kw}
    if method == "dense":
        return KVMethod()
    if method == "xkv":
        return XKV(group_size, rank_k, rank_v, **kw)
    if method in ("xkv_sr", "xk_sr", "shadowkv"):
        g = 1 if method == "shadowkv" else group_size
        kw.pop("merge_v", None)
        return XKVSelective(
            values_lowrank=method == "xkv_sr", group_size=g, rank_k=rank_k, rank_v=rank_v, **sr, **kw
        )
    if method == "minicache":
        return MiniCache(kw.get("start_layer", 0), kw.get("end_layer", -1), **mini)
    raise ValueError(f"method={method!r}; use one of dense, xkv, xkv_sr, xk_sr, shadowkv, minicache")


class XKVCompressionModule(LongContextEval):
    """xkv.md §5: a frozen causal LM evaluated with an xKV-family KV cache (query after compression).

    ``rank_per_layer`` (if set) gives ``rank_k = rank_v = group_size * rank_per_layer`` (equal average rank per
    layer, the paper's "equal compression"); ``cr_inf`` = features / per-layer rank is logged beside the
    measured CR.
    """

    def __init__(
        self,
        model_name: str = "tiny_passkey_llama",
        method: Method = "xkv",
        group_size: int = 4,
        rank_k: int = 384,
        rank_v: int = 576,
        rank_per_layer: int | None = None,
        merge_k: bool = True,
        merge_v: bool = True,
        start_layer: int = 0,
        end_layer: int = -1,
        svd_impl: Literal["exact", "lowrank"] = "exact",
        sparse_budget: int = 2048,
        chunk_size: int = 8,
        local_chunks: int = 4,
        outlier_chunks: int | None = None,
        slerp_t: float = 0.5,
        slerp_gamma: float = 0.05,
        max_new_tokens: int = 1,
        dtype: str = "float32",
        tiny_train_steps: int = 200,
        tiny_seed: int = 1,
    ):
        if rank_per_layer is not None:
            rank_k = rank_v = group_size * rank_per_layer
        super().__init__(
            model_name=model_name,
            max_new_tokens=max_new_tokens,
            dtype=dtype,
            query_after_compression=True,
            tiny_train_steps=tiny_train_steps,
            tiny_seed=tiny_seed,
        )
        self.save_hyperparameters()
        self.method = make_method(
            method,
            group_size,
            rank_k,
            rank_v,
            merge_k=merge_k,
            merge_v=merge_v,
            start_layer=start_layer,
            end_layer=end_layer,
            svd_impl=svd_impl,
            sparse_budget=sparse_budget,
            chunk_size=chunk_size,
            local_chunks=local_chunks,
            outlier_chunks=outlier_chunks,
            slerp_t=slerp_t,
            slerp_gamma=slerp_gamma,
        )
        cfg = self.lm.config
        feats = cfg.num_key_value_heads * getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
        self.cr_inf = (
            2 * group_size * feats / (rank_k + rank_v) if method in ("xkv", "xkv_sr") else float("nan")
        )

    def extra_metrics(self) -> dict[str, float]:
        return {"cr_inf": self.cr_inf}


def report(res: dict, out_dir) -> dict:
    """Card hook: accuracy vs compression ratio per run (plot + numbers), and the highest CR reached within one
    point of dense accuracy by single-layer SVD (G=1) and by xKV (G>1), per model."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from litlab.lit_modules.longctx.harness import read_run_metrics

    rows = {
        name: {k: float(v) for k, v in read_run_metrics(run["runs"][0]["run_dir"]).items()}
        for name, run in res["runs"].items()
    }
    numbers, lines = (
        {},
        ["| run | acc | CR | CR_inf | recon err K/V | tokens reconstructed |", "|---|---|---|---|---|---|"],
    )
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for prefix, marker in (("", "o"), ("smol_", "s")):
        names = [n for n in rows if n.startswith("smol_") == bool(prefix)]
        dense = rows.get(f"{prefix}dense", {}).get("val/acc")
        best = {"svd": 0.0, "xkv": 0.0}
        for n in names:
            m = rows[n]
            acc, cr = m.get("val/acc", float("nan")), m.get("val/compression_ratio", float("nan"))
            numbers[f"{n}_acc"], numbers[f"{n}_cr"] = acc, cr
            if "val/tokens_reconstructed_frac" in m:
                numbers[f"{n}_tokens_reconstructed_frac"] = m["val/tokens_reconstructed_frac"]
            ax.scatter(cr, acc, marker=marker)
            ax.annotate(n, (cr, acc), fontsize=6)
            lines.append(
                f"| {n} | {acc:.3f} | {cr:.2f} | {m.get('val/cr_inf', float('nan')):.1f} | "
                f"{m.get('val/recon_rel_err_k', float('nan')):.3f}/{m.get('val/recon_rel_err_v', float('nan')):.3f}"
                f" | {m.get('val/tokens_reconstructed_frac', float('nan')):.3f} |"
            )
            kind = "svd" if "svd" in n else ("xkv" if "xkv" in n and "sr" not in n else None)
            if kind and dense is not None and acc >= dense - 0.01:
                best[kind] = max(best[kind], cr)
        if dense is not None:
            numbers[f"{prefix}best_cr_within_1pt_svd"], numbers[f"{prefix}best_cr_within_1pt_xkv"] = (
                best["svd"],
                best["xkv"],
            )
    ax.set_xscale("log")
    ax.set_xlabel("compression ratio (xkv.md §3.4, log scale)")
    ax.set_ylabel("passkey accuracy")
    ax.set_title("xKV: accuracy vs compression (o tiny, s SmolLM2)")
    fig.tight_layout()
    path = Path(out_dir) / "xkv_acc_vs_cr.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {"figures": [path], "markdown": "\n".join(lines), "numbers": numbers}
