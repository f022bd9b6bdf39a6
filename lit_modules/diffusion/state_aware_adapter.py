"""The State-Aware Adapter of LiteVSR ("LiteVSR: Lightweight Adaptation of Frozen Diffusion Transformers for Video
Super-Resolution", Cao et al., ICML 2026, arXiv 2606.09250): a side network whose zero-initialised outputs are
added after a few blocks of a frozen flow-matching video DiT.

Only the roles of the two streams and the time-modulated fusion are the paper's (abstract, project page); the
layout below is **reconstructed** [R] (the method section was not readable), following Wan2.1's blocks (adaLN
``scale_shift_table``, 3-D RoPE; diffusers ``WanTransformer3DModel``), ControlNet's zero-initialised outputs
(arXiv 2302.05543) and self-conditioning (Chen, Zhang & Hinton, "Analog Bits", arXiv 2208.04202).

  1. time embedding  e = MLP(sinusoid(1000·sigma)),  m = Linear(SiLU(e)) ∈ R^{6·d_a}, once per step; each timed
     block adds its own table T_b ∈ R^{6×d_a}: (shift1, scale1, gate1, shift2, scale2, gate2) = T_b + m      [R]
  2. RoPE: diffusers' ``WanRotaryPosEmbed`` of the adapter's head dim, Wan's pairwise rotation on queries and
     keys; structural and refinement tokens share the (f, h, w) grid, so one cos/sin table serves both    [R]
  3. structural stream (static, once per clip):  S = Block_s^{L_s}(PatchEmbed_S(z_lq)), plain pre-LN blocks
  4. refinement stream (every step):  R = Block_r^{L_r}(PatchEmbed_R([x0_in ; x_sigma]); m), adaLN blocks
     R ← R + gate1·Attn(LN(R)(1+scale1)+shift1);  R ← R + gate2·FFN(LN(R)(1+scale2)+shift2)
  5. fusion, L_f blocks: Q from the modulated LN(R); K, V from [LN_k(S) ; modulated LN(R)] (2N keys);
     R ← R + gate1·W_o softmax(QKᵀ/√d_h) V;  R ← R + gate2·FFN(...). Diagnostic: the structural attention mass
     mu(sigma) = mean over heads and queries of Σ_{keys in S} softmax                                       [R]
  6. hints H_j = Z_j(R_{pi(j)}), Z_j = Linear(d_a → D) with weight and bias 0; pi(j) = the last fusion block's
     output (``hint_source: last``) or the fusion outputs spread over the hints (``spread``)               [R]

``refine_input: xt_only`` feeds only x_sigma to the refinement stream (the spec's ablation switch);
``structural_only`` drops the refinement stream, the fusion and the time embedding: H_j = Z_j(S) (the ablation
of the card, time-invariant hints). Attention goes through the shared entry point ``kernels.attention``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litlab.kernels.attention import attention
from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.diffusion.ddpm import diffusers_classes


@config_part
class AdapterConfig:
    """§3.3 hyper-parameters (the quick-scale defaults; full scale: width 1536, 12 heads, ffn 4, 2/1/2 blocks,
    hints after every 3rd of 30 blocks)."""

    width: int = 32
    heads: int = 2
    ffn_ratio: float = 2.0
    n_struct: int = 1
    n_refine: int = 1
    n_fuse: int = 1
    inject_layers: tuple[int, ...] = (0, 2, 4)
    hint_source: Literal["last", "spread"] = "last"
    refine_input: Literal["x0_and_xt", "xt_only"] = "x0_and_xt"
    freq_dim: int = 32
    structural_only: bool = False
    rope_max_seq_len: int = 64


def apply_wan_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Wan's rotation of interleaved pairs, ``(x1, x2) -> (x1 cos − x2 sin, x1 sin + x2 cos)``; x (B, N, H, d),
    cos/sin (1, N, 1, d) repeat-interleaved (diffusers' ``WanAttnProcessor``)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2].to(x.dtype), sin[..., 1::2].to(x.dtype)
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Attention(nn.Module):
    """Multi-head attention with RoPE on queries and keys; the product runs in ``kernels.attention``."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"adapter width {dim} is not divisible by heads={heads}")
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.last_struct_mass: Tensor | None = None

    def forward(
        self, xq: Tensor, xkv: Tensor, rope_q, rope_k, n_struct: int = 0, record: bool = False
    ) -> Tensor:
        h = self.heads
        q = apply_wan_rope(self.q(xq).unflatten(-1, (h, -1)), *rope_q).transpose(1, 2)
        k = apply_wan_rope(self.k(xkv).unflatten(-1, (h, -1)), *rope_k).transpose(1, 2)
        v = self.v(xkv).unflatten(-1, (h, -1)).transpose(1, 2)
        if record and n_struct:
            with torch.no_grad():  # §3.3.5 diagnostic: softmax mass on the structural keys
                p = torch.softmax((q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1]), -1)
                self.last_struct_mass = p[..., :n_struct].sum(-1).mean((1, 2))
        out = attention(q, k, v)
        return self.o(out.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    def __init__(self, dim: int, ratio: float):
        super().__init__()
        hidden = int(round(dim * ratio))
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class StructBlock(nn.Module):
    """Plain pre-LN block (§3.3.3)."""

    def __init__(self, dim: int, heads: int, ffn_ratio: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.ffn = FeedForward(dim, ffn_ratio)

    def forward(self, s: Tensor, rope) -> Tensor:
        n = self.norm1(s)
        s = s + self.attn(n, n, rope, rope)
        return s + self.ffn(self.norm2(s))


class TimedBlock(nn.Module):
    """adaLN-modulated block (§3.3.4); with ``joint_kv`` the fusion block of §3.3.5 (keys/values [LN_k(S); R'])."""

    def __init__(self, dim: int, heads: int, ffn_ratio: float, joint_kv: bool):
        super().__init__()
        self.joint_kv = joint_kv
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.norm_k = nn.LayerNorm(dim, eps=1e-6) if joint_kv else None
        self.attn = Attention(dim, heads)
        self.ffn = FeedForward(dim, ffn_ratio)
        self.table = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)  # Wan's scale_shift_table init

    def forward(self, r: Tensor, m: Tensor, rope, s: Tensor | None = None, record: bool = False) -> Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = (self.table + m).chunk(6, dim=1)
        n = self.norm1(r) * (1 + scale1) + shift1
        if self.joint_kv:
            kv = torch.cat([self.norm_k(s), n], dim=1)
            rope_k = tuple(torch.cat([t, t], dim=1) for t in rope)
            r = r + gate1 * self.attn(n, kv, rope, rope_k, n_struct=s.shape[1], record=record)
        else:
            r = r + gate1 * self.attn(n, n, rope, rope)
        return r + gate2 * self.ffn(self.norm2(r) * (1 + scale2) + shift2)


def patchify(conv: nn.Conv3d, x: Tensor) -> Tensor:
    """(B, C, F, H, W) -> (B, N, D) tokens in the backbone's order: ``conv(x).flatten(2).transpose(1, 2)``."""
    return conv(x).flatten(2).transpose(1, 2)


class StructuralStream(nn.Module):
    """§3.3.3: S = Block_s^{L_s}(PatchEmbed_S(z_lq)); a module of its own so a hook can count its calls."""

    def __init__(self, cfg: AdapterConfig, channels: int, patch_size: tuple[int, int, int]):
        super().__init__()
        self.embed = nn.Conv3d(channels, cfg.width, kernel_size=patch_size, stride=patch_size)
        self.blocks = nn.ModuleList(
            StructBlock(cfg.width, cfg.heads, cfg.ffn_ratio) for _ in range(cfg.n_struct)
        )

    def forward(self, z_lq: Tensor, rope) -> Tensor:
        s = patchify(self.embed, z_lq)
        for block in self.blocks:
            s = block(s, rope)
        return s


class StateAwareAdapter(nn.Module):
    """A_phi of §3.3: ``structural(z_lq)`` once per clip, ``hints(S, x0_in, x_sigma, sigma)`` every step."""

    def __init__(
        self, cfg: AdapterConfig, channels: int, patch_size: tuple[int, int, int], backbone_dim: int
    ):
        super().__init__()
        self.cfg = cfg
        patch_size = tuple(patch_size)
        diffusers_classes("WanTransformer3DModel")  # imports diffusers the family's way first
        from diffusers.models.embeddings import Timesteps
        from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

        head_dim = cfg.width // cfg.heads
        self.rope = WanRotaryPosEmbed(head_dim, patch_size, cfg.rope_max_seq_len)  # parameter-free
        self.struct = StructuralStream(cfg, channels, patch_size)
        if not cfg.structural_only:
            self.time_proj = Timesteps(cfg.freq_dim, flip_sin_to_cos=True, downscale_freq_shift=0)
            self.time_mlp = nn.Sequential(
                nn.Linear(cfg.freq_dim, cfg.width), nn.SiLU(), nn.Linear(cfg.width, cfg.width)
            )
            self.time_mod = nn.Linear(cfg.width, 6 * cfg.width)
            in_r = channels if cfg.refine_input == "xt_only" else 2 * channels
            self.refine_embed = nn.Conv3d(in_r, cfg.width, kernel_size=patch_size, stride=patch_size)
            self.refine = nn.ModuleList(
                TimedBlock(cfg.width, cfg.heads, cfg.ffn_ratio, joint_kv=False) for _ in range(cfg.n_refine)
            )
            self.fuse = nn.ModuleList(
                TimedBlock(cfg.width, cfg.heads, cfg.ffn_ratio, joint_kv=True) for _ in range(cfg.n_fuse)
            )
            if cfg.n_fuse < 1:
                raise ValueError(f"n_fuse must be >= 1 (the hints read a fusion block), got {cfg.n_fuse}")
        self.zero = nn.ModuleList(nn.Linear(cfg.width, backbone_dim) for _ in cfg.inject_layers)
        for z in self.zero:  # §3.3.6: zero-initialised hint projections (identity at the start)
            nn.init.zeros_(z.weight)
            nn.init.zeros_(z.bias)

    def rotary(self, z: Tensor):
        return self.rope(z)

    def structural(self, z_lq: Tensor) -> Tensor:
        return self.struct(z_lq, self.rotary(z_lq))

    def time_modulation(self, sigma: Tensor) -> Tensor:
        e = self.time_mlp(self.time_proj(sigma * 1000.0).to(self.time_mod.weight.dtype))
        return self.time_mod(F.silu(e)).unflatten(1, (6, -1))  # (B, 6, d_a), once per step

    def hints(
        self, s: Tensor, x0_in: Tensor, x_sigma: Tensor, sigma: Tensor, record: bool = False
    ) -> list[Tensor]:
        cfg = self.cfg
        if cfg.structural_only:
            return [z(s) for z in self.zero]
        rope = self.rotary(x_sigma)
        m = self.time_modulation(sigma)
        r_in = x_sigma if cfg.refine_input == "xt_only" else torch.cat([x0_in, x_sigma], dim=1)
        r = patchify(self.refine_embed, r_in)
        for block in self.refine:
            r = block(r, m, rope)
        outs = []
        for block in self.fuse:
            r = block(r, m, rope, s=s, record=record)
            outs.append(r)
        if cfg.hint_source == "last":
            sources = [outs[-1]] * len(self.zero)
        else:  # spread the fusion outputs over the hints in order
            sources = [outs[j * len(outs) // len(self.zero)] for j in range(len(self.zero))]
        return [z(src) for z, src in zip(self.zero, sources)]

    def struct_attn_mass(self) -> Tensor | None:
        """Mean structural attention mass (B,) of the fusion blocks in the last ``record=True`` call."""
        if self.cfg.structural_only:
            return None
        masses = [b.attn.last_struct_mass for b in self.fuse if b.attn.last_struct_mass is not None]
        return torch.stack(masses).mean(0) if masses else None
