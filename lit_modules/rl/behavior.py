"""Behaviour models fitted on the offline data (DARE, arXiv 2511.03828): a tanh-Gaussian (density, cheap) and
a small conditional DDPM (Ho et al., arXiv 2006.11239; ε-prediction, T denoising steps), the paper's family,
without its energy guidance."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from litlab.lit_modules.rl.nets import TanhGaussianActor, mlp


class GaussianBehavior(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int] = (256, 256)):
        super().__init__()
        self.policy = TanhGaussianActor(obs_dim, act_dim, hidden)

    def loss(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return -self.policy.log_prob(obs, act).mean()

    def log_prob(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.policy.log_prob(obs, act)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, k: int) -> torch.Tensor:
        """Reference actions [K, N, d_a]: the behaviour mean for K = 1 (the cheap CPU
        choice), K samples otherwise."""
        if k == 1:
            return self.policy.mode(obs).unsqueeze(0)
        return torch.stack([self.policy.sample(obs)[0] for _ in range(k)])


class DiffusionBehavior(nn.Module):
    """ε_b(a_t, t, s) with a linear β schedule over ``n_steps`` and a sinusoidal t-embedding."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256, 256),
        n_steps: int = 5,
        t_dim: int = 16,
    ):
        super().__init__()
        self.act_dim, self.n_steps, self.t_dim = act_dim, n_steps, t_dim
        self.eps = mlp(obs_dim + act_dim + t_dim, hidden, act_dim, activation="silu")
        betas = torch.linspace(1e-4, 0.5 if n_steps <= 10 else 0.02 * 1000 / n_steps, n_steps).clamp(
            max=0.999
        )
        self.register_buffer("betas", betas)
        self.register_buffer("alpha_bar", torch.cumprod(1 - betas, 0))

    def _t_embed(self, t: torch.Tensor) -> torch.Tensor:
        freqs = torch.exp(
            -math.log(1000) * torch.arange(self.t_dim // 2, device=t.device) / (self.t_dim // 2)
        )
        x = t.float().unsqueeze(-1) * freqs
        return torch.cat([x.sin(), x.cos()], -1)

    def _eps(self, obs: torch.Tensor, a_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.eps(torch.cat([obs, a_t, self._t_embed(t)], -1))

    def loss(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """‖ε − ε_b(√ᾱ_t a + √(1−ᾱ_t) ε, t, s)‖²."""
        t = torch.randint(0, self.n_steps, (len(obs),), device=obs.device)
        noise = torch.randn_like(act)
        ab = self.alpha_bar[t].unsqueeze(-1)
        return (self._eps(obs, ab.sqrt() * act + (1 - ab).sqrt() * noise, t) - noise).pow(2).mean()

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, k: int) -> torch.Tensor:
        """DDPM ancestral sampling, [K, N, d_a], clipped to [−1, 1]."""
        obs_k = obs.repeat(k, 1)
        a = torch.randn(len(obs_k), self.act_dim, device=obs.device)
        for t in reversed(range(self.n_steps)):
            tt = torch.full((len(obs_k),), t, device=obs.device)
            beta, ab = self.betas[t], self.alpha_bar[t]
            a = (a - beta / (1 - ab).sqrt() * self._eps(obs_k, a, tt)) / (1 - beta).sqrt()
            if t > 0:
                a = a + beta.sqrt() * torch.randn_like(a)
        return a.clamp(-1, 1).reshape(k, len(obs), self.act_dim)
