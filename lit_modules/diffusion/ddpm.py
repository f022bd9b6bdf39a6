"""DDPM training on diffusers' schedulers, and the small text-to-image bases of the quick scale.

* ``ddpm_losses(unet, scheduler, x0, cond, t, noise)``: the ε-prediction loss
  ``|| ε − ε_θ(√ᾱ_t x0 + √(1−ᾱ_t) ε, t, c) ||²`` per sample (Ho et al. 2020), the noising done by the
  scheduler's own ``add_noise`` (``diffusers.DDPMScheduler``); nothing of the schedule is re-derived here.
* ``TinyT2I``: the quick-scale base — a diffusers ``UNet2DConditionModel`` and a ``transformers.CLIPTextModel``
  built from configs (random init, nothing downloaded), pre-trained jointly here on the base world of the
  DataModule and cached once per (architecture, recipe, data, seed) through ``core.pretrain.train_and_cache``.
* ``ddim_sample``: deterministic DDIM samples (η = 0) on diffusers' ``DDIMScheduler``, from noise or SDEdit-style
  from a noised image (the report's sample grids).
* ``load_pretrained_t2i(model_id)``: the full-scale UNet / text encoder / tokenizer / VAE / scheduler of a
  diffusers checkpoint (e.g. ``stable-diffusion-v1-5/stable-diffusion-v1-5``), from a folder or the local cache;
  offline without it, ``ModelUnavailableError`` names it at once.
* ``LatentT2I``: those parts as the full-scale base of the concept-stream loop (latent diffusion, Rombach et al.
  2022, arXiv 2112.10752): what the loop reads from ``TinyT2I`` (``unet``, ``text_encoder``, ``encode``,
  ``tokenize``, ``token_mask``) plus the VAE between pixels and latents (``x0``: posterior mean ×
  ``vae.config.scaling_factor``; ``decode``) and the CLIP tokenizer's added concept tokens ``<V_t>``.

Both bases answer the same calls, so the loop has one code path: ``TinyT2I.x0`` is the identity (pixel space) and
``TinyT2I.decode`` the clamp to [-1, 1] that DDIM sampling applied before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.core.corpus import stdlib_members_kept
from litlab.lit_modules.core.pretrain import train_and_cache
from litlab.lit_modules.diffusion.contract import tokenize


@config_part
class TinyT2IConfig:
    """The quick-scale base: a UNet2DConditionModel (``block_out_channels``, one layer per block, cross-attention
    in every block) and a CLIP text encoder of width ``text_dim``; pre-trained ``pretrain_steps`` AdamW steps."""

    block_out_channels: tuple[int, ...] = (16, 32)
    attention_head_dim: int = 8
    norm_num_groups: int = 8
    text_dim: int = 32
    text_layers: int = 2
    text_heads: int = 4
    num_train_timesteps: int = 1000
    pretrain_steps: int = 200
    pretrain_batch: int = 16
    pretrain_lr: float = 1e-3


def diffusers_classes(*names: str) -> tuple[Any, ...]:
    """``diffusers.<name>`` for each name, imported after transformers and without re-binding the stdlib
    ``logging.Logger`` members that transformers bound (``core.corpus.stdlib_members_kept``: the local text
    corpus reads them, so importing this family must not change other families' training text)."""
    import transformers  # noqa: F401  (binds its Logger members first, as every language-model fit does)

    with stdlib_members_kept():
        import diffusers
        import diffusers.utils.logging  # noqa: F401  (where diffusers binds them)

        return tuple(getattr(diffusers, name) for name in names)


def make_scheduler(num_train_timesteps: int = 1000):
    (DDPMScheduler,) = diffusers_classes("DDPMScheduler")
    return DDPMScheduler(
        num_train_timesteps=num_train_timesteps, beta_schedule="linear", prediction_type="epsilon"
    )


def ddpm_losses(unet: nn.Module, scheduler, x0: Tensor, cond: Tensor, t: Tensor, noise: Tensor) -> Tensor:
    """Per-sample ε-MSE (B,) at timesteps ``t`` with the given ``noise`` (both moved to ``x0``'s device)."""
    t, noise = t.to(x0.device), noise.to(x0.device, x0.dtype)
    noisy = scheduler.add_noise(x0, noise, t)
    pred = unet(noisy, t, encoder_hidden_states=cond).sample
    return ((pred.float() - noise.float()) ** 2).flatten(1).mean(1)


@torch.no_grad()
def ddim_sample(
    unet: nn.Module,
    ddpm_scheduler,
    cond: Tensor,
    noise: Tensor,
    steps: int = 50,
    init: Tensor | None = None,
    t_start: int | None = None,
    clamp: bool = True,
    uncond: Tensor | None = None,
    guidance: float = 1.0,
) -> Tensor:
    """Deterministic DDIM samples (η = 0; Song et al. 2021, "Denoising Diffusion Implicit Models", arXiv
    2010.02502, eq. 12) under text states ``cond`` (B, L, d), on diffusers' ``DDIMScheduler`` built from the
    training scheduler's config (same β schedule, ``steps`` of the full grid); no guidance (the quick-scale base
    is trained without an empty prompt). From pure ``noise`` (B, C, H, W), or, with ``init`` and ``t_start``,
    SDEdit-style (Meng et al. 2021, arXiv 2108.01073, §3): ``init`` noised to ``t_start`` with ``noise`` by the
    scheduler's ``add_noise``, then the grid's steps at or below ``t_start``. Uses no global random state.
    ``clamp``: clip the result to [-1, 1] (pixel space; latents are decoded unclipped). With ``uncond`` (text
    states of the empty prompt, (B, L, d)) and ``guidance`` w != 1: classifier-free guidance (Ho & Salimans 2022,
    arXiv 2207.12598), ε = ε(∅) + w (ε(c) − ε(∅))."""
    if steps < 1:
        raise ValueError(f"sample steps must be >= 1, got {steps}")
    (DDIMScheduler,) = diffusers_classes("DDIMScheduler")
    scheduler = DDIMScheduler.from_config(ddpm_scheduler.config)
    scheduler.set_timesteps(steps)
    timesteps = scheduler.timesteps
    if init is None:
        x = noise.clone()
    else:
        if t_start is None or not 0 < t_start < ddpm_scheduler.config.num_train_timesteps:
            raise ValueError(
                f"t_start must be in 1..{ddpm_scheduler.config.num_train_timesteps - 1}, got {t_start}"
            )
        x = ddpm_scheduler.add_noise(init, noise, torch.full((len(init),), t_start, dtype=torch.long))
        timesteps = timesteps[timesteps <= t_start]
    guided = uncond is not None and guidance != 1.0
    for t in timesteps:
        if guided:
            both = unet(torch.cat([x, x]), t, encoder_hidden_states=torch.cat([uncond, cond])).sample
            eps_u, eps_c = both.chunk(2)
            eps = eps_u + guidance * (eps_c - eps_u)
        else:
            eps = unet(x, t, encoder_hidden_states=cond).sample
        x = scheduler.step(eps, t, x, eta=0.0).prev_sample
    return x.clamp(-1.0, 1.0) if clamp else x


class TinyT2I(nn.Module):
    """UNet2DConditionModel + CLIPTextModel of the quick scale (see the module docstring)."""

    def __init__(self, cfg: TinyT2IConfig, image_size: int, vocab_size: int, seq_len: int):
        super().__init__()
        (UNet2DConditionModel,) = diffusers_classes("UNet2DConditionModel")
        from transformers import CLIPTextConfig, CLIPTextModel

        n = len(cfg.block_out_channels)
        self.unet = UNet2DConditionModel(
            sample_size=image_size,
            in_channels=3,
            out_channels=3,
            layers_per_block=1,
            block_out_channels=tuple(cfg.block_out_channels),
            down_block_types=("CrossAttnDownBlock2D",) * n,
            up_block_types=("CrossAttnUpBlock2D",) * n,
            cross_attention_dim=cfg.text_dim,
            attention_head_dim=cfg.attention_head_dim,
            norm_num_groups=cfg.norm_num_groups,
        )
        self.text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=vocab_size,
                hidden_size=cfg.text_dim,
                intermediate_size=2 * cfg.text_dim,
                num_hidden_layers=cfg.text_layers,
                num_attention_heads=cfg.text_heads,
                max_position_embeddings=seq_len,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
            )
        )

    def encode(self, ids: Tensor) -> Tensor:
        return self.text_encoder(input_ids=ids).last_hidden_state

    # pixel space, fixed word-level vocabulary: the base calls of ``LatentT2I`` reduce to these
    def tokenize(self, prompts: list[str]) -> Tensor:
        return tokenize(prompts)

    def token_mask(self, ids: Tensor) -> Tensor:
        """The real tokens of ``ids`` (not padding)."""
        return ids != 0

    def x0(self, images: Tensor) -> Tensor:
        return images

    def x0_shape(self, image_size: int) -> tuple[int, ...]:
        return (3, image_size, image_size)

    def decode(self, x0: Tensor) -> Tensor:
        return x0.clamp(-1.0, 1.0)


