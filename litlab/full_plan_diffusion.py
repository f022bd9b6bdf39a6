"""Full-scale estimates of the diffusion methods: SCNS on Stable Diffusion 1.5 (the UNet, VAE encoder counted on the
meta device) and LiteVSR on Wan2.1 (the DiT by formula, its VAE on the meta device); see ``litlab.full_plan``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from litlab.full_plan_base import Estimate, compute_dtype, get
from litlab.full_plan_estimators import memory, model_label, n_params
from litlab.full_plan_formulas import MatmulWeights, Stack, lm_activation_bytes, lm_flops
from litlab.full_plan_others import meta_train_step
from litlab.model_shapes import build_on_meta

Config = dict[str, Any]


# ---- diffusion -------------------------------------------------------------------------------------
def scns(cfg: Config) -> Estimate:
    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    repo = str(m.get("pretrained_path", "stable-diffusion-v1-5/stable-diffusion-v1-5"))
    unet, text, vae = (build_on_meta(f"{repo}:{part}") for part in ("unet", "text_encoder", "vae"))
    unet.requires_grad_(False)
    kv = [mod for name, mod in unet.named_modules() if name.endswith(("attn2.to_k", "attn2.to_v"))]
    for mod in kv:
        mod.weight.requires_grad_(True)
    unet.half()
    batch, size = int(d.get("batch_size", 2)), int(d.get("image_size", 512)) // 8
    flops, saved = meta_train_step(
        unet,
        lambda: (
            torch.empty(batch, 4, size, size, dtype=torch.half),
            torch.tensor([500] * batch),
            torch.empty(batch, 77, 768, dtype=torch.half, requires_grad=True),
        ),
        train=True,
        key=(repo, "unet", batch, size),
    )
    vae_flops, _ = meta_train_step(
        vae.encoder.half(),
        lambda: (torch.empty(batch, 3, size * 8, size * 8, dtype=torch.half),),
        train=False,
        key=(repo, "vae", batch, size),
    )
    tw = MatmulWeights.of(text.requires_grad_(False), input_needs_grad=True)
    text_flops = lm_flops(tw, Stack.of(text.config, vocab=0, gated_mlp=False), batch, 77, train=True)
    steps = int(d.get("num_concepts", 1)) * int(d.get("steps_per_task", 1))
    rows = sum(mod.weight.shape[0] for mod in kv)
    selected = int(get(m, "select.budget_frac", 0.01) * rows) * 768 + int(d.get("num_concepts", 1)) * 768
    kv_weights = sum(mod.weight.numel() for mod in kv)
    total = n_params(unet) + n_params(text) + n_params(vae)
    weights, _, _ = memory(total, 0, 4, 4, 0)
    return Estimate(
        [model_label(f"{repo}:unet", unet), "CLIP ViT-L/14 text encoder", "AutoencoderKL"],
        [f"CIFC {d.get('num_concepts')} concepts, {d.get('image_size')} px"],
        total,
        selected,
        weights,
        kv_weights * 4,
        kv_weights * 4 * 2,
        saved,
        (flops + vae_flops + text_flops) * steps,
        f"{steps:,} steps of {batch} images ({d.get('steps_per_task')} per concept)",
        compute_dtype(cfg),
        flops_method="meta-device count",
        notes=[
            "gradients and Adam state over the whole K/V matrices (the selection masks rows)",
            "the selection's probes and Fisher samples per concept not counted",
        ],
    )


class _Encoder(nn.Module):
    """A VAE's encoder as a module whose forward is the latent mean (what the meta-device count runs)."""

    def __init__(self, vae: Any) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.vae.encode(x).latent_dist.mean


