"""xKV's accuracy-vs-compression curve (litlab.lit_modules.longctx.xkv_curve): every budget of one prefill answers
exactly as its own run would, the ranks meet the target compression ratio, and the near-dense reading."""

from __future__ import annotations

import pytest
import torch

from litlab.datamodules.long_context import LongContextDataModule
from litlab.lit_modules.longctx.harness import EvalSettings
from litlab.lit_modules.longctx.kv_cache import KVMethod, greedy_generate
from litlab.lit_modules.longctx.report import curve_table
from litlab.lit_modules.longctx.xkv import XKV, CompressionPlan, MiniCache, compression_ratio
from litlab.lit_modules.longctx.xkv_curve import (
    CurveBudgets,
    XKVCurveModule,
    curve_metrics,
    ranks_for_ratio,
)


@pytest.mark.parametrize("group_size", [1, 4])
@pytest.mark.parametrize("target", [2.0, 4.0, 8.0, 16.0])
def test_ranks_meet_the_target_compression_ratio(group_size, target):
    # SmolLM2-135M's geometry (30 layers, 3 KV heads of 64) at a ~2K-token prompt: only rounding separates them
    r_k, r_v = ranks_for_ratio(target, 30, 2035, 3, 64, group_size, 1.5)
    assert r_v == round(1.5 * r_k)
    cr = compression_ratio(30, 2035, 3, 64, group_size, r_k, r_v)
    assert abs(cr - target) / target < 0.05
    with pytest.raises(ValueError, match="target_cr=0.5"):
        ranks_for_ratio(0.5, 30, 2035, 3, 64, group_size, 1.5)


def test_near_dense_is_the_highest_ratio_within_tolerance():
    points = [("svd", 2.0), ("svd", 4.0), ("svd", 8.0), ("minicache", None)]
    answers = {
        "dense": [(1.0, 1.0)] * 4,
        "svd_cr2": [(1.0, 2.0)] * 4,
        "svd_cr4": [(1.0, 4.0)] * 3 + [(0.0, 4.0)],  # 0.75: 25 points below dense
        "svd_cr8": [(1.0, 8.0)] * 4,  # a higher budget that keeps accuracy counts, whatever lies between
        "minicache": [(0.0, 1.3)] * 4,
    }
    out = curve_metrics(answers, points, tolerance=0.01)
    assert out["acc_dense"] == 1.0 and out["svd_cr4_acc"] == 0.75 and out["svd_cr8_cr"] == 8.0
    assert out["svd_cr_near_dense"] == 8.0 and out["minicache_cr_near_dense"] == 1.0
    assert curve_metrics(answers, points, tolerance=0.3)["minicache_cr_near_dense"] == 1.0
    answers["svd_cr8"] = [(0.0, 8.0)] * 4
    assert curve_metrics(answers, points, tolerance=0.3)["svd_cr_near_dense"] == 4.0


def test_every_budget_answers_as_its_own_run(monkeypatch):
    """One prefill, copies compressed per budget, SVDs shared across budgets: the same tokens and compression ratio
    as a separate greedy_generate run of each method (a random 4-layer Llama: the computation, not the accuracy, is
    compared; 3 prompts of run seed 0, 3 greedy tokens)."""
    from litlab.lit_modules.core.models import tiny_llama
    from litlab.lit_modules.longctx import harness

    torch.manual_seed(0)
    model = tiny_llama(vocab_size=128, num_layers=4, max_positions=512).eval()
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    monkeypatch.setattr(harness, "load_frozen_lm", lambda lm: (model, None))
    curve = CurveBudgets(target_crs=(4.0, 8.0, 16.0), group_size=2, v_to_k=1.5, minicache_start_layer=2)
    module = XKVCurveModule(curve=curve, evaluation=EvalSettings(max_new_tokens=3))
    answered: list[list[int]] = []  # the tokens of every point, in the order the module answers them
    monkeypatch.setattr(module, "answer_correct", lambda item, tokens: answered.append(tokens) or False)
    cfg = model.config
    for item in LongContextDataModule(lengths=[256], num_prompts=3).prompts("val"):
        answered.clear()
        got = module.answer_curve(item)
        ctx, query = item["context_ids"][None], item["query_ids"][None]
        expected = {"dense": KVMethod()}
        for family, g in (("svd", 1), ("xkv", 2)):
            for c in curve.target_crs:
                r_k, r_v = ranks_for_ratio(c, cfg.num_hidden_layers, ctx.shape[1], 2, 16, g, 1.5)
                expected[f"{family}_cr{c:g}"] = XKV(CompressionPlan(group_size=g, rank_k=r_k, rank_v=r_v))
        expected["minicache"] = MiniCache(2, -1)
        assert list(got) == list(expected)
        for (point, method), tokens in zip(expected.items(), answered, strict=True):
            res = greedy_generate(model, method, ctx, query, 3)
            assert tokens == res["tokens"], point
            assert got[point][1] == pytest.approx(res["metrics"]["compression_ratio"]), point
        assert len({tuple(t) for t in answered}) > 1  # the budgets change the answer: a test that can fail


def test_report_draws_each_family_once():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fit = {"val/acc_dense": 0.9, "val/svd_cr2_acc": 0.8, "val/svd_cr2_cr": 1.98, "val/svd_cr_near_dense": 1.0}
    fit |= {"val/minicache_acc": 0.1, "val/minicache_cr": 1.3, "val/minicache_cr_near_dense": 1.0}
    method = {
        "val/acc_dense": 0.9,
        "val/xkv_cr2_acc": 0.9,
        "val/xkv_cr2_cr": 1.99,
        "val/xkv_cr_near_dense": 1.99,
    }
    fig, ax = plt.subplots()
    numbers: dict[str, float] = {}
    lines = curve_table({"dense_m": fit, "svd_m": fit, "xkv_m": method}, ax, numbers)
    plt.close(fig)
    assert (
        numbers["xkv_cr_near_dense"] == 1.99 and numbers["svd_cr2_acc"] == 0.8 and numbers["acc_dense"] == 0.9
    )
    assert sum("| svd |" in line for line in lines) == 1 and len(ax.lines) == 3
    assert torch.isfinite(torch.tensor(list(numbers.values()))).all()
