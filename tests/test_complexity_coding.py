"""Task complexity (analysis family): the bit accounting against closed forms (spec checks §7.1-7.4, §7.6; the
strategies and module: test_task_complexity)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from litlab.lit_modules.analysis import complexity_coding as TC
from litlab.lit_modules.core.models import TinyGPT


def _model_probs():
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=97, d_model=16, n_layers=1, n_heads=2, block_size=32).eval().double()

    def probs(prefix):
        with torch.no_grad():
            return torch.softmax(model(torch.tensor([list(prefix)]))[0, -1], -1)

    return probs


def test_arithmetic_code_length_matches_the_log_loss_and_decodes_exactly():  # §7.1
    probs = _model_probs()
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        tokens = torch.randint(0, 97, (30,), generator=g).tolist()
        low, width, bits = TC.arithmetic_encode(tokens, probs)
        logp = torch.stack([probs(tokens[:j])[tokens[j]].log() for j in range(1, 30)])
        ideal = TC.code_length_bits(logp)
        assert abs(math.ceil(-math.log2(width)) - math.ceil(ideal)) <= 1
        assert bits <= math.ceil(-math.log2(width)) + 1
        value = TC.arithmetic_code_value(low, bits)
        assert low <= value < low + width
        assert TC.arithmetic_decode(value, tokens[0], 30, probs) == tokens


def test_uniform_model_prompt_payload():  # §7.2
    V, n = 97, 25
    logp = torch.full((n,), -math.log(V), dtype=torch.float64)  # all-zero logits
    assert TC.prompt_payload_bits(logp) == math.ceil((n - 1) * math.log2(V)) == TC.uniform_prompt_bits(n, V)
    low, width, _ = TC.arithmetic_encode(
        list(range(n)), lambda prefix: torch.full((V,), 1.0 / V, dtype=torch.float64)
    )
    assert abs(-math.log2(width) - (n - 1) * math.log2(V)) < 1e-6


def test_lora_bit_accounting():  # §7.3 (the accounting part)
    A, B = torch.zeros(2, 64), torch.zeros(48, 2)
    assert TC.lora_payload_bits([A, B]) == 16 * 2 * (64 + 48)


def test_quantiser_and_kt_code_invariants():  # §7.4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, generator=g, dtype=torch.float64)
    _, deq = TC.quantize_uniform(x, 16)
    assert float((deq - x).abs().max()) <= float(x.max() - x.min()) / 65535
    for K, n in [(4, 50), (256, 300)]:
        expected = 64 + sum(-math.log2((t - 0.5) / (t - 1 + K / 2)) for t in range(1, n + 1))
        assert TC.kt_code_bits([3] * n, K) == pytest.approx(expected, abs=1e-9)
    for seed in range(20):
        b = 1 + seed % 6
        K, n = 2**b, 400
        sym = torch.randint(0, K, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
        assert TC.kt_code_bits(sym, K) <= n * b + 64 + (K / 2) * math.log2(n) + b + 2
    assert TC.bayesian_bits_width(1, 1, 1, 1) == 32 and TC.bayesian_bits_width(0, 1, 1, 1) == 2
    assert {TC.bayesian_bits_width(*z) for z in [(1, 0, 0, 0), (1, 1, 0, 0), (1, 1, 1, 0)]} == {4, 8, 16}
    assert TC.lora_q_payload_bits([torch.ones(10)], 2) == math.ceil(TC.kt_code_bits([0] * 10, 4))


def test_prequential_bits_sum_per_batch_ceilings():
    lp = [
        torch.full((3,), -math.log(2.0), dtype=torch.float64),
        torch.full((2,), -math.log(4.0), dtype=torch.float64),
    ]
    assert TC.prequential_bits(lp) == 3 + 4


def test_frontier_complexity_and_reduction_on_hand_made_points():  # §7.6
    pre = [(100, 0.1), (50, 0.2), (400, 0.5), (800, 0.4), (1600, 0.6), (10, 0.0), (200, 0.15), (3200, 0.6)]
    front = TC.pareto_frontier(pre)
    assert front == [(10, 0.0), (50, 0.2), (400, 0.5), (1600, 0.6)]
    assert all(a[0] <= b[0] and a[1] < b[1] for a, b in zip(front, front[1:]))
    assert TC.complexity(pre, 0.45) == 400 and TC.complexity(pre, 0.7) == math.inf
    post = [(8, 0.3), (40, 0.6)]
    assert TC.reduction(pre, post) == pytest.approx(1600 / 40)
    assert Fraction(1, 2) == TC.arithmetic_code_value(Fraction(1, 3), 1)
