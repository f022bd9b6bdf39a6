"""The baselines LiteVSR (arXiv 2606.09250) argues against, as ``vsr.Conditioner``s on the same frozen backbone.

* ``FullFinetune``: a trainable copy of the whole backbone whose ``patch_embedding`` is widened to take
  ``[x_sigma ; z_lq]``; the new input-channel weights start at 0, so at step 0 it is the backbone (FlashVSR /
  SeedVR-style full fine-tuning, 100 % of the parameters trainable). The frozen original stays untouched.
* ``ControlNetCopy``: the PixArt-δ "ControlNet-Transformer" (arXiv 2401.05252; ControlNet, arXiv 2302.05543):
  a trainable deep copy of the first ``n_copy`` backbone blocks; the copy's input is the backbone's block-0 input
  plus ``Z_in(PatchEmbed_LQ(z_lq))``; the output of copy block i goes through a zero-initialised linear ``Z_i``
  and is added (a hint, ``hints.BlockHintInjector``) to the output of frozen block i. The copy reads the
  backbone's own time modulation, text tokens and RoPE tables through a forward pre-hook on block 0.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from litlab.lit_modules.diffusion.hints import BlockHintInjector
from litlab.lit_modules.diffusion.vsr import Conditioner, run_backbone


def _clear_hooks(module: nn.Module) -> nn.Module:
    for m in module.modules():
        m._forward_hooks.clear()
        m._forward_pre_hooks.clear()
    return module


def trainable_copy(module: nn.Module) -> nn.Module:
    m = _clear_hooks(copy.deepcopy(module))
    m.requires_grad_(True)
    m.train()
    return m


class FullFinetune(Conditioner):
    def __init__(self, transformer: nn.Module, channels: int):
        super().__init__()
        self.model = trainable_copy(transformer)
        old = self.model.patch_embedding
        wide = nn.Conv3d(2 * channels, old.out_channels, kernel_size=old.kernel_size, stride=old.stride)
        with torch.no_grad():
            wide.weight.zero_()
            wide.weight[:, :channels] = old.weight
            wide.bias.copy_(old.bias)
        self.model.patch_embedding = wide

    def velocity(self, transformer, text, x, sigma, state, x0_in, record: bool = False) -> Tensor:
        return run_backbone(self.model, text, torch.cat([x, state], dim=1), sigma)


class ControlNetCopy(Conditioner):
    def __init__(self, transformer: nn.Module, n_copy: int, channels: int):
        super().__init__()
        n_blocks = len(transformer.blocks)
        if not 1 <= n_copy <= n_blocks:
            raise ValueError(f"n_copy must be in 1..{n_blocks} (the backbone's blocks), got {n_copy}")
        dim = transformer.patch_embedding.out_channels
        self.copies = nn.ModuleList(trainable_copy(transformer.blocks[i]) for i in range(n_copy))
        self.lq_embed = trainable_copy(transformer.patch_embedding)
        if channels != self.lq_embed.in_channels:
            raise ValueError(
                f"LQ latents have {channels} channels, the patch embedding {self.lq_embed.in_channels}"
            )
        self.lq_zero = nn.Linear(dim, dim)
        self.out_zero = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_copy))
        for z in [self.lq_zero, *self.out_zero]:
            nn.init.zeros_(z.weight)
            nn.init.zeros_(z.bias)
        self.injector = BlockHintInjector(transformer.blocks, list(range(n_copy)))
        self._lq_tokens: Tensor | None = None
        self._handle = transformer.blocks[0].register_forward_pre_hook(self._run_copy)

    def _run_copy(self, block: nn.Module, args):
        if self._lq_tokens is None:
            return None
        hidden, text, temb, rope = args
        c = hidden + self.lq_zero(self._lq_tokens)
        hints = []
        for blk, z in zip(self.copies, self.out_zero):
            c = blk(c, text, temb, rope)
            hints.append(z(c))
        self.injector.set_hints(hints)
        return None

    def prepare(self, z_lq: Tensor) -> Tensor:
        return self.lq_embed(z_lq).flatten(2).transpose(1, 2)

    def velocity(self, transformer, text, x, sigma, state, x0_in, record: bool = False) -> Tensor:
        self._lq_tokens = state
        try:
            with self.injector.inject([None] * len(self.copies)):
                return run_backbone(transformer, text, x, sigma)
        finally:
            self._lq_tokens = None
