"""SAC losses (Haarnoja et al. 2018), written once and used by every RL module and by the plain-PyTorch loop
of the data factory. Each function returns a loss; callers own the optimisers (manual optimisation in
Lightning, ``SACAgent.update`` in plain PyTorch), and recompute each loss after the previous optimiser
step."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from litlab.lit_modules.rl.nets import TanhGaussianActor, TwinCritic

Batch = dict[str, torch.Tensor]  # obs, act, rew, next_obs, terminal (float) — all [B, ·]


def critic_loss(
    critic: TwinCritic,
    critic_target: TwinCritic,
    actor: TanhGaussianActor,
    batch: Batch,
    reward: torch.Tensor,
    alpha: torch.Tensor | float,
    gamma: float,
    backup_entropy: bool = True,
) -> torch.Tensor:
    """Σ_k mean (Q_k(s,a) − y)², y = r + γ (1 − term) (min_k Q̄_k(s', a') − α log π(a'|s')), a' ~ π(·|s')."""
    with torch.no_grad():
        next_act, next_logp = actor.sample(batch["next_obs"])
        next_q = critic_target(batch["next_obs"], next_act).min(0).values
        if backup_entropy:
            next_q = next_q - alpha * next_logp
        target = reward + gamma * (1.0 - batch["terminal"]) * next_q
    q = critic(batch["obs"], batch["act"])
    return (q - target).pow(2).mean(-1).sum()


def actor_loss_per_sample(
    actor: TanhGaussianActor, critic: TwinCritic, obs: torch.Tensor, alpha: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """α log π(ã|s) − min_k Q_k(s, ã), ã ~ π(·|s) reparameterised: ``([B], log π [B])``."""
    act, logp = actor.sample(obs)
    return alpha * logp - critic(obs, act).min(0).values, logp


def temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float) -> torch.Tensor:
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


@torch.no_grad()
def polyak_update(net: nn.Module, target: nn.Module, tau: float) -> None:
    for p, tp in zip(net.parameters(), target.parameters()):
        tp.lerp_(p, tau)


class SACAgent(nn.Module):
    """Actor, twin critic (+ Polyak target) and learned temperature, with a plain-PyTorch ``update``.

    ``update`` is the reference SAC step: the Lightning modules run the same three losses under manual
    optimisation, and ``benchmark_loops`` compares the two loops' env-steps per second.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        lr: float = 3e-4,
        gamma: float = 0.99,
        polyak: float = 0.005,
        alpha_init: float = 0.2,
        layer_norm: bool = False,
    ):
        super().__init__()
        self.actor = TanhGaussianActor(obs_dim, act_dim, hidden)
        self.critic = TwinCritic(obs_dim, act_dim, hidden, layer_norm=layer_norm)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(float(alpha_init)).log())
        self.gamma, self.polyak, self.target_entropy = gamma, polyak, -float(act_dim)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=lr)
        self.opt_actor = torch.optim.Adam(self.actor.parameters(), lr=lr)
        self.opt_alpha = torch.optim.Adam([self.log_alpha], lr=lr)

    def update(self, batch: Batch) -> dict[str, float]:
        alpha = self.log_alpha.exp().detach()
        loss_q = critic_loss(
            self.critic, self.critic_target, self.actor, batch, batch["rew"], alpha, self.gamma
        )
        self.opt_critic.zero_grad(set_to_none=True)
        loss_q.backward()
        self.opt_critic.step()
        loss_pi, logp = actor_loss_per_sample(self.actor, self.critic, batch["obs"], alpha)
        loss_alpha = temperature_loss(self.log_alpha, logp, self.target_entropy)
        self.opt_actor.zero_grad(set_to_none=True)
        self.opt_alpha.zero_grad(set_to_none=True)
        # α is detached in the actor loss, log π in the temperature loss: disjoint gradients, one backward
        # (bit for bit the two separate ones)
        (loss_pi.mean() + loss_alpha).backward()
        self.opt_actor.step()
        self.opt_alpha.step()
        polyak_update(self.critic, self.critic_target, self.polyak)
        return {"critic": float(loss_q), "actor": float(loss_pi.mean()), "alpha": float(alpha)}
