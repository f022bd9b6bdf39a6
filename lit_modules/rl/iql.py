"""IQL (Kostrikov et al., "Offline Reinforcement Learning with Implicit Q-Learning", arXiv 2110.06169, Eqs.
5–7) losses, per sample where DARE needs them."""

from __future__ import annotations

import torch

from litlab.lit_modules.rl.nets import TanhGaussianActor, TwinCritic, ValueNet
from litlab.lit_modules.rl.sac import Batch


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """L₂^τ(u) = |τ − 1(u < 0)| u²."""
    return (expectile - (diff < 0).float()).abs() * diff.pow(2)


def value_loss(value: ValueNet, critic_target: TwinCritic, batch: Batch, expectile: float) -> torch.Tensor:
    """L_V = mean L₂^τ(min_k Q̄_k(s,a) − V(s))."""
    with torch.no_grad():
        q = critic_target(batch["obs"], batch["act"]).min(0).values
    return expectile_loss(q - value(batch["obs"]), expectile).mean()


def critic_loss(critic: TwinCritic, value: ValueNet, batch: Batch, gamma: float) -> torch.Tensor:
    """L_Q = Σ_k mean (r + γ (1 − term) V(s') − Q_k(s,a))²."""
    with torch.no_grad():
        target = batch["rew"] + gamma * (1.0 - batch["terminal"]) * value(batch["next_obs"])
    return (critic(batch["obs"], batch["act"]) - target).pow(2).mean(-1).sum()


def awr_loss_per_sample(
    actor: TanhGaussianActor,
    critic_target: TwinCritic,
    value: ValueNet,
    batch: Batch,
    beta: float,
    max_weight: float = 100.0,
) -> torch.Tensor:
    """ℓ_con = −min(exp(β (min_k Q̄_k(s,a) − V(s))), 100) · log π(a|s), shape [N]."""
    with torch.no_grad():
        adv = critic_target(batch["obs"], batch["act"]).min(0).values - value(batch["obs"])
        weight = torch.exp(beta * adv).clamp(max=max_weight)
    return -weight * actor.log_prob(batch["obs"], batch["act"])