def litevsr(cfg: Config) -> Estimate:
    from litlab.lit_modules.diffusion.state_aware_adapter import AdapterConfig, StateAwareAdapter

    m, d = get(cfg, "model.init_args"), get(cfg, "data.init_args") or {}
    repo = str(m.get("pretrained_path"))
    dit = build_on_meta(f"{repo}:transformer").requires_grad_(False)
    adapter_cfg: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in (m.get("adapter") or {}).items()
    }
    with torch.device("meta"):
        adapter = StateAwareAdapter(AdapterConfig(**adapter_cfg), 16, (1, 2, 2), 1536)
    frames, (height, width) = int(d.get("frames", 33)), d.get("crop", [480, 832])
    tokens = ((frames - 1) // 4 + 1) * (height // 16) * (width // 16)
    layers, hidden = len(dit.blocks), dit.config.num_attention_heads * dit.config.attention_head_dim
    stack = Stack(
        layers,
        hidden,
        dit.config.num_attention_heads,
        dit.config.attention_head_dim,
        dit.config.num_attention_heads,
        dit.config.ffn_dim,
        0,
        gated_mlp=False,
    )
    w = MatmulWeights.of(dit, input_needs_grad=True)
    cross = 4 * layers * tokens * 512 * hidden * 3  # cross-attention to 512 text tokens, forward + backward
    step = lm_flops(w, stack, 1, tokens, train=True, recompute=True) + cross
    n_adapter = n_params(adapter)
    adapter_blocks = sum(int(m.get("adapter", {}).get(k, 1)) for k in ("n_struct", "n_refine", "n_fuse"))
    adapter_attention = 4 * adapter_blocks * tokens * tokens * int(adapter_cfg.get("width", 1536))
    step += 6 * n_adapter * tokens + 3 * adapter_attention
    # self-conditioning: with probability self_cond_prob one more forward, without gradients
    forward = (
        lm_flops(w, stack, 1, tokens, train=False) + cross // 3 + 2 * n_adapter * tokens + adapter_attention
    )
    step += float(m.get("self_cond_prob", 0.0)) * forward
    # the HQ clip and the bicubic-upsampled LQ clip are encoded by the frozen VAE every step (vsr.training_step)
    vae = build_on_meta(f"{repo}:vae")  # counted in fp32 on the meta device: the FLOPs do not depend on it
    encode, _ = meta_train_step(
        _Encoder(vae),
        lambda: (torch.empty(1, 3, frames, height, width),),
        train=False,
        key=(repo, "vae-encode", frames, height, width),
    )
    step += 2 * encode
    steps = int(d.get("steps", 1))
    dtype = compute_dtype(cfg)
    one_block = lm_activation_bytes(
        Stack(**{**stack.__dict__, "layers": 1}),
        w,
        1,
        tokens,
        dtype,
        trained=False,
        fp32_residual=True,
        with_loss=False,
    )
    activations = layers * tokens * hidden * 4 + one_block
    total = n_params(dit) + n_params(vae)
    weights, grads, optim = memory(total + n_adapter, n_adapter, 4, 4, 2)
    return Estimate(
        [model_label(f"{repo}:transformer", dit), "AutoencoderKLWan", f"State-Aware Adapter ({n_adapter:,})"],
        [f"REDS clips, {frames} x {height} x {width} crops ({tokens:,} latent tokens)"],
        total + n_adapter,
        n_adapter,
        weights,
        grads,
        optim,
        activations,
        step * steps,
        f"{steps:,} steps of 1 clip",
        dtype,
        flops_method="formula; the VAE a meta-device count",
        notes=[
            "backbone blocks checkpointed (one forward recomputed); two VAE encodings a step (HQ, upsampled LQ: "
            f"{2 * encode / 1e12:.0f} TFLOP, meta-device count) and the self-conditioning forward included; the "
            "umT5 prompt embedding (once) not counted; the adapter's hints counted as gradients through every "
            "backbone block"
        ],
    )


DIFFUSION_ESTIMATORS: dict[str, Callable[[Config], Estimate]] = {"SCNS": scns, "LiteVSR": litevsr}
