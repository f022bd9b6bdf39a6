"""LiteVSR: Lightweight Adaptation of Frozen Diffusion Transformers for Video Super-Resolution.

Paper: Cao, Liu, Zhang, Deng, Gong, Song, ICML 2026, arXiv 2606.09250. Readable: the abstract, the introduction's
opening, Table 1 (training efficiency: 11.25 % trainable parameters, 266 REDS clips, 6K iterations on one A100)
and the project page (a Structural Stream on the LQ input, a Refinement Stream on the current clean estimate,
fused by a time-modulated cross-attention; every backbone block frozen). The argument (§3.2 of the
reconstruction): the rectified-flow target ``eps − z0`` is the same at every noise level, so a frozen DiT needs
only a nearly time-invariant, LQ-derived injection pattern. Everything else is **reconstructed** [R].

Algorithm (one training iteration; the loop is ``vsr.FrozenDiTVSR``, the adapter ``state_aware_adapter``):
  1. z0 = E(Y), z_lq = E(Up_4(X)) (bicubic; E = identity in pixel space at the quick scale, Wan's VAE latents
     normalised by its latents_mean / latents_std at full scale)
  2. sigma = shift_k(sigmoid(u)), u ~ N(0, 1) (logit-normal + flow shift k = 3)                   [R: SD3 / Wan]
  3. x_sigma = (1 − sigma) z0 + sigma eps                                               (flow matching)
  4. S = StructStream(z_lq)                                                   (once per clip, §3.3.3)
  5. x0_in = z_lq; with prob. p_sc = 0.5: x0_in = x_sigma − sigma·no_grad(G(x_sigma; A(S.detach(), z_lq)))
                                                                                      [R: self-conditioning]
  6. H = A(S, x0_in, x_sigma, sigma): refinement stream on [x0_in; x_sigma], time-modulated fusion with S,
     zero-initialised projections Z_j                                                   (§3.3.4-3.3.6)
  7. v = G_theta(x_sigma, 1000·sigma, c) with h_l ← Block_l(h) + H_j after the blocks l_j ∈ I (forward hooks)
  8. loss = mean((v − (eps − z0))²); AdamW on phi only; the backbone stays bit-identical
Sampling (§3.6): S once; x = eps, x0_in = z_lq; per step of the scheduler's grid v = G(x; A(S, x0_in, x,
sigma_i)), x0_in = x − sigma_i v, x ← Euler step; K = 1 returns eps − v (the single-step mode).

``variant`` switches the card's comparisons, all on the same frozen backbone, data, step budget and objective:
``litevsr`` (the method), ``structural_only`` (ablation: no refinement stream, no self-conditioning, hints
Z_j(S)), ``full_finetune`` and ``controlnet_copy`` (``vsr_baselines``; first ``n_copy`` blocks), ``bicubic``
(the LQ input upsampled; nothing trained).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from torch import Tensor

from litlab.lit_modules.core.config import as_config
from litlab.lit_modules.diffusion.dit import TinyDiTConfig
from litlab.lit_modules.diffusion.hints import BlockHintInjector
from litlab.lit_modules.diffusion.state_aware_adapter import AdapterConfig, StateAwareAdapter
from litlab.lit_modules.diffusion.vsr import Conditioner, FrozenDiTVSR, run_backbone
from litlab.lit_modules.diffusion.vsr_baselines import ControlNetCopy, FullFinetune

Variant = Literal["litevsr", "structural_only", "full_finetune", "controlnet_copy", "bicubic"]


class AdapterHints(Conditioner):
    """Steps 4-7: the State-Aware Adapter's hints added after the hooked frozen blocks."""

    def __init__(self, adapter: StateAwareAdapter, transformer):
        super().__init__()
        self.adapter = adapter
        self.injector = BlockHintInjector(transformer.blocks, list(adapter.cfg.inject_layers))
        self.self_conditioning = not adapter.cfg.structural_only

    def prepare(self, z_lq: Tensor) -> dict[str, Tensor]:
        return {"s": self.adapter.structural(z_lq), "z_lq": z_lq}  # step 4, once per clip

    def detach(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: v.detach() for k, v in state.items()}

    def velocity(self, transformer, text, x, sigma, state, x0_in, record: bool = False) -> Tensor:
        hints = self.adapter.hints(state["s"], x0_in, x, sigma, record=record)  # step 6
        with self.injector.inject(hints):  # step 7
            return run_backbone(transformer, text, x, sigma)

    def struct_attn_mass(self) -> Tensor | None:
        return self.adapter.struct_attn_mass()


class LiteVSR(FrozenDiTVSR):
    """LiteVSR and its comparisons (``variant``) on the shared frozen-DiT loop; see the module docstring."""

    def __init__(
        self,
        variant: Variant = "litevsr",
        adapter: AdapterConfig = AdapterConfig(),  # noqa: B008
        n_copy: int = 3,
        backbone: TinyDiTConfig = TinyDiTConfig(),  # noqa: B008
        pretrained_path: str | None = None,
        flow_shift: float = 3.0,
        self_cond_prob: float = 0.5,
        val_steps: list[int] = [1, 4, 8],  # noqa: B006
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
    ):
        if variant not in ("litevsr", "structural_only", "full_finetune", "controlnet_copy", "bicubic"):
            raise ValueError(
                "variant must be litevsr, structural_only, full_finetune, controlnet_copy or bicubic, got "
                f"{variant!r}"
            )
        super().__init__(
            backbone=backbone,
            pretrained_path=pretrained_path,
            flow_shift=flow_shift,
            self_cond_prob=self_cond_prob,
            val_steps=val_steps,
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
            grad_clip=grad_clip,
        )
        self.save_hyperparameters()
        cfg = as_config(AdapterConfig, adapter, "adapter")
        if variant == "structural_only":
            cfg = dataclasses.replace(cfg, structural_only=True)
        self.adapter_cfg = cfg

    def build_conditioner(self) -> Conditioner | None:
        # channels and patch from the loaded transformer: 3 and (1, 4, 4) in pixel space at the quick scale,
        # the VAE's 16 latent channels and (1, 2, 2) for Wan2.1
        v, t = self.hparams.variant, self.transformer
        c, patch = int(t.config.in_channels), tuple(int(p) for p in t.config.patch_size)
        if v == "bicubic":
            return None
        if v == "full_finetune":
            return FullFinetune(t, c)
        if v == "controlnet_copy":
            return ControlNetCopy(t, self.hparams.n_copy, c)
        dim = t.patch_embedding.out_channels
        bad = [i for i in self.adapter_cfg.inject_layers if not 0 <= i < len(t.blocks)]
        if bad:
            raise ValueError(
                f"adapter.inject_layers {bad} are not blocks of the {len(t.blocks)}-block backbone"
            )
        return AdapterHints(StateAwareAdapter(self.adapter_cfg, c, patch, dim), t)


def report(result, out_dir):
    """The card's report: PSNR / SSIM / TDE of every run per step count, and the LQ / SR / HQ frame grid of one
    test clip (every run's K = 1 output)."""
    from litlab.lit_modules.diffusion.report import vsr_report

    return vsr_report(result, out_dir, "litevsr")
