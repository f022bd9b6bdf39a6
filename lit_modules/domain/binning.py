"""Discretised densities of continuous labels in [0, 1]: bins, histograms, their mode, support and entropy.

``B`` equal-width bins on [0, 1], width Δ = 1/B, centres c_b = (b + ½)Δ. Every function works on the last axis
(values ``v`` of any shape; histograms ``h`` of shape (..., B)).

* ``soft_bin(v, B, σ)``     κ(v)_b = softmax_b(−(v − c_b)² / (2σ²)); σ = 0 is ``hard_bin``.
* ``hard_bin(v, B)``        one-hot at floor(v·B), v = 1 in the last bin.
* ``histogram(P, B, σ)``    the mean of κ over a member axis: h = Σ_j κ(P_j) / n.
* ``normalised_entropy(h)`` H(h) / log B in [0, 1] (0 log 0 = 0).
* ``windowed_mode(h, w)``   b* = argmax h; ỹ = Σ_{|b−b*|≤w} h_b c_b / Σ_{|b−b*|≤w} h_b.
* ``support_interval(h, ε)`` [min_S c_b − Δ/2, max_S c_b + Δ/2] over S = {b : h_b ≥ ε}.
* ``interval_loss(ŷ, lo, hi)`` relu(lo − ŷ)² + relu(ŷ − hi)²: zero inside the interval.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def bin_centres(num_bins: int, like: Tensor | None = None) -> Tensor:
    c = (torch.arange(num_bins, dtype=torch.float64) + 0.5) / num_bins
    return c if like is None else c.to(dtype=like.dtype, device=like.device)


def hard_bin(v: Tensor, num_bins: int) -> Tensor:
    """One-hot at floor(v·B), clamped to [0, B − 1] (v = 1 goes to the last bin)."""
    idx = (v * num_bins).floor().long().clamp(0, num_bins - 1)
    return F.one_hot(idx, num_bins).to(v.dtype)


def soft_bin(v: Tensor, num_bins: int, sigma: float) -> Tensor:
    """κ(v)_b = softmax_b(−(v − c_b)² / (2σ²)) (spec §3.1); ``sigma = 0`` gives ``hard_bin``."""
    if sigma <= 0:
        return hard_bin(v, num_bins)
    c = bin_centres(num_bins, v)
    return torch.softmax(-((v[..., None] - c) ** 2) / (2 * sigma**2), dim=-1)


def histogram(members: Tensor, num_bins: int, sigma: float, dim: int = -1) -> Tensor:
    """Mean of κ over the member axis ``dim`` of ``members``: shape ``members.shape`` without ``dim``, plus B."""
    return soft_bin(members, num_bins, sigma).mean(dim=dim if dim >= 0 else dim - 1)


def normalised_entropy(h: Tensor) -> Tensor:
    """u = H(h) / log B (spec §3.4 step 5), with 0·log 0 = 0."""
    ent = -(h * torch.log(h.clamp_min(1e-30))).sum(-1)
    return ent / math.log(h.shape[-1])


def windowed_mode(h: Tensor, window: int = 1) -> Tensor:
    """ỹ = Σ_{b∈W} h_b c_b / Σ_{b∈W} h_b over W = {b : |b − b*| ≤ w}, b* = argmax_b h_b (spec §3.4 step 6)."""
    B = h.shape[-1]
    c = bin_centres(B, h)
    b_star = h.argmax(-1, keepdim=True)
    in_window = (torch.arange(B, device=h.device) - b_star).abs() <= window
    hw = h * in_window
    return (hw * c).sum(-1) / hw.sum(-1).clamp_min(1e-30)


def expected_value(h: Tensor) -> Tensor:
    """E_h[c] (the ``refine: mean`` alternative of spec §8)."""
    return (h * bin_centres(h.shape[-1], h)).sum(-1)


def support_interval(h: Tensor, eps: float | None = None) -> tuple[Tensor, Tensor]:
    """[lo, hi] = [min_{S} c_b − Δ/2, max_{S} c_b + Δ/2], S = {b : h_b ≥ ε}, ε = 0.5/B by default."""
    B = h.shape[-1]
    eps = 0.5 / B if eps is None else eps
    c = bin_centres(B, h)
    inside = h >= eps
    big = torch.tensor(float("inf"), dtype=h.dtype, device=h.device)
    lo = torch.where(inside, c, big).amin(-1) - 0.5 / B
    hi = torch.where(inside, c, -big).amax(-1) + 0.5 / B
    return lo, hi


def interval_loss(pred: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """Elementwise relu(lo − ŷ)² + relu(ŷ − hi)² (the uncertain samples' partial-label regression, §3.4 step 7)."""
    return F.relu(lo - pred) ** 2 + F.relu(pred - hi) ** 2
