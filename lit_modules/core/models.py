"""Tiny model factories that build offline, for tests and quick experiments.

Module names are part of the contract: adapter methods (LoRA-style injection) find
their target layers by these names, so renaming a submodule breaks them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import transformers
from torch import nn


def _check_heads(width: int, heads: int, width_name: str, heads_name: str) -> None:
    if heads <= 0 or width % heads != 0:
        raise ValueError(
            f"{width_name}={width} must be divisible by {heads_name}={heads} (and {heads_name} > 0)"
        )


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        # Separate q/k/v projections (not fused) so adapters can target each one by name.
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (
            proj(x).view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, C))


class GPTMLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_model, hidden)
        self.down_proj = nn.Linear(hidden, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down_proj(F.gelu(self.up_proj(x))))


class GPTBlock(nn.Module):
    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = GPTMLP(d_model, mlp_ratio * d_model, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Pre-LN decoder-only transformer with learned positions: `[B, T]` ids -> `[B, T, V]` logits."""

    def __init__(
        self,
        vocab_size: int = 97,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        mlp_ratio: int = 4,
        block_size: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        _check_heads(d_model, n_heads, "d_model", "n_heads")
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(GPTBlock(d_model, n_heads, mlp_ratio, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        if T > self.block_size:
            raise ValueError(f"sequence length T={T} exceeds block_size={self.block_size}")
        pos = torch.arange(T, device=input_ids.device)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def tiny_llama(
    vocab_size: int = 97,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_positions: int = 512,
) -> transformers.LlamaForCausalLM:
    """A randomly initialised Llama built from a config, so nothing is downloaded."""
    _check_heads(hidden_size, num_heads, "hidden_size", "num_heads")
    _check_heads(num_heads, num_kv_heads, "num_heads", "num_kv_heads")
    # attn_implementation is PreTrainedConfig's keyword (its __post_init__ takes it), not in LlamaConfig's signature
    config = transformers.LlamaConfig(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return transformers.LlamaForCausalLM(config)


class ViTAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        # Fused qkv mirrors timm/OpenCLIP naming, which adapter configs for ViTs target.
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(y.transpose(1, 2).reshape(B, N, C))


class ViTMLP(nn.Module):
    def __init__(self, width: int, mlp_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class ViTBlock(nn.Module):
    def __init__(self, width: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = ViTAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = ViTMLP(width, mlp_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyViT(nn.Module):
    """Pre-LN ViT with a CLS token.

    Image mode: input `[B, C, H, W]`, cut into flattened patches. Token mode (`token_dim` set):
    input is already a sequence `[B, num_tokens, token_dim]`, e.g. features from another encoder.
    """

    def __init__(
        self,
        image_size: int = 8,
        patch_size: int = 2,
        in_channels: int = 1,
        width: int = 64,
        depth: int = 2,
        heads: int = 4,
        mlp_dim: int = 128,
        num_classes: int = 0,
        token_dim: int | None = None,
        num_tokens: int | None = None,
    ) -> None:
        super().__init__()
        _check_heads(width, heads, "width", "heads")
        self.token_mode = token_dim is not None
        if token_dim is not None:
            if num_tokens is None or num_tokens <= 0:
                raise ValueError(f"token mode (token_dim={token_dim}) needs num_tokens > 0, got {num_tokens}")
            seq_len, in_dim = num_tokens, token_dim
        else:
            if image_size % patch_size != 0:
                raise ValueError(f"image_size={image_size} must be divisible by patch_size={patch_size}")
            seq_len, in_dim = (image_size // patch_size) ** 2, in_channels * patch_size**2
        self.patch_size = patch_size
        self.seq_len = seq_len
        self.embed = nn.Linear(in_dim, width)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.pos_emb = nn.Parameter(torch.randn(1, seq_len + 1, width) * 0.02)
        self.blocks = nn.ModuleList(ViTBlock(width, heads, mlp_dim) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes) if num_classes > 0 else nn.Identity()

    def _to_tokens(self, x: torch.Tensor) -> torch.Tensor:
        if self.token_mode:
            return x
        B, C, H, W = x.shape
        p = self.patch_size
        if H % p or W % p:
            raise ValueError(f"image size {H}x{W} is not divisible by patch_size={p}")
        patches = x.view(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
        return patches.reshape(B, (H // p) * (W // p), C * p * p)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self._to_tokens(x)
        if tokens.shape[1] != self.seq_len:
            raise ValueError(f"got {tokens.shape[1]} tokens/patches, model was built for {self.seq_len}")
        h = self.embed(tokens)
        h = torch.cat([self.cls_token.expand(h.shape[0], -1, -1), h], dim=1) + self.pos_emb
        for block in self.blocks:
            h = block(h)
        return self.ln_f(h[:, 0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


class TinyCNN(nn.Module):
    """Two conv blocks + global average pooling, so any input size >= 4x4 works (8x8 digits, 28x28 MNIST)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
