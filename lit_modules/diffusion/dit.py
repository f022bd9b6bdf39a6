"""Flow-matching video diffusion transformers on diffusers' ``WanTransformer3DModel`` (Wan2.1, arXiv 2503.20314).

* ``TinyDiTConfig`` / ``TinyDiT``: the quick-scale backbone, a ``WanTransformer3DModel`` built from a config
  (random init, nothing downloaded) that works in pixel space (the VAE is the identity, clips in [-1, 1]) with one
  fixed all-zero text token ``(B, 1, text_dim)``. The spec's default (patch (1, 4, 4), 4 heads × 16, FFN 128, 6
  blocks, text/freq dim 32) has 347,632 parameters.
* ``pretrained_tiny_dit(cfg, dm, seed)``: that backbone pre-trained with the flow-matching objective
  (``flow_matching.FlowMatchingObjective``) on the DataModule's unpaired HQ clips and cached once per
  (architecture, recipe, data, seed) through ``core.pretrain.train_and_cache``.
* ``load_wan(model_id)``: the full-scale transformer, VAE, text encoder, tokenizer and flow scheduler of a
  diffusers Wan checkpoint (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``), from a folder or the local cache; offline
  without it, ``ModelUnavailableError`` names it at once.
* ``WanLatentBackbone``: the full-scale backbone of the same loop: the frozen transformer on AutoencoderKLWan
  latents (encode / decode with the VAE config's ``latents_mean`` / ``latents_std``, as diffusers' Wan pipelines)
  and the empty-prompt umT5 embedding, computed once when it is built; the text encoder is not kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.core.pretrain import train_and_cache
from litlab.lit_modules.diffusion.ddpm import diffusers_classes
from litlab.lit_modules.diffusion.flow_matching import FlowMatchingObjective


@config_part
class TinyDiTConfig:
    """The quick-scale ``WanTransformer3DModel`` and its flow-matching pre-training recipe."""

    patch_size: tuple[int, int, int] = (1, 4, 4)
    num_attention_heads: int = 4
    attention_head_dim: int = 16
    channels: int = 3
    text_dim: int = 32
    freq_dim: int = 32
    ffn_dim: int = 128
    num_layers: int = 6
    rope_max_seq_len: int = 64
    pretrain_steps: int = 500
    pretrain_batch: int = 8
    pretrain_lr: float = 1e-3
    flow_shift: float = 3.0

    def model_kwargs(self) -> dict[str, Any]:
        return dict(
            patch_size=tuple(self.patch_size),
            num_attention_heads=self.num_attention_heads,
            attention_head_dim=self.attention_head_dim,
            in_channels=self.channels,
            out_channels=self.channels,
            text_dim=self.text_dim,
            freq_dim=self.freq_dim,
            ffn_dim=self.ffn_dim,
            num_layers=self.num_layers,
            rope_max_seq_len=self.rope_max_seq_len,
        )


def wan_transformer(**kwargs) -> nn.Module:
    (WanTransformer3DModel,) = diffusers_classes("WanTransformer3DModel")
    return WanTransformer3DModel(**kwargs)


class TinyDiT(nn.Module):
    """The quick-scale backbone (``.transformer``) and its fixed text conditioning (``text(batch)``)."""

    def __init__(self, cfg: TinyDiTConfig):
        super().__init__()
        self.cfg = cfg
        self.transformer = wan_transformer(**cfg.model_kwargs())

    def text(self, batch: int) -> Tensor:
        """One all-zero text token per clip: the fixed (empty) prompt of the quick scale."""
        return torch.zeros(batch, 1, self.cfg.text_dim)

    def forward(self, x: Tensor, sigma: Tensor, text: Tensor | None = None) -> Tensor:
        text = self.text(len(x)) if text is None else text
        return self.transformer(x, sigma * 1000.0, text, return_dict=False)[0]

    # pixel space: the "VAE" is the identity (the same tensors come back, so the quick loop is unchanged)
    def encode(self, clip: Tensor) -> Tensor:
        return clip

    def decode(self, z: Tensor) -> Tensor:
        return z

    def latent_shape(self, clip_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(clip_shape)


def pretrain_flow(model: TinyDiT, cfg: TinyDiTConfig, dm: Any, seed: int) -> None:
    """``cfg.pretrain_steps`` AdamW steps of the velocity MSE on ``dm.pretrain_batch`` HQ clips."""
    objective = FlowMatchingObjective(cfg.flow_shift)
    gen = torch.Generator().manual_seed(seed + 29)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.pretrain_lr, weight_decay=0.0)
    model.train()
    for _ in range(cfg.pretrain_steps):
        z0 = dm.pretrain_batch(cfg.pretrain_batch, gen)
        sigma = objective.sample_sigma(len(z0), gen)
        eps = torch.randn(z0.shape, generator=gen)
        v = model(objective.noised(z0, eps, sigma), sigma)
        loss = objective.loss(v, z0, eps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()


def pretrained_tiny_dit(cfg: TinyDiTConfig, dm: Any, seed: int) -> TinyDiT:
    """The backbone trained on ``dm.pretrain_batch`` (one thread, cached; a second call in any process loads it)."""
    args = {"cfg": dataclasses.asdict(cfg), "data": dm.data_key(), "seed": seed}
    return train_and_cache(
        "litevsr-tiny-wan",
        args,
        seed,
        lambda: TinyDiT(cfg),
        lambda model: pretrain_flow(model, cfg, dm, seed),
        threads=1,
    )


def load_wan(model_id: str, revision: str | None = None) -> dict[str, Any]:
    """Transformer, VAE, text encoder, tokenizer and flow scheduler of a diffusers Wan checkpoint."""
    AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel = diffusers_classes(
        "AutoencoderKLWan", "FlowMatchEulerDiscreteScheduler", "WanTransformer3DModel"
    )
    from transformers import AutoTokenizer, UMT5EncoderModel

    from litlab.lit_modules.core.hf import load_pipeline_parts

    return load_pipeline_parts(
        model_id,
        revision,
        "the video diffusion backbone",
        {
            "transformer": WanTransformer3DModel.from_pretrained,
            "vae": AutoencoderKLWan.from_pretrained,
            "text_encoder": UMT5EncoderModel.from_pretrained,
            "tokenizer": AutoTokenizer.from_pretrained,
            "scheduler": FlowMatchEulerDiscreteScheduler.from_pretrained,
        },
    )


@torch.no_grad()
def prompt_embedding(parts: dict[str, Any], prompt: str, max_sequence_length: int) -> Tensor:
    """(1, L, d) embedding of ``prompt`` by diffusers' own ``WanPipeline.encode_prompt`` over the checkpoint's parts
    (umT5, padded to ``max_sequence_length``, zero after the prompt's own tokens), in float32 on the CPU."""
    from diffusers import WanPipeline

    pipe = WanPipeline(
        **{k: parts[k] for k in ("tokenizer", "text_encoder", "vae", "scheduler", "transformer")}
    )
    device = next(parts["text_encoder"].parameters()).device
    embeds, _ = pipe.encode_prompt(
        prompt,
        do_classifier_free_guidance=False,
        max_sequence_length=max_sequence_length,
        device=device,
        dtype=torch.float32,
    )
    return embeds.cpu()


class WanLatentBackbone(nn.Module):
    """The frozen full-scale backbone in the latent space of its VAE (LiteVSR spec §3.1, §3.7).

    ``transformer`` (``WanTransformer3DModel``) and ``vae`` (``AutoencoderKLWan``) are submodules (the loop
    freezes and guards them); the fixed text conditioning is ``prompt`` (default ``""``) through the checkpoint's
    umT5 encoder and tokenizer, computed once here (diffusers' Wan pipelines: up to 512 tokens) and kept as a
    buffer; the text encoder itself is not kept. Latents: ``z = (mode(E(x)) − latents_mean) / latents_std`` per
    channel, from the VAE's config (diffusers' ``WanVideoToVideoPipeline.prepare_latents`` with
    ``sample_mode="argmax"``; decoding inverts it, ``WanPipeline.__call__``). Clips have ``1 + 4k`` frames
    (the VAE encodes the first frame, then chunks of 4) and sides divisible by the VAE's spatial factor times the
    transformer's patch; the latent channels and patch size are the loaded configs' (16 and (1, 2, 2) for Wan2.1).
    """

    def __init__(self, parts: dict[str, Any], prompt: str = "", max_sequence_length: int = 512):
        super().__init__()
        self.transformer = parts["transformer"]
        self.vae = parts["vae"]
        t_cfg, v_cfg = self.transformer.config, self.vae.config
        z_dim = int(v_cfg.z_dim)
        if int(t_cfg.in_channels) != z_dim or int(t_cfg.out_channels) != z_dim:
            raise ValueError(
                f"the transformer takes {t_cfg.in_channels} channels and returns {t_cfg.out_channels}; the VAE's "
                f"latents have {z_dim}"
            )
        self.channels = z_dim
        self.patch_size = tuple(int(p) for p in t_cfg.patch_size)
        self.scale_t = int(v_cfg.scale_factor_temporal or 2 ** sum(v_cfg.temperal_downsample))
        self.scale_s = int(v_cfg.scale_factor_spatial or 2 ** (len(v_cfg.dim_mult) - 1))
        self.register_buffer(
            "latents_mean",
            torch.tensor(v_cfg.latents_mean, dtype=torch.float32).view(1, z_dim, 1, 1, 1),
            False,
        )
        self.register_buffer(
            "latents_std", torch.tensor(v_cfg.latents_std, dtype=torch.float32).view(1, z_dim, 1, 1, 1), False
        )
        tokenizer = parts["tokenizer"]
        length = min(max_sequence_length, int(getattr(tokenizer, "model_max_length", max_sequence_length)))
        embeds = prompt_embedding(parts, prompt, length)
        if embeds.shape[-1] != int(t_cfg.text_dim):
            raise ValueError(
                f"the text encoder's width {embeds.shape[-1]} is not the transformer's text_dim {t_cfg.text_dim}"
            )
        self.register_buffer("prompt_embeds", embeds, False)

    @classmethod
    def from_pretrained(
        cls, model_id: str, revision: str | None = None, prompt: str = ""
    ) -> WanLatentBackbone:
        parts = load_wan(model_id, revision)
        backbone = cls(parts, prompt)
        parts.clear()  # the text encoder is freed with the dict (its embedding is cached in the backbone)
        return backbone

    def text(self, batch: int) -> Tensor:
        return self.prompt_embeds.expand(batch, -1, -1)

    def check_clip(self, clip_shape: tuple[int, ...]) -> None:
        _, _, f, h, w = clip_shape
        side = self.scale_s * self.patch_size[1]
        if (f - 1) % self.scale_t or h % side or w % side:
            raise ValueError(
                f"a clip of {f} frames of {h}x{w} does not fit the Wan latent grid: frames must be 1 + "
                f"{self.scale_t}k and height / width multiples of {side} (VAE x{self.scale_s} times patch "
                f"{self.patch_size[1]})"
            )

    def latent_shape(self, clip_shape: tuple[int, ...]) -> tuple[int, ...]:
        self.check_clip(clip_shape)
        b, _, f, h, w = clip_shape
        return (b, self.channels, 1 + (f - 1) // self.scale_t, h // self.scale_s, w // self.scale_s)

    @torch.no_grad()
    def encode(self, clip: Tensor) -> Tensor:
        """(B, 3, F, H, W) in [-1, 1] -> normalised latents (B, z_dim, 1 + (F − 1)/4, H/8, W/8) (Wan2.1)."""
        self.check_clip(tuple(clip.shape))
        dtype = next(self.vae.parameters()).dtype
        mu = self.vae.encode(clip.to(dtype)).latent_dist.mode()
        return ((mu.float() - self.latents_mean) / self.latents_std).to(clip.dtype)

    @torch.no_grad()
    def decode(self, z: Tensor) -> Tensor:
        """Normalised latents -> (B, 3, F, H, W) clips in [-1, 1]."""
        dtype = next(self.vae.parameters()).dtype
        video = self.vae.decode((z.float() * self.latents_std + self.latents_mean).to(dtype)).sample
        return video.float().clamp(-1.0, 1.0)
