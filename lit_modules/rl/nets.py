"""Networks of the RL core: MLP builder (LayerNorm / spectral norm / orthogonal init), tanh-Gaussian actor,
twin critic, state-value net, running observation normaliser."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributions import Normal

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "leaky_relu": lambda: nn.LeakyReLU(0.2),
}


def mlp(
    in_dim: int,
    hidden: Sequence[int],
    out_dim: int,
    *,
    activation: str = "relu",
    layer_norm: bool = False,
    spectral_norm: bool = False,
    orthogonal_gain: float | None = None,
    head_gain: float | None = None,
) -> nn.Sequential:
    """``in -> hidden... -> out``. ``orthogonal_gain`` initialises hidden layers orthogonally (biases 0) and
    the head with ``head_gain`` (default 1); spectral norm (1 power iteration per forward) wraps every linear
    layer."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {sorted(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden]
    linears = []
    for a, b in zip(dims[:-1], dims[1:]):
        linears.append(nn.Linear(a, b))
        layers += [linears[-1], *([nn.LayerNorm(b)] if layer_norm else []), ACTIVATIONS[activation]()]
    head = nn.Linear(dims[-1], out_dim)
    layers.append(head)
    if orthogonal_gain is not None or head_gain is not None:
        for lin in linears:
            nn.init.orthogonal_(lin.weight, gain=orthogonal_gain if orthogonal_gain is not None else 1.0)
            nn.init.zeros_(lin.bias)
        nn.init.orthogonal_(head.weight, gain=head_gain if head_gain is not None else 1.0)
        nn.init.zeros_(head.bias)
    if spectral_norm:
        for i, layer in enumerate(layers):
            if isinstance(layer, nn.Linear):
                layers[i] = nn.utils.parametrizations.spectral_norm(layer, n_power_iterations=1)
    return nn.Sequential(*layers)


def leaky_relu_gain(slope: float = 0.2) -> float:
    return math.sqrt(2.0 / (1.0 + slope**2))


class TanhGaussianActor(nn.Module):
    """π(a|s) = tanh(N(μ(s), σ(s))); log σ = −5 + 3.5 (tanh(raw) + 1) ∈ [−5, 2] (NGT's code, bounded and
    smooth)."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        layer_norm: bool = False,
        activation: str = "relu",
        head_gain: float | None = None,
    ):
        super().__init__()
        self.net = mlp(
            obs_dim,
            hidden,
            2 * act_dim,
            activation=activation,
            layer_norm=layer_norm,
            orthogonal_gain=math.sqrt(2) if head_gain is not None else None,
            head_gain=head_gain,
        )

    def dist(self, obs: torch.Tensor) -> Normal:
        mean, raw = self.net(obs).chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1)
        return Normal(mean, log_std.exp())

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised action and its log-probability ``[B]`` (tanh change of variables)."""
        d = self.dist(obs)
        u = d.rsample()
        a = torch.tanh(u)
        return a, (d.log_prob(u) - 2 * (math.log(2) - u - nn.functional.softplus(-2 * u))).sum(-1)

    def log_prob(self, obs: torch.Tensor, act: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
        """log π(a|s) of given actions in [−1, 1] (clamped to ±(1−eps) so boundary actions stay finite)."""
        a = act.clamp(-1 + eps, 1 - eps)
        u = torch.atanh(a)
        return (self.dist(obs).log_prob(u) - torch.log1p(-a.pow(2))).sum(-1)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dist(obs).mean)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self.mode(obs) if deterministic else self.sample(obs)[0]


class TwinCritic(nn.Module):
    """Q_1, Q_2 (s, a) -> ``[2, B]``."""

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        layer_norm: bool = False,
        activation: str = "relu",
        head_gain: float | None = None,
    ):
        super().__init__()
        kw = dict(
            activation=activation,
            layer_norm=layer_norm,
            head_gain=head_gain,
            orthogonal_gain=math.sqrt(2) if head_gain is not None else None,
        )
        self.q1 = mlp(obs_dim + act_dim, hidden, 1, **kw)
        self.q2 = mlp(obs_dim + act_dim, hidden, 1, **kw)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, act], -1)
        return torch.stack([self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)])


class ValueNet(nn.Module):
    def __init__(self, obs_dim: int, hidden: Sequence[int] = (256, 256), layer_norm: bool = False):
        super().__init__()
        self.net = mlp(obs_dim, hidden, 1, layer_norm=layer_norm)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)


class RunningNorm(nn.Module):
    """Running mean/std of observations (parallel-variance update); buffers, so it is saved with the
    checkpoint."""

    def __init__(self, dim: int, clip: float = 10.0):
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(dim, dtype=torch.float64))
        self.register_buffer("var", torch.ones(dim, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, self.mean.numel()).double()
        n, m, v = x.shape[0], x.mean(0), x.var(0, unbiased=False)
        delta, total = m - self.mean, self.count + n
        self.mean += delta * n / total
        self.var = (self.var * self.count + v * n + delta.pow(2) * self.count * n / total) / total
        self.count = total

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean.float()) / (self.var.float().sqrt() + 1e-8)).clamp(-self.clip, self.clip)
