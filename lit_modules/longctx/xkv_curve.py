"""xKV's headline read from a curve: retrieval accuracy against compression ratio, from one prefill per prompt.

Paper: "xKV: Cross-Layer SVD for KV-Cache Compression", arXiv 2503.18893 (ICML 2026). Its headline is a compression
ratio at equal accuracy: "xKV achieves up to 8x KV-Cache compression while preserving accuracy" (abstract) and
"up to 6.8x higher compression rates than [MiniCache] while improving accuracy by 2.7%" (v1 abstract). So one run
measures, on the same prompts and the same prefill, every compression budget of one or more method families:

    for each prompt:
        prefill the context with the exact cache; answer the question from it            # dense accuracy
        for each family f (per-layer SVD = G 1, xKV = G ``group_size``, MiniCache on the deeper half):
            for each target compression ratio c (MiniCache: its one merge, CR set by its threshold):
                r_k + r_v = the ranks that store 1/c of the dense K+V at this prompt's length   # official
                r_v = v_to_k r_k (1:1.5)                                   # calc_kv_comp_rate formula
                compress a copy of the prefilled cache, answer the question through it     # acc_f(c), CR_f(c)
    per seed and family: cr_near_dense_f = the highest measured CR_f(c) with acc_f(c) >= acc_dense - tolerance
                                           (1.0, the uncompressed cache, where no budget keeps dense accuracy)

The query arrives after compression (the paper's multi-turn setting). A group's SVD is computed once per prompt at
the largest rank a family asks for and truncated for the others (``XKV.shared_svd``): the same factors as one
SVD per budget, at one SVD's cost. Nothing is trained; the run is one no-op training step and one validation epoch.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.longctx.harness import EVAL, TINY_LM, EvalSettings, FrozenLM, LongContextEval
from litlab.lit_modules.longctx.kv_cache import (
    CACHE_KWARG,
    KVMethod,
    MethodCache,
    answer_from_cache,
    head_dim,
)
from litlab.lit_modules.longctx.xkv import MERGE, XKV, CompressionPlan, MiniCache, MiniCacheMerge

Family = Literal["svd", "xkv", "minicache"]


@config_part
class CurveBudgets:
    """What one curve run measures. ``families``: ``svd`` (per-layer SVD, G = 1), ``xkv`` (G = ``group_size``),
    ``minicache`` (SLERP merge of layer pairs; one point, its CR set by its threshold); ``target_crs``: the
    compression ratios the SVD families are budgeted at (K:V ranks ``1 : v_to_k``, the official 1:1.5);
    ``near_dense_tolerance``: how far below the run's dense accuracy a budget may fall and still count as
    "preserving accuracy" (0.01: the paper's one point); ``minicache_start_layer``: the first layer MiniCache
    merges (None: the middle one, as MiniCache, arXiv 2405.14366, merges the deeper half of the model)."""

    families: tuple[Family, ...] = ("svd", "xkv", "minicache")
    target_crs: tuple[float, ...] = (2.0, 4.0, 8.0, 16.0)
    group_size: int = 4
    v_to_k: float = 1.5
    near_dense_tolerance: float = 0.01
    minicache_start_layer: int | None = None


CURVE = CurveBudgets()


def ranks_for_ratio(
    target_cr: float, n_layers: int, L: int, h_kv: int, d: int, group_size: int, v_to_k: float
) -> tuple[int, int]:
    """(r_k, r_v) per group that store 1/``target_cr`` of the dense K+V: the official compression-rate formula
    (``litlab.lit_modules.longctx.xkv.compression_ratio``) solved for r_k + r_v, split 1 : ``v_to_k``, each at
    least 1 and at most the group's features."""
    if target_cr < 1 or v_to_k <= 0:
        raise ValueError(f"target_cr={target_cr} must be >= 1 and v_to_k={v_to_k} > 0")
    per_rank = (
        math.ceil(n_layers / group_size) * L + n_layers * h_kv * d
    )  # stored elements per unit of r_k + r_v
    total = 2 * n_layers * L * h_kv * d / (target_cr * per_rank)
    features = group_size * h_kv * d
    r_k = min(features, max(1, round(total / (1 + v_to_k))))
    return r_k, min(features, max(1, round(v_to_k * r_k)))


def copy_of_prefilled(prefilled: MethodCache, method: KVMethod, model, max_len: int) -> MethodCache:
    """A new cache of ``method``'s layers holding the prefilled exact K/V. The tensors are shared, not cloned:
    compression and decoding replace a layer's tensors, never write into them."""
    cache = method.make_cache(model, max_len)
    for new, old in zip(cache.layers, prefilled.layers):
        new.lazy_initialization(old.keys, old.values)
        new.keys, new.values, new.seen = old.keys, old.values, old.seen
    cache.prompt_len = prefilled.prompt_len
    return cache


def point_name(family: Family, target_cr: float | None) -> str:
    """The metric stem of one curve point: ``svd_cr8``, ``xkv_cr4``, ``minicache``."""
    return family if target_cr is None else f"{family}_cr{target_cr:g}"


class XKVCurveModule(LongContextEval):
    """A frozen causal LM; per prompt one exact prefill, then every budget of ``curve`` answered through its own
    compressed copy of that prefill. Logs per run (means over the prompts): ``val/acc_dense``,
    ``val/<point>_acc`` and ``val/<point>_cr`` (the measured compression ratio) for every point, and
    ``val/<family>_cr_near_dense``."""

    def __init__(
        self,
        lm: FrozenLM = TINY_LM,
        curve: CurveBudgets = CURVE,
        minicache: MiniCacheMerge = MERGE,
        evaluation: EvalSettings = EVAL,
    ):
        super().__init__(lm, evaluation, query_after_compression=True)
        self.save_hyperparameters()
        self.curve = as_config(CurveBudgets, curve, "curve")
        self.merge = as_config(MiniCacheMerge, minicache, "minicache")
        unknown = sorted(set(self.curve.families) - {"svd", "xkv", "minicache"})
        if unknown or not self.curve.families or self.curve.group_size < 2:
            raise ValueError(
                f"curve.families={list(self.curve.families)} (use svd, xkv, minicache), "
                f"curve.group_size={self.curve.group_size} (xKV groups at least 2 layers)"
            )
        self.method = KVMethod()  # the exact prefill every point starts from
        self._answers: dict[str, list[tuple[float, float]]] = {}  # point -> per prompt (correct, CR)

    def points(self) -> list[tuple[Family, float | None]]:
        """(family, target CR) in the order they run: ascending CR, so a group's SVD is computed at its largest
        rank first and truncated for the rest."""
        crs = sorted(self.curve.target_crs)
        ranked = [(f, c) for f in self.curve.families if f != "minicache" for c in crs]
        return ranked + [("minicache", None)] * ("minicache" in self.curve.families)

    def compressor(self, family: Family, target_cr: float | None, L: int, shared: dict) -> KVMethod:
        cfg, c = self.lm.config, self.curve
        if family == "minicache":
            start = cfg.num_hidden_layers // 2 if c.minicache_start_layer is None else c.minicache_start_layer
            return MiniCache(start, -1, self.merge)
        g = 1 if family == "svd" else c.group_size
        r_k, r_v = ranks_for_ratio(
            float(target_cr or 1.0),
            cfg.num_hidden_layers,
            L,
            cfg.num_key_value_heads,
            head_dim(cfg),
            g,
            c.v_to_k,
        )
        plan = CompressionPlan(group_size=g, rank_k=r_k, rank_v=r_v)
        return XKV(plan, shared_svd=shared.setdefault(family, {}))

    @torch.no_grad()
    def answer_curve(self, item) -> dict[str, tuple[float, float]]:
        """point -> (correct, measured CR) for one prompt; ``dense`` is the uncompressed cache."""
        ctx, query = item["context_ids"].to(self.device)[None], item["query_ids"].to(self.device)[None]
        n_new = max(self.max_new_tokens, len(item["answer_ids"]))
        eos = None if self.tokenizer is None else self.tokenizer.eos_token_id
        L, max_len = ctx.shape[1], ctx.shape[1] + query.shape[1] + n_new + 1
        self.method.prepare(self.lm)
        prefilled = self.method.make_cache(self.lm, max_len)
        logits = self.lm(input_ids=ctx, cache=prefilled, use_cache=True, **{CACHE_KWARG: prefilled}).logits[
            :, -1
        ]
        prefilled.prompt_len = L
        shared: dict = {}  # family -> its groups' SVD factors for this prompt

        def answer(method: KVMethod) -> tuple[float, float]:
            method.prepare(self.lm)
            cache = copy_of_prefilled(prefilled, method, self.lm, max_len)
            method.after_prefill(cache)
            tokens, _ = answer_from_cache(self.lm, cache, logits, L, query, n_new, eos)
            return float(self.answer_correct(item, tokens)), method.metrics(cache)["compression_ratio"]

        out = {"dense": answer(KVMethod())}
        for family, target in self.points():
            out[point_name(family, target)] = answer(self.compressor(family, target, L, shared))
        return out

    def on_validation_epoch_start(self) -> None:
        self._answers = {}

    def validation_step(self, batch, batch_idx):
        for point, answer in self.answer_curve(batch[0]).items():
            self._answers.setdefault(point, []).append(answer)

    def on_validation_epoch_end(self) -> None:
        for name, value in curve_metrics(
            self._answers, self.points(), self.curve.near_dense_tolerance
        ).items():
            self.log(f"val/{name}", value)


def curve_metrics(
    answers: dict[str, list[tuple[float, float]]],
    points: list[tuple[Family, float | None]],
    tolerance: float,
) -> dict[str, float]:
    """Per-run means of the per-prompt answers, and each family's highest CR within ``tolerance`` of dense."""

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs)

    dense = mean([ok for ok, _ in answers["dense"]])
    out = {"acc_dense": dense}
    near: dict[str, float] = {}
    for family, target in points:
        name = point_name(family, target)
        acc, cr = mean([ok for ok, _ in answers[name]]), mean([c for _, c in answers[name]])
        out[f"{name}_acc"], out[f"{name}_cr"] = acc, cr
        best = near.setdefault(family, 1.0)
        near[family] = max(best, cr) if acc >= dense - tolerance else best
    out.update({f"{family}_cr_near_dense": cr for family, cr in near.items()})
    return out