def pretrained_tiny_t2i(cfg: TinyT2IConfig, dm: Any, seed: int) -> TinyT2I:
    """The base, trained on ``dm.base_batch`` (one thread, cached; a second call in any process loads it)."""
    args = {"cfg": dataclasses.asdict(cfg), "data": dm.data_key(), "vocab": list(dm.vocab), "seed": seed}
    scheduler = make_scheduler(cfg.num_train_timesteps)

    def build() -> TinyT2I:
        return TinyT2I(cfg, dm.image_size, len(dm.vocab), dm.seq_len)

    def train(model: TinyT2I) -> None:
        gen = torch.Generator().manual_seed(seed + 17)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.pretrain_lr, weight_decay=0.0)
        model.train()
        for _ in range(cfg.pretrain_steps):
            x0, ids = dm.base_batch(cfg.pretrain_batch, gen)
            t = torch.randint(0, cfg.num_train_timesteps, (len(x0),), generator=gen)
            noise = torch.randn(x0.shape, generator=gen)
            loss = ddpm_losses(model.unet, scheduler, x0, model.encode(ids), t, noise).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        model.eval()

    return train_and_cache("scns-tiny-t2i", args, seed, build, train, threads=1)


def load_pretrained_t2i(model_id: str, revision: str | None = None) -> dict[str, Any]:
    """UNet, text encoder, tokenizer, VAE and DDPM scheduler of a diffusers text-to-image checkpoint."""
    AutoencoderKL, DDPMScheduler, UNet2DConditionModel = diffusers_classes(
        "AutoencoderKL", "DDPMScheduler", "UNet2DConditionModel"
    )
    from transformers import CLIPTextModel, CLIPTokenizer

    from litlab.lit_modules.core.hf import load_pipeline_parts

    return load_pipeline_parts(
        model_id,
        revision,
        "the diffusion base",
        {
            "unet": UNet2DConditionModel.from_pretrained,
            "text_encoder": CLIPTextModel.from_pretrained,
            "tokenizer": CLIPTokenizer.from_pretrained,
            "vae": AutoencoderKL.from_pretrained,
            "scheduler": DDPMScheduler.from_pretrained,
        },
    )


