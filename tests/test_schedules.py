"""``core.schedules``: the one warm-up + decay schedule gives, step by step and to the last bit, the multipliers of
the four schedules it replaced (LoRDO, the structured LM, DiffRact's CPT, LoKrA's DoRA protocol), kept below as
they were written in those methods before the move."""

from __future__ import annotations

import math

import pytest
import torch

from litlab.lit_modules.core.schedules import warmup_then_decay, warmup_then_decay_lr


def old_lordo_and_structured_lm(warmup_steps: int, min_lr_ratio: float, total: int):
    def warmup_cosine(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(total - warmup_steps, 1))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return warmup_cosine


def old_diffract(warmup_frac: float, total: int):
    warm = max(int(round(warmup_frac * total)), 1)

    def warmup_cosine(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / max(total - warm, 1))))

    return warmup_cosine, warm


def old_lokra(warmup_steps: int, total: int):
    warm = min(warmup_steps, total)

    def linear_warmup_decay(step: int) -> float:
        return (step + 1) / max(warm, 1) if step < warm else max(0.0, (total - step) / max(total - warm, 1))

    return linear_warmup_decay, warm


TOTALS = [1, 2, 3, 7, 20, 100, 1000, 4097]


@pytest.mark.parametrize("total", TOTALS)
@pytest.mark.parametrize("warmup_steps", [0, 1, 5, 20, 200, 5000])
@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.1, 1 / 3, 0.05])
def test_cosine_matches_lordo_and_structured_lm(total, warmup_steps, min_lr_ratio):
    old = old_lordo_and_structured_lm(warmup_steps, min_lr_ratio, total)
    for step in range(total + 3):  # a few steps past the end: the floor holds
        new = warmup_then_decay(
            step, warmup_steps=warmup_steps, total_steps=total, decay="cosine", min_ratio=min_lr_ratio
        )
        assert new == old(step), (step, new, old(step))


@pytest.mark.parametrize("total", TOTALS)
@pytest.mark.parametrize("warmup_frac", [0.0, 0.05, 0.1, 0.5, 1.0])
def test_cosine_matches_diffract(total, warmup_frac):
    old, warm = old_diffract(warmup_frac, total)
    for step in range(total + 3):
        new = warmup_then_decay(step, warmup_steps=warm, total_steps=total, decay="cosine")
        assert new == old(step), (step, new, old(step))


@pytest.mark.parametrize("total", TOTALS)
@pytest.mark.parametrize("warmup_steps", [0, 1, 30, 100, 5000])
def test_linear_matches_lokra(total, warmup_steps):
    old, warm = old_lokra(warmup_steps, total)
    for step in range(total + 3):
        new = warmup_then_decay(step, warmup_steps=warm, total_steps=total, decay="linear")
        assert new == old(step), (step, new, old(step))


def test_shape():
    at = lambda s, **kw: warmup_then_decay(s, warmup_steps=4, total_steps=12, **kw)  # noqa: E731
    assert [at(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert at(4) == 1.0 and at(8) == pytest.approx(0.5) and at(12) == pytest.approx(0.0)
    assert at(8, decay="linear") == pytest.approx(0.5) and at(12, decay="linear") == 0.0
    assert at(12, min_ratio=0.1) == pytest.approx(0.1) and at(50, min_ratio=0.1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="decay"):
        at(5, decay="step")


def test_lambda_lr_steps_the_optimizer_and_keeps_no_state_of_its_own():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=2.0)
    sched = warmup_then_decay_lr(opt, warmup_steps=3, total_steps=10, min_ratio=0.1)
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [2.0 * warmup_then_decay(s, warmup_steps=3, total_steps=10, min_ratio=0.1) for s in range(12)]
    assert seen == pytest.approx(expected, rel=0, abs=1e-15)
    # a plain function: LambdaLR stores None for it, as it did for the methods' closures
    assert sched.state_dict()["lr_lambdas"] == [None]
    with pytest.raises(ValueError, match="decay"):
        warmup_then_decay_lr(opt, warmup_steps=1, total_steps=2, decay="exp")
