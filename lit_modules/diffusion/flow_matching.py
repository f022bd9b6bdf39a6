"""Rectified-flow / flow-matching training and Euler sampling on diffusers' ``FlowMatchEulerDiscreteScheduler``.

The conventions are the scheduler's (SD3, Wan2.1; Esser et al., "Scaling Rectified Flow Transformers",
arXiv 2403.03206, §2-3): noise level ``sigma ∈ [0, 1]`` (1 = pure noise), backbone timestep ``1000·sigma``,

    x_sigma = (1 − sigma)·z0 + sigma·eps                    (forward path; the scheduler's ``scale_noise``)
    u       = eps − z0                                       (velocity target, the same at every sigma)
    x0_hat  = x_sigma − sigma·v                              (clean estimate from a velocity)
    x_{sigma'} = x_sigma + (sigma' − sigma)·v                (one Euler step; the scheduler's ``step``)

Training noise levels: ``u ~ N(0, 1)``, ``sigma = shift(sigmoid(u))`` with ``shift(s) = k s / (1 + (k − 1) s)``
(logit-normal, SD3 §3.1, then the flow shift ``k`` of Wan). The inference grid is never re-derived here: it is
``scheduler.sigmas`` after ``set_timesteps(K)`` (for shift 3 and K = 4: ``[1, 0.8577, 0.6022, 0.0089, 0]`` in
diffusers 0.42, because the scheduler shifts a linspace that already ends at a shifted sigma_min), and each
step is the scheduler's own ``step``.

``FlowMatchingObjective`` holds these; ``euler_sample`` runs a velocity function over the grid (one call per
step) and hands each step's clean estimate back to the caller (self-conditioning reads it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor

from litlab.lit_modules.diffusion.ddpm import diffusers_classes


def _expand(sigma: Tensor | float, like: Tensor) -> Tensor:
    sigma = torch.as_tensor(sigma, dtype=like.dtype, device=like.device)
    return sigma.reshape(-1, *([1] * (like.ndim - 1))) if sigma.ndim else sigma


class FlowMatchingObjective:
    """The flow-matching maths of the module docstring on one ``FlowMatchEulerDiscreteScheduler(shift=k)``."""

    def __init__(self, flow_shift: float = 3.0, num_train_timesteps: int = 1000):
        if flow_shift <= 0:
            raise ValueError(f"flow_shift must be > 0, got {flow_shift}")
        (FlowMatchEulerDiscreteScheduler,) = diffusers_classes("FlowMatchEulerDiscreteScheduler")
        self.flow_shift = float(flow_shift)
        self.num_train_timesteps = num_train_timesteps
        self.scheduler = FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=num_train_timesteps, shift=self.flow_shift
        )

    # ---- training --------------------------------------------------------------------------------
    def shift(self, s: Tensor) -> Tensor:
        k = self.flow_shift
        return k * s / (1 + (k - 1) * s)

    def sample_sigma(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """(n,) training noise levels: logit-normal(0, 1), then the flow shift."""
        return self.shift(torch.sigmoid(torch.randn(n, generator=generator)))

    def timestep(self, sigma: Tensor) -> Tensor:
        """The backbone's timestep input ``1000·sigma``."""
        return sigma * self.num_train_timesteps

    @staticmethod
    def noised(z0: Tensor, eps: Tensor, sigma: Tensor | float) -> Tensor:
        s = _expand(sigma, z0)
        return (1 - s) * z0 + s * eps

    @staticmethod
    def target(z0: Tensor, eps: Tensor) -> Tensor:
        return eps - z0

    @staticmethod
    def x0_hat(x: Tensor, sigma: Tensor | float, v: Tensor) -> Tensor:
        return x - _expand(sigma, x) * v

    @staticmethod
    def euler(x: Tensor, sigma: Tensor | float, sigma_next: Tensor | float, v: Tensor) -> Tensor:
        return x + (_expand(sigma_next, x) - _expand(sigma, x)) * v

    @staticmethod
    def loss(v: Tensor, z0: Tensor, eps: Tensor) -> Tensor:
        """Uniformly weighted velocity MSE."""
        return ((v.float() - (eps - z0).float()) ** 2).mean()

    # ---- sampling ----------------------------------------------------------------------------------
    def inference_scheduler(self, steps: int):
        """A fresh copy of the scheduler with its K-step grid set (``.sigmas`` has K + 1 entries, ending at 0)."""
        if steps < 1:
            raise ValueError(f"the number of sampling steps must be >= 1, got {steps}")
        sched = copy.deepcopy(self.scheduler)
        sched.set_timesteps(steps)
        return sched

    def grid(self, steps: int) -> Tensor:
        return self.inference_scheduler(steps).sigmas.clone()

    @torch.no_grad()
    def euler_sample(
        self,
        velocity: Callable[[Tensor, Tensor, int], Tensor],
        x: Tensor,
        steps: int,
        on_step: Callable[[int, Tensor, Tensor], None] | None = None,
    ) -> Tensor:
        """Integrate ``velocity(x, sigma, i)`` ((B,) sigma) from sigma = 1 to 0 on the scheduler's K-step grid; each
        step is ``scheduler.step``. ``on_step(i, sigma, x0_hat)`` sees each step's clean estimate."""
        sched = self.inference_scheduler(steps)
        for i, t in enumerate(sched.timesteps):
            sigma = sched.sigmas[i].to(x.dtype).expand(len(x))
            v = velocity(x, sigma, i)
            if on_step is not None:
                on_step(i, sigma, self.x0_hat(x, sigma, v))
            x = sched.step(v, t, x, return_dict=False)[0]
        return x
