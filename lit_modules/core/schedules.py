"""Learning-rate schedules several methods share: a linear warm-up, then a cosine or linear decay.

``warmup_then_decay`` is the multiplier of the base learning rate at an optimizer step; ``warmup_then_decay_lr``
wraps it in a ``LambdaLR`` for ``configure_optimizers`` (stepped every optimizer step: ``"interval": "step"``).
What differs between methods (how many warm-up steps, the floor, cosine or linear) stays an argument, so each
method still states its paper's protocol where it builds the optimizer.
"""

from __future__ import annotations

import math
from typing import Literal

import torch


def warmup_then_decay(
    step: int,
    *,
    warmup_steps: int,
    total_steps: int,
    decay: Literal["cosine", "linear"] = "cosine",
    min_ratio: float = 0.0,
) -> float:
    """The learning-rate multiplier at optimizer step ``step`` (0-based).

    Warm-up: ``(step + 1) / warmup_steps`` for the first ``warmup_steps`` steps (none when 0), so the first step
    already moves. Decay: from 1 at the end of the warm-up to ``min_ratio`` at ``total_steps``, along half a cosine
    or a straight line; past ``total_steps`` it stays at ``min_ratio``.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - warmup_steps, 1)
    if decay == "cosine":
        progress = min(1.0, (step - warmup_steps) / decay_steps)
        remaining = 0.5 * (1 + math.cos(math.pi * progress))
    elif decay == "linear":
        remaining = max(0.0, (total_steps - step) / decay_steps)
    else:
        raise ValueError(f"decay={decay!r}: expected 'cosine' or 'linear'")
    return min_ratio + (1 - min_ratio) * remaining


def warmup_then_decay_lr(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    total_steps: int,
    decay: Literal["cosine", "linear"] = "cosine",
    min_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` over ``optimizer`` following ``warmup_then_decay``."""
    if decay not in ("cosine", "linear"):
        raise ValueError(f"decay={decay!r}: expected 'cosine' or 'linear'")

    # A plain function, not a callable object: LambdaLR then leaves it out of its state_dict, so a resumed run
    # rebuilds the schedule from its arguments (as the methods' own closures did) instead of loading stale ones.
    def multiplier(step: int) -> float:
        return warmup_then_decay(
            step, warmup_steps=warmup_steps, total_steps=total_steps, decay=decay, min_ratio=min_ratio
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
