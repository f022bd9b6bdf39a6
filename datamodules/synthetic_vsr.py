"""Paired video super-resolution data: procedural moving-texture clips and their degraded low-resolution copies.

Quick scale of LiteVSR ("LiteVSR: Lightweight Adaptation of Frozen Diffusion Transformers for Video
Super-Resolution", ICML 2026, arXiv 2606.09250; the CPU protocol is the reconstruction's, spec §6). Each clip,
``frames`` × ``hq_size``² RGB in [-1, 1]:

* background: a two-colour linear gradient at a random angle plus a low-amplitude sinusoidal texture (static);
* one disc or square (a second one with probability 1/2), radius ``hq_size``/8 … ``hq_size``/4, filled with a
  two-colour stripe texture (period 4-8 px, random angle) that moves with the object, constant velocity of at
  most ``max_speed`` px/frame; anti-aliased edges.

Degradation per clip (``degrade``): Gaussian blur (sigma drawn from ``blur_sigma``, 7 taps, separable) → area
downsample ×``scale`` → Gaussian noise (std drawn from [0, ``noise_std``]) → 8-bit quantisation. Everything is
batched tensor arithmetic (no per-pixel loops), seeded by the run's "data" stream (``core.seeding.derive_seed``);
the three splits come from disjoint generators: ``pretrain_clips`` unpaired HQ clips (the backbone's pre-training pool, sampled with replacement),
``train_clips`` pairs (the small paired set the adapter trains on) and ``test_clips`` pairs (the val loader).

The train loader serves ``steps`` batches of ``batch_size`` pairs drawn with replacement (order from the run's
"data.order" stream), so one epoch is the fit's whole training budget and validation runs once, at its end.
``frame_size`` is (``hq_size``, ``hq_size``), the HQ frame the contract names.
"""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset

from litlab.lit_modules.core.seeding import derive_seed

WORLD = "vsr-moving-textures-v1"


