"""Backbones for the continual-learning protocol: a TinyViT pre-trained locally without labels (quick), a
Hugging Face ViT or the locally pre-trained TinyGPT behind the same ``forward_features`` (full scale,
text)."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
import transformers
from torch import Tensor, nn

from litlab.lit_modules.core.hf import load_from_folder_cache_or_hub
from litlab.lit_modules.core.models import TinyViT
from litlab.lit_modules.core.pretrain import pretrained_tiny_gpt, train_and_cache


# ---- a backbone pre-trained locally without labels -------------------------------------------------------
def _pretext(x: Tensor, k: int, kind: str) -> Tensor:
    """RotNet for images (rotate by k·90°); for token sequences, k ∈ {id, reverse, negate, reverse+negate}."""
    if kind == "image":
        return torch.rot90(x, k, dims=(2, 3))
    flat = x.reshape(x.shape[0], -1)
    flat = flat.flip(1) if k % 2 else flat
    return (-flat if k >= 2 else flat).reshape(x.shape)


def pretrained_backbone(
    inputs: Tensor,
    kind: Literal["image", "tokens"],
    width: int = 64,
    depth: int = 2,
    heads: int = 4,
    mlp_dim: int = 128,
    epochs: int = 30,
    lr: float = 3e-3,
    seed: int = 0,
) -> TinyViT:
    """TinyViT trained on a 4-way pretext task over the *unlabelled* training inputs (no class information
    leaks), pretext head discarded; cached in LITLAB_CACHE keyed by data and arguments. ``seed`` (init and batch
    order) makes the backbone a seeded family: the harness passes the run's ``backbone`` stream
    (``core.seeding.derive_seed``), so every run seed has its own backbone. For images the pretext
    is rotation prediction ("Unsupervised Representation Learning by Predicting Image Rotations", Gidaris,
    Singh & Komodakis, ICLR 2018)."""
    shape = tuple(inputs.shape[1:])
    args = dict(
        recipe="all-four-pretext-views",
        shape=shape,
        kind=kind,
        width=width,
        depth=depth,
        heads=heads,
        mlp_dim=mlp_dim,
        epochs=epochs,
        lr=lr,
        seed=seed,
        n=inputs.shape[0],
        checksum=round(float(inputs.double().sum()), 4),
    )

    def build() -> TinyViT:
        if kind == "image":
            return TinyViT(
                image_size=shape[-1],
                patch_size=2,
                in_channels=1,
                width=width,
                depth=depth,
                heads=heads,
                mlp_dim=mlp_dim,
            )
        return TinyViT(
            width=width, depth=depth, heads=heads, mlp_dim=mlp_dim, token_dim=shape[1], num_tokens=shape[0]
        )

    def train(vit: TinyViT) -> None:
        pretext_head = nn.Linear(width, 4)
        params = list(vit.parameters()) + list(pretext_head.parameters())
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.05)
        gen = torch.Generator().manual_seed(seed)
        for _ in range(epochs):  # every image in all four pretext versions, 128 samples per batch
            for idx in torch.randperm(inputs.shape[0], generator=gen).split(32):
                x = torch.cat([_pretext(inputs[idx], j, kind) for j in range(4)])
                target = torch.arange(4).repeat_interleave(idx.numel())
                loss = F.cross_entropy(pretext_head(vit.forward_features(x)), target)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

    # 1 thread: the backbone the cards' recorded numbers were measured on
    return train_and_cache("cl_backbone", args, seed, build, train, threads=1)


class HFViTFeatures(nn.Module):
    """A Hugging Face ``ViTModel`` (full scale) behind TinyViT's ``forward_features``: the final [CLS] after
    the last LayerNorm. Adapter targets are its module names (transformers 5: ``q_proj``, ``k_proj``,
    ``v_proj``, ``fc1``)."""

    def __init__(self, model_id: str):
        super().__init__()
        self.vit = load_from_folder_cache_or_hub(
            transformers.ViTModel.from_pretrained, model_id, None, "ViT backbone", add_pooling_layer=False
        )
        self.width = self.vit.config.hidden_size

    def forward_features(self, x: Tensor) -> Tensor:
        return self.vit(pixel_values=x).last_hidden_state[:, 0]


class TinyGPTFeatures(nn.Module):
    """The text backbone: a TinyGPT pre-trained locally on the first half of the docstring corpus
    (``pretrained_tiny_gpt``, no labels; ``seed`` its init and windows), features = mean over tokens of the final
    LayerNorm output. Adapter targets: ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``up_proj``,
    ``down_proj``."""

    def __init__(self, d_model: int, seed: int):
        super().__init__()
        self.gpt = pretrained_tiny_gpt(d_model=d_model, seed=seed)

    def forward_features(self, ids: Tensor) -> Tensor:
        g = self.gpt
        x = g.tok_emb(ids) + g.pos_emb(torch.arange(ids.shape[1], device=ids.device))
        for block in g.blocks:
            x = block(x)
        return g.ln_f(x).mean(1)


def check_backbone_available(backbone: str) -> None:
    """Full scale: fail at once (ModelUnavailableError with what to download) if the HF backbone is not
    here."""
    if backbone == "tinyvit":
        return
    load_from_folder_cache_or_hub(transformers.AutoConfig.from_pretrained, backbone, None, "ViT backbone")


# ---- the harness = sequential LoRA ----------------------------------------------------------------------