class LatentT2I(nn.Module):
    """A diffusers latent text-to-image checkpoint as the loop's base (see the module docstring): ``unet``,
    ``text_encoder`` and ``vae`` are submodules (everything frozen by the loop but the rows it trains);
    ``tokenizer`` and the training ``scheduler`` (``DDPMScheduler`` from the checkpoint's scheduler config) are
    plain attributes. ε-prediction only (``ddpm_losses``)."""

    def __init__(self, parts: dict[str, Any]):
        super().__init__()
        self.unet = parts["unet"]
        self.text_encoder = parts["text_encoder"]
        self.vae = parts["vae"]
        self.tokenizer = parts["tokenizer"]
        self.scheduler = parts["scheduler"]
        prediction = self.scheduler.config.prediction_type
        if prediction != "epsilon":
            raise ValueError(
                f"the scheduler of this checkpoint predicts {prediction!r}; the concept-stream loop trains the "
                "epsilon-prediction loss only (Stable Diffusion 1.x)"
            )
        self.scaling_factor = float(self.vae.config.scaling_factor)
        self.shift_factor = float(getattr(self.vae.config, "shift_factor", None) or 0.0)
        self.seq_len = int(self.tokenizer.model_max_length)

    @classmethod
    def from_pretrained(cls, model_id: str, revision: str | None = None) -> LatentT2I:
        return cls(load_pretrained_t2i(model_id, revision))

    # ---- text ---------------------------------------------------------------------------------------
    def add_concept_tokens(self, tokens: list[str]) -> list[int]:
        """Adds the concept tokens the tokenizer lacks and grows the text encoder's embedding to match (the new
        rows are set from their class words by the loop at the start of each task); their ids."""
        new = [tok for tok in tokens if tok not in self.tokenizer.get_vocab()]
        if new:
            self.tokenizer.add_tokens(new)
            self.text_encoder.resize_token_embeddings(len(self.tokenizer), mean_resizing=False)
        return [self.tokenizer.convert_tokens_to_ids(tok) for tok in tokens]

    def tokenize(self, prompts: list[str]) -> Tensor:
        """CLIP ids (B, model_max_length): start token, the prompt (truncated), end token, padding."""
        return self.tokenizer(
            list(prompts),
            padding="max_length",
            max_length=self.seq_len,
            truncation=True,
            return_tensors="pt",
        ).input_ids

    def token_id(self, word: str) -> int:
        """The row a concept token is initialised from: the word's last sub-token (its only one for "dog";
        "bear" of "teddy bear"); a concept token is its own single id."""
        ids = self.tokenizer(word, add_special_tokens=False).input_ids
        if not ids:
            raise ValueError(f"{word!r} has no tokens in this tokenizer")
        return int(ids[-1])

    def token_mask(self, ids: Tensor) -> Tensor:
        """The real tokens of ``ids``: up to and including the first end token (CLIP pads with it or with "!")."""
        eos = ids == self.tokenizer.eos_token_id
        seen = eos.long().cumsum(1)
        return (seen == 0) | (eos & (seen == 1))

    def encode(self, ids: Tensor) -> Tensor:
        return self.text_encoder(input_ids=ids).last_hidden_state

    # ---- pixels <-> latents ---------------------------------------------------------------------------
    @torch.no_grad()
    def x0(self, images: Tensor) -> Tensor:
        """Latents of images in [-1, 1]: the VAE posterior's mean (deterministic; diffusers' training scripts
        draw a sample), shifted and scaled as the UNet was trained on."""
        vae_dtype = next(self.vae.parameters()).dtype
        mean = self.vae.encode(images.to(vae_dtype)).latent_dist.mean
        return (mean - self.shift_factor) * self.scaling_factor

    def x0_shape(self, image_size: int) -> tuple[int, ...]:
        down = 2 ** (len(self.vae.config.block_out_channels) - 1)
        if image_size % down:
            raise ValueError(f"image_size {image_size} is not a multiple of the VAE's downsampling {down}")
        return (int(self.vae.config.latent_channels), image_size // down, image_size // down)

    @torch.no_grad()
    def decode(self, x0: Tensor) -> Tensor:
        vae_dtype = next(self.vae.parameters()).dtype
        images = self.vae.decode((x0 / self.scaling_factor + self.shift_factor).to(vae_dtype)).sample
        return images.float().clamp(-1.0, 1.0)
