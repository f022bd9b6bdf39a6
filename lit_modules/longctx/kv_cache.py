"""The one interface every KV-cache / attention method of the family plugs into (a kvpress-style "press").

A method is a ``KVMethod`` and nothing else: it names the attention function the model runs with
(``attn_implementation``, and ``attention_fn`` when it brings its own, registered once with transformers'
``AttentionInterface``), builds the per-request ``MethodCache`` (a transformers ``Cache`` of ``ExactLayer``-derived
layers, which also carries the method and the model's RoPE tables), may compress the cache after prefill
(``after_prefill``) and reports its metrics (``metrics``). xKV (arXiv 2503.18893), its baselines (single-layer SVD,
MiniCache, ShadowKV arXiv 2410.21465) and SALE (arXiv 2505.24179, + its pooled baseline) all plug in here;
``greedy_generate`` runs any of them (prefill, optional compression, query-after-compression, greedy decode) with
its own loop, so the cache reaches every attention call under the keyword ``CACHE_KWARG``: an attention function
finds its layer and its method through ``method_cache(kwargs)``, never through attributes set on the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin

from litlab.kernels.block_sparse_attention import dense_causal_attention
from litlab.lit_modules.core.errors import ContractError

CACHE_KWARG = "kv_method_cache"  # the keyword under which the cache reaches the attention function


# ---- RoPE tables of a Llama-family model ----------------------------------------------------------------------
def rope_tables(model, length: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [length, d] of the model's own rotary embedding (rotate-half convention, any rope scaling)."""
    rotary = model.model.rotary_emb
    pos = torch.arange(length, device=device)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32, device=device), pos)
    return cos[0].float(), sin[0].float()


def head_dim(config) -> int:
    """Per-head dimension of a transformers config (``head_dim`` when it is set, else hidden / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


# ---- cache: exact layers that methods subclass ------------------------------------------------------------------
class ExactLayer(CacheLayerMixin):
    """Exact post-RoPE K/V ``[B, H_kv, T, d]``; ``get_seq_length`` is the LOGICAL length (prompt + generated)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.seen = 0  # logical tokens (compressed ones included)
        self.prefilled = False

    def lazy_initialization(self, key_states, value_states) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        self.keys = key_states[..., :0, :]
        self.values = value_states[..., :0, :]
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = torch.cat([self.keys, key_states], -2)
        self.values = torch.cat([self.values, value_states], -2)
        self.seen += key_states.shape[-2]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[-2] + query_length if self.is_initialized else query_length, 0

    def get_max_length(self) -> int:
        return -1

    def stored_elements(self) -> int:
        """Numbers this layer keeps for the request (for the compression ratio)."""
        return 0 if not self.is_initialized else self.keys.numel() + self.values.numel()


class MethodCache(Cache):
    """A transformers ``Cache`` of method layers plus the method it serves, the model's RoPE tables and a metrics
    dict (what the attention functions and ``KVMethod.metrics`` read)."""

    def __init__(self, layers: list[ExactLayer], cos: torch.Tensor, sin: torch.Tensor, method: KVMethod):
        super().__init__(layers=layers)
        self.method = method
        self.cos, self.sin = cos, sin
        self.metrics: dict[str, float] = {}
        self.prompt_len = 0

    def dense_elements(self) -> int:
        """What an uncompressed cache would hold now: 2 * layers * tokens * H_kv * d (times batch)."""
        return sum(
            2 * layer.seen * layer.keys.shape[0] * layer.keys.shape[1] * layer.keys.shape[-1]
            for layer in self.layers
            if layer.is_initialized
        )

    def stored_elements(self) -> int:
        return sum(layer.stored_elements() for layer in self.layers)


# ---- methods -----------------------------------------------------------------------------------------------------
_REGISTERED: set[str] = set()


def register_attention(name: str, fn: Callable) -> None:
    """``AttentionInterface.register`` once per process; the function receives ``attention_mask=None`` (no mask
    function is registered), so it applies bottom-right causal masking itself."""
    if name not in _REGISTERED:
        AttentionInterface.register(name, fn)
        _REGISTERED.add(name)


