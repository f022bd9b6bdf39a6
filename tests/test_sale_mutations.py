"""Mutation test for the SALE card's mechanism claim ``skips_blocks`` (seeds/sale.yaml: ``sale_t01:val/density
<= 0.5``): a plausible wrong implementation of the 4-bit estimate must push the measured density over the bound,
while the real implementation stays under it (issue 28: a mechanism claim stays only if it can fail)."""

from __future__ import annotations

import pytest
import torch

import litlab.lit_modules.longctx.sale as sale
from litlab.kernels.block_select import smooth_quantize
from litlab.lit_modules.core.models import tiny_llama
from litlab.lit_modules.longctx.kv_cache import greedy_generate

TAU, BOUND = 0.1, 0.5  # the card's sale_t01 and skips_blocks' target
CARD_BLOCKS = sale.SALEConfig(16, 16, 32, 32, 4, "reference")  # configs/sale/quick.yaml's geometry


def _codes_without_scales(q, k, bits: int = 4, quant_mode: int = 2, block_k: int = 32):
    """The bug: the dequantisation scales dropped, so the estimate is <Qi, Ki> + c in integer-code units."""
    k_s, qi, ki, sq, sk, c = smooth_quantize(q, k, bits, quant_mode, block_k)
    return k_s, qi, ki, torch.ones_like(sq), torch.ones_like(sk), c


def _synthetic_density() -> float:
    q, k, _ = (t[None] for t in sale.sink_needle_inputs())
    mask, _ = sale.sale_block_mask(q, k, TAU, CARD_BLOCKS)
    return sale.block_density(mask, q.shape[2], CARD_BLOCKS.block_q, CARD_BLOCKS.block_k)


def _model_density() -> float:
    """The density the card's runs log (``val/density``), through SALEMethod on a 256-token prompt (a randomly
    initialised 4-layer Llama: the card's trained passkey models take minutes to build)."""
    torch.manual_seed(0)
    model = tiny_llama(vocab_size=128, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2).eval()
    ids = torch.randint(0, 128, (1, 256), generator=torch.Generator().manual_seed(0))
    method = sale.SALEMethod("sale", CARD_BLOCKS, TAU, min_seq_len=0)
    return float(greedy_generate(model, method, ids, None, 1)["metrics"]["density"])


@pytest.mark.parametrize("measure", [_synthetic_density, _model_density], ids=["sink_needles", "tiny_llama"])
def test_density_exceeds_half_when_the_estimate_skips_its_scales(measure, monkeypatch):
    real = measure()
    assert real <= BOUND, real  # the implementation satisfies skips_blocks
    monkeypatch.setattr(sale, "smooth_quantize", _codes_without_scales)
    broken = measure()
    assert broken > BOUND, broken  # the broken estimate keeps (nearly) every block: skips_blocks fails


def test_skips_blocks_2k_fails_when_the_estimate_skips_its_scales(monkeypatch):
    """The medium scale's ``skips_blocks_2k`` (``sale_2k:val/density <= 0.5``): configs/sale/medium.yaml's
    geometry (the official 64x32 blocks, local 128, segment 128, quant_mode 2; the runs select with the int8 CPU
    kernel, whose masks match this reference's up to fp32 rounding) on the synthetic inputs at 2048 tokens, one head."""
    medium = sale.SALEConfig(quant_mode=2, impl="reference")  # the int8 path's mask, without its compile
    q, k, _ = (t[None] for t in sale.sink_needle_inputs(H=1, N=2048))

    def density() -> float:
        return sale.block_density(sale.sale_block_mask(q, k, TAU, medium)[0], 2048, 64, 32)

    real = density()
    assert real <= BOUND, real
    monkeypatch.setattr(sale, "smooth_quantize", _codes_without_scales)
    broken = density()
    assert broken > BOUND, broken
