"""NGT's reward nets (arXiv 2509.26294 and its released code, ``src/agents/nets.py``): a frozen random prior
f†, a trainable predictor f, the potential h(x) = criterion(f(x), f†(x)) (Huber, or HL-Gauss: Imani & White
2018; Farebrother et al., arXiv 2403.03950), and the reward shapings exp / symexp / linear."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrize

from litlab.lit_modules.rl.nets import leaky_relu_gain, mlp


def hl_gauss_targets(y: torch.Tensor, edges: torch.Tensor, sigma: float) -> torch.Tensor:
    """p_kj: mass of N(y_k, σ²) in bin j, normalised over [e_0, e_N] (+1e-6): y [B, m] -> [B, N_b, m]."""
    cdf = torch.erf((edges.view(1, -1, 1) - y.unsqueeze(1)) / (math.sqrt(2) * sigma))  # [B, N_b + 1, m]
    return (cdf[:, 1:] - cdf[:, :-1]) / ((cdf[:, -1] - cdf[:, 0]).unsqueeze(1) + 1e-6)


@torch.no_grad()
def freeze_spectral_norm(net: nn.Sequential, in_dim: int, iterations: int = 20) -> None:
    """Replace the spectral-norm parametrisation of a frozen net by its converged value W/σ(W).

    The released code re-runs one power iteration per forward of the frozen prior too. With the orthogonal
    init every singular value of each layer equals its gain, so σ is exact from the first iteration and W/σ
    never changes (measured: the prior's outputs move by 2e-7 over 200 training-mode forwards): computing it
    once gives the same function without three of the six power iterations of every potential forward."""
    net.train()
    for _ in range(iterations):
        net(torch.zeros(1, in_dim))
    for layer in net:
        if parametrize.is_parametrized(layer, "weight"):
            parametrize.remove_parametrizations(layer, "weight", leave_parametrized=True)


def released_mlp(in_dim: int, hidden: Sequence[int], out_dim: int, spectral_norm: bool) -> nn.Sequential:
    """The reward net as the released code builds it (``src/agents/nets.py``, ``RandomPredictor``): each linear
    layer is created (PyTorch's default init) and, with ``spectral_norm``, wrapped at once; the orthogonal init
    (gain √(2/(1+0.2²)), head 1) is applied afterwards. On a wrapped layer it writes into the computed W/σ, a
    temporary, so the stored weight keeps PyTorch's default init and only the biases become 0; without spectral
    norm it reaches the weights. The discarded orthogonal draws and the power iteration each access runs are
    reproduced, so one seed gives the released nets bit for bit (tests/test_official_ngt.py)."""
    sn = nn.utils.parametrizations.spectral_norm
    dims = [in_dim, *hidden, out_dim]
    layers: list[nn.Module] = []
    linears = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        linears.append(sn(nn.Linear(a, b)) if spectral_norm else nn.Linear(a, b))
        layers += [linears[-1], *([nn.LeakyReLU(0.2)] if i < len(dims) - 2 else [])]
    for i, lin in enumerate(linears):
        nn.init.orthogonal_(lin.weight, gain=1.0 if i == len(linears) - 1 else leaky_relu_gain(0.2))
        nn.init.zeros_(lin.bias)
    return nn.Sequential(*layers)


class RandomPriorPotential(nn.Module):
    def __init__(
        self,
        in_dim: int,
        hidden: Sequence[int] = (128, 128, 128),
        out_dim: int = 64,
        criterion: str = "huber",
        hlg_radius: float = 3.0,
        hlg_bins: int = 21,
        hlg_sigma_ratio: float = 1.5,
        prior_spectral_norm: bool = True,
        predictor_spectral_norm: bool = True,
        prior_seed: int | None = None,
        prior_init: str = "orthogonal",
    ):
        """``prior_seed``: the frozen prior f† is drawn from a generator seeded so (NGT passes the run's
        ``prior`` stream), leaving torch's global generator to the predictor; None: both from the global one.
        ``prior_init``: ``orthogonal`` (the paper's SN + orthogonal-init argument: every layer orthogonal, then
        spectrally normalised; the frozen prior's W/σ computed once, ``freeze_spectral_norm``) or ``released``
        (what the released code runs, ``released_mlp``: the spectrally normalised nets, prior and predictor, keep
        PyTorch's default init divided by σ, and the prior keeps power-iterating at every training-mode forward;
        its outputs are ~7x smaller)."""
        super().__init__()
        if criterion not in ("huber", "hl_gauss"):
            raise ValueError(f"criterion={criterion!r} is not one of huber, hl_gauss")
        if prior_init not in ("orthogonal", "released"):
            raise ValueError(f"prior_init={prior_init!r} is not one of orthogonal, released")
        self.criterion, self.out_dim = criterion, out_dim
        gain = leaky_relu_gain(0.2)  # orthogonal init, gain √(2/(1+0.2²)) ≈ 1.3868, head gain 1
        kw = dict(activation="leaky_relu", orthogonal_gain=gain, head_gain=1.0)
        released = prior_init == "released"
        with torch.random.fork_rng(devices=[], enabled=prior_seed is not None):
            if prior_seed is not None:
                torch.manual_seed(prior_seed)
            if released:
                self.prior = released_mlp(in_dim, hidden, out_dim, prior_spectral_norm)
            else:
                self.prior = mlp(in_dim, hidden, out_dim, spectral_norm=prior_spectral_norm, **kw)
                if prior_spectral_norm:
                    freeze_spectral_norm(self.prior, in_dim)
        self.prior.requires_grad_(False)
        head = out_dim * hlg_bins if criterion == "hl_gauss" else out_dim
        if released:
            self.predictor = released_mlp(in_dim, hidden, head, predictor_spectral_norm)
        else:
            self.predictor = mlp(in_dim, hidden, head, spectral_norm=predictor_spectral_norm, **kw)
        self.register_buffer("edges", torch.linspace(-hlg_radius, hlg_radius, hlg_bins + 1))
        self.hlg_bins, self.hlg_sigma = hlg_bins, hlg_sigma_ratio * 2 * hlg_radius / hlg_bins

    def potential(self, x: torch.Tensor) -> torch.Tensor:
        """h(x) [B, 1]: (1/m) Σ_k Huber_δ=1(f_k(x) − f†_k(x)), or (1/m) Σ_k CE(logits_·k, p_·k) for
        HL-Gauss."""
        with torch.no_grad():
            y = self.prior(x)
        out = self.predictor(x)
        if self.criterion == "huber":
            return F.huber_loss(out, y, reduction="none", delta=1.0).mean(-1, keepdim=True)
        logits = out.view(len(x), self.hlg_bins, self.out_dim)  # flat index j·m + k: bins-major
        target = hl_gauss_targets(y, self.edges, self.hlg_sigma)
        return -(target * logits.log_softmax(1)).sum(1).mean(-1, keepdim=True)


class RewardShaper(nn.Module):
    """r(h): ``exp`` = exp(−h) ∈ (0, 1]; ``symexp`` (released code's default) = −sign(u)(e^|u| − 1) clipped to
    ±5 with u = (h − q50) / max(q95 − q05, 1e-10) from EMAs (rate 0.001) of batch quantiles, read *before*
    this batch updates them; ``linear`` = −u clipped to ±5."""

    def __init__(self, mode: str = "symexp", ema_rate: float = 0.001, clip: float = 5.0):
        super().__init__()
        if mode not in ("exp", "symexp", "linear"):
            raise ValueError(f"reward_shaping={mode!r} is not one of exp, symexp, linear")
        self.mode, self.rate, self.clip = mode, ema_rate, clip
        self.register_buffer("quantiles", torch.zeros(3))  # EMA of q05, q50, q95
        self.register_buffer("initialised", torch.tensor(False))

    @torch.no_grad()
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.mode == "exp":
            return torch.exp(-h)
        batch_q = torch.quantile(h.flatten(), torch.tensor([0.05, 0.5, 0.95], device=h.device))
        if not bool(self.initialised):
            self.quantiles.copy_(batch_q)
            self.initialised.fill_(True)
        q05, q50, q95 = self.quantiles.clone()
        self.quantiles.lerp_(batch_q, self.rate)
        u = (h - q50) / torch.clamp(q95 - q05, min=1e-10)
        r = -u if self.mode == "linear" else -torch.sign(u) * torch.expm1(u.abs())
        return r.clamp(-self.clip, self.clip)