class KVMethod:
    """Dense baseline and base class of every method. A method overrides only these members:

    ``name`` (for logs), ``attn_implementation`` (a transformers name, or the name its ``attention_fn`` is
    registered under), ``attention_fn`` (None: a built-in implementation), ``make_layer``, ``after_prefill`` and
    ``metrics``; ``prepare`` / ``make_cache`` are the same for all."""

    name = "dense"
    attn_implementation = "sdpa"
    attention_fn: Callable | None = (
        None  # (module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    )

    def prepare(self, model) -> None:
        """Switch the model to this method's attention function (registered on first use)."""
        if self.attention_fn is not None:
            register_attention(self.attn_implementation, self.attention_fn)
        model.set_attn_implementation(self.attn_implementation)

    def make_layer(self, layer_idx: int, n_layers: int) -> ExactLayer:
        return ExactLayer(layer_idx)

    def make_cache(self, model, max_len: int) -> MethodCache:
        n = model.config.num_hidden_layers
        device = next(model.parameters()).device
        cos, sin = rope_tables(model, max_len, device)
        return MethodCache([self.make_layer(i, n) for i in range(n)], cos, sin, self)

    def after_prefill(self, cache: MethodCache) -> None:
        """Compress the prompt's K/V (called once, after the prefill forward; prefill attention stays exact)."""

    def metrics(self, cache: MethodCache) -> dict[str, float]:
        stored = cache.stored_elements()
        return {"compression_ratio": cache.dense_elements() / max(stored, 1), **cache.metrics}


def method_cache(kwargs: dict) -> MethodCache:
    """The request's ``MethodCache`` from an attention function's keywords."""
    cache = kwargs.get(CACHE_KWARG)
    if not isinstance(cache, MethodCache):
        raise ContractError(
            f"attention function called without a MethodCache under {CACHE_KWARG!r} (got {type(cache).__name__}): "
            "run the model through greedy_generate, or pass the method's cache as that keyword"
        )
    return cache


def dense_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """Bottom-right causal GQA attention in the AttentionInterface signature ([B, M, H, d] out)."""
    out = dense_causal_attention(query, key.to(query.dtype), value.to(query.dtype), scaling)
    return out.transpose(1, 2).contiguous(), None


# ---- generation: prefill, compress, query-after-compression, greedy decode --------------------------------------
def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def answer_from_cache(
    model,
    cache: MethodCache,
    logits: torch.Tensor,
    pos: int,
    query_ids: torch.Tensor | None,
    max_new_tokens: int,
    eos_token_id: int | None = None,
) -> tuple[list[int], float]:
    """After a prefill of ``pos`` tokens whose last logits are ``logits``: feed ``query_ids`` as one decode call
    through ``cache`` (compressed or not), then greedy-decode. Returns the tokens and the decode seconds (the
    query's call excluded)."""
    device = logits.device
    if query_ids is not None and query_ids.shape[1] > 0:
        out = model(
            input_ids=query_ids,
            cache=cache,
            use_cache=True,
            position_ids=torch.arange(pos, pos + query_ids.shape[1], device=device)[None],
            **{CACHE_KWARG: cache},
        )
        logits, pos = out.logits[:, -1], pos + query_ids.shape[1]
    tokens, t1 = [], time.perf_counter()
    for step in range(max_new_tokens):
        nxt = logits.argmax(-1, keepdim=True)
        tokens.append(int(nxt))
        if step == max_new_tokens - 1 or (eos_token_id is not None and int(nxt) == eos_token_id):
            break
        out = model(
            input_ids=nxt,
            cache=cache,
            use_cache=True,
            position_ids=torch.tensor([[pos]], device=device),
            **{CACHE_KWARG: cache},
        )
        logits, pos = out.logits[:, -1], pos + 1
    _sync(device)
    return tokens, time.perf_counter() - t1


@torch.no_grad()
def greedy_generate(
    model,
    method: KVMethod,
    context_ids: torch.Tensor,
    query_ids: torch.Tensor | None,
    max_new_tokens: int,
    eos_token_id: int | None = None,
) -> dict:
    """Prefill ``context_ids`` [1, L] through ``method``, compress, feed ``query_ids`` as one decode call through
    the compressed cache (the paper's multi-turn setting), then greedy-decode. Returns tokens, timings, metrics."""
    device = context_ids.device
    total = context_ids.shape[1] + (0 if query_ids is None else query_ids.shape[1]) + max_new_tokens + 1
    method.prepare(model)
    cache = method.make_cache(model, total)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    t0 = time.perf_counter()
    out = model(input_ids=context_ids, cache=cache, use_cache=True, **{CACHE_KWARG: cache})
    cache.prompt_len = context_ids.shape[1]
    method.after_prefill(cache)
    _sync(device)
    prefill_s = time.perf_counter() - t0
    tokens, decode_s = answer_from_cache(
        model, cache, out.logits[:, -1], context_ids.shape[1], query_ids, max_new_tokens, eos_token_id
    )
    decode_steps = max(len(tokens) - 1, 1)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else float("nan")
    return {
        "tokens": tokens,
        "first_logits": None,
        "prefill_ms": 1e3 * prefill_s,
        "decode_ms_per_token": 1e3 * decode_s / decode_steps,
        "peak_mem_mb": peak,
        "metrics": method.metrics(cache),
        "cache": cache,
    }