def render_clips(n: int, frames: int, size: int, gen: torch.Generator, max_speed: float = 2.0) -> Tensor:
    """(n, 3, frames, size, size) clips in [-1, 1] (see the module docstring)."""

    def u(*shape, lo=0.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(*shape, generator=gen)

    c = torch.arange(size, dtype=torch.float32) + 0.5
    ys, xs = torch.meshgrid(c, c, indexing="ij")  # (H, W)
    # background: gradient + faint sinusoid, the same in every frame
    c1, c2 = u(n, 3, 1, 1, lo=-0.8, hi=0.8), u(n, 3, 1, 1, lo=-0.8, hi=0.8)
    th = u(n, 1, 1, hi=2 * math.pi)
    t = (((xs - size / 2) * th.cos() + (ys - size / 2) * th.sin()) / size + 0.5).clamp(0, 1)
    bg = c1 + (c2 - c1) * t[:, None]
    amp, period, ang, phase = (
        u(n, 1, 1, hi=0.08),
        u(n, 1, 1, lo=6, hi=16),
        u(n, 1, 1, hi=math.pi),
        u(n, 1, 1, hi=6.3),
    )
    bg = bg + (amp * torch.sin(2 * math.pi * (xs * ang.cos() + ys * ang.sin()) / period + phase))[:, None]
    clip = bg[:, :, None].expand(n, 3, frames, size, size).clone()
    ft = torch.arange(frames, dtype=torch.float32).view(1, frames, 1, 1)
    for slot in range(2):
        active = torch.ones(n) if slot == 0 else (torch.rand(n, generator=gen) < 0.5).float()
        r = u(n, lo=size / 8, hi=size / 4)
        cx0, cy0 = u(n) * (size - 2 * r) + r, u(n) * (size - 2 * r) + r
        speed, heading = u(n, hi=max_speed), u(n, hi=2 * math.pi)
        vx, vy = speed * heading.cos(), speed * heading.sin()
        square = torch.rand(n, generator=gen) < 0.5
        col_a, col_b = u(n, 3, lo=-1, hi=1), u(n, 3, lo=-1, hi=1)
        p, phi = u(n, lo=4, hi=8), u(n, hi=math.pi)
        v4 = lambda z: z.view(n, 1, 1, 1)  # noqa: E731
        dx = xs - (v4(cx0) + v4(vx) * ft)  # (n, F, H, W)
        dy = ys - (v4(cy0) + v4(vy) * ft)
        dist = torch.where(v4(square), torch.maximum(dx.abs(), dy.abs()), torch.sqrt(dx**2 + dy**2))
        mask = (v4(r) - dist + 0.5).clamp(0, 1) * v4(active)
        stripe = 0.5 + 0.5 * torch.sin(2 * math.pi * (dx * v4(phi.cos()) + dy * v4(phi.sin())) / v4(p))
        stripe = ((stripe - 0.5) * 3 + 0.5).clamp(0, 1)
        colour = col_a.view(n, 3, 1, 1, 1) + (col_b - col_a).view(n, 3, 1, 1, 1) * stripe[:, None]
        clip = clip * (1 - mask[:, None]) + colour * mask[:, None]
    return clip.clamp(-1, 1)


def gaussian_taps(sigma: Tensor, taps: int = 7) -> Tensor:
    x = torch.arange(taps, dtype=torch.float32) - (taps - 1) / 2
    k = torch.exp(-(x[None] ** 2) / (2 * sigma[:, None] ** 2))
    return k / k.sum(1, keepdim=True)


def degrade(
    hq: Tensor,
    scale: int,
    gen: torch.Generator,
    blur_sigma: tuple[float, float] = (0.8, 1.6),
    noise_std: float = 0.02,
) -> Tensor:
    """(n, 3, F, H, W) HQ in [-1, 1] -> (n, 3, F, H/scale, W/scale) LQ: blur, area down, noise, 8-bit."""
    n, c, f, h, w = hq.shape
    if h % scale or w % scale:
        raise ValueError(f"clip size {h}x{w} is not divisible by scale={scale}")
    lo, hi = blur_sigma
    sigma = lo + (hi - lo) * torch.rand(n, generator=gen)
    k = gaussian_taps(sigma).repeat_interleave(c * f, 0)  # (n·c·f, 7), one kernel per clip
    x = hq.reshape(1, n * c * f, h, w)
    x = F.conv2d(F.pad(x, (0, 0, 3, 3), mode="reflect"), k[:, None, :, None], groups=n * c * f)
    x = F.conv2d(F.pad(x, (3, 3, 0, 0), mode="reflect"), k[:, None, None, :], groups=n * c * f)
    x = F.avg_pool2d(x, scale)
    std = noise_std * torch.rand(n, generator=gen)
    x = x.reshape(n, c, f, h // scale, w // scale)
    x = x + std.view(n, 1, 1, 1, 1) * torch.randn(x.shape, generator=gen)
    return (((x + 1) / 2 * 255).round().clamp(0, 255) / 255) * 2 - 1


def bicubic_up(lq: Tensor, scale: int) -> Tensor:
    """(B, 3, F, h, w) -> (B, 3, F, h·s, w·s), bicubic per frame (``Up_s`` of the spec)."""
    b, c, f, h, w = lq.shape
    x = F.interpolate(lq.reshape(b, c * f, h, w), scale_factor=scale, mode="bicubic", align_corners=False)
    return x.reshape(b, c, f, h * scale, w * scale)


class SyntheticVSRDataModule(L.LightningDataModule):
    """Procedural (HQ, LQ) clip pairs (see the module docstring)."""

    def __init__(
        self,
        frames: int = 4,
        hq_size: int = 32,
        scale: int = 4,
        pretrain_clips: int = 512,
        train_clips: int = 64,
        test_clips: int = 32,
        batch_size: int = 8,
        steps: int = 300,
        eval_batch: int = 32,
        blur_sigma: tuple[float, float] = (0.8, 1.6),
        noise_std: float = 0.02,
        max_speed: float = 2.0,
    ):
        super().__init__()
        if hq_size % scale:
            raise ValueError(f"hq_size={hq_size} must be a multiple of scale={scale}")
        if frames < 2:
            raise ValueError(f"frames must be >= 2 (the temporal metrics compare neighbours), got {frames}")
        for name, value in (
            ("pretrain_clips", pretrain_clips),
            ("train_clips", train_clips),
            ("test_clips", test_clips),
            ("steps", steps),
            ("batch_size", batch_size),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.frames, self.hq_size, self.scale = frames, hq_size, scale
        self.frame_size = (hq_size, hq_size)
        self.pretrain_clips, self.train_clips, self.test_clips = pretrain_clips, train_clips, test_clips
        self.batch_size, self.steps, self.eval_batch = batch_size, steps, eval_batch
        self.blur_sigma, self.noise_std, self.max_speed = tuple(blur_sigma), noise_std, max_speed
        self._data_seed: int | None = None  # the run's "data" stream, drawn at first use
        self._pool: Tensor | None = None
        self._pairs: dict[str, tuple[Tensor, Tensor]] = {}

    @property
    def data_seed(self) -> int:
        """The seed of every clip and degradation: the run's "data" stream, drawn once, so the clips stay the
        ones the DataModule first served."""
        if self._data_seed is None:
            self._data_seed = derive_seed("data")
        return self._data_seed

    def _gen(self, split: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.data_seed * 1_000_003 + split)

    def data_key(self) -> dict:
        return {
            "world": WORLD,
            "frames": self.frames,
            "hq_size": self.hq_size,
            "pretrain_clips": self.pretrain_clips,
            "max_speed": self.max_speed,
            "data_seed": self.data_seed,
        }

    def pretrain_batch(self, batch_size: int, gen: torch.Generator) -> Tensor:
        if self._pool is None:
            self._pool = render_clips(
                self.pretrain_clips, self.frames, self.hq_size, self._gen(1), self.max_speed
            )
        return self._pool[torch.randint(0, len(self._pool), (batch_size,), generator=gen)]

    def pairs(self, split: str) -> tuple[Tensor, Tensor]:
        """(HQ, LQ) of the ``train`` or ``test`` split."""
        if split not in self._pairs:
            n, code = {"train": (self.train_clips, 2), "test": (self.test_clips, 3)}[split]
            gen = self._gen(code)
            hq = render_clips(n, self.frames, self.hq_size, gen, self.max_speed)
            self._pairs[split] = (hq, degrade(hq, self.scale, gen, self.blur_sigma, self.noise_std))
        return self._pairs[split]

    def setup(self, stage: str | None = None) -> None:
        self.pairs("train")
        self.pairs("test")

    def train_dataloader(self) -> DataLoader:
        hq, lq = self.pairs("train")
        gen = torch.Generator().manual_seed(derive_seed("data.order"))
        idx = torch.randint(0, len(hq), (self.steps * self.batch_size,), generator=gen)
        return DataLoader(_Indexed(hq, lq, idx), batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        hq, lq = self.pairs("test")
        return DataLoader(TensorDataset(hq, lq), batch_size=self.eval_batch, shuffle=False)


class _Indexed(Dataset):
    """Pairs ``(hq[idx[i]], lq[idx[i]])`` without materialising the drawn copies."""

    def __init__(self, hq: Tensor, lq: Tensor, idx: Tensor):
        self.hq, self.lq, self.idx = hq, lq, idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        j = int(self.idx[i])
        return self.hq[j], self.lq[j]
