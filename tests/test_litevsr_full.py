"""LiteVSR's full-scale (latent) loop end to end without downloads: a tiny diffusers-layout Wan checkpoint
(WanTransformer3DModel, AutoencoderKLWan, UMT5EncoderModel, a word-level tokenizer written here,
FlowMatchEulerDiscreteScheduler, model_index.json) and a tiny REDS-style folder of PNG frames (the card's stand-in
writers, ``litlab.lit_modules.diffusion.standin``), fitted through
``litlab fit --config configs/litevsr/full.yaml`` with small overrides. Wan2.1-T2V-1.3B itself is never loaded here;
the offline failure of the real config is ``test_litevsr.test_full_config_fails_offline_naming_the_model``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from litlab.lit_modules.diffusion.standin import TEXT_LEN, litevsr_args, write_reds, write_tiny_wan

ROOT = Path(__file__).resolve().parents[1]


def full_config_args(tmp_path: Path, wan: Path, root: Path) -> list[str]:
    """``litlab fit --config configs/litevsr/full.yaml`` on the CPU with the tiny checkpoint and REDS folder: the
    stand-in's overrides (5-frame 32×32 crops, latents 2 × 8 × 8, 32 tokens; 2 training steps; validation on 1 clip
    with K = 1, 2), a learning rate of 1e-3 and clip 000 kept out of training."""
    return [
        "fit",
        f"--config={ROOT / 'configs/litevsr/full.yaml'}",
        f"--runs_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false",
        *litevsr_args(wan, root),
        "--model.init_args.lr=1e-3",
        '--data.init_args.exclude_clips=["000"]',
    ]


def test_wan_latent_backbone_encodes_as_the_wan_pipelines(tmp_path, monkeypatch):
    """Latents normalised with the VAE config's latents_mean / latents_std (diffusers' Wan convention), decoded
    back to the clip's geometry; the empty prompt's embedding zero after its end token; clear geometry errors."""
    from litlab.lit_modules.diffusion.dit import WanLatentBackbone, load_wan

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    wan = write_tiny_wan(tmp_path / "tiny-wan")
    parts = load_wan(str(wan))
    vae = parts["vae"]
    bb = WanLatentBackbone(parts)
    assert bb.channels == 16 and bb.patch_size == (1, 2, 2) and (bb.scale_t, bb.scale_s) == (4, 4)
    clip = torch.rand(2, 3, 5, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    z = bb.encode(clip)
    assert z.shape == bb.latent_shape(tuple(clip.shape)) == (2, 16, 2, 8, 8)
    mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
    raw = vae.encode(clip).latent_dist.mode()
    assert torch.allclose(z, (raw - mean) * (1.0 / std), atol=1e-5)
    out = bb.decode(z)
    assert out.shape == clip.shape and out.abs().max() <= 1
    assert torch.allclose(out, vae.decode(raw).sample.clamp(-1, 1), atol=1e-5)
    text = bb.text(3)
    assert text.shape == (3, TEXT_LEN, 16)  # the tokenizer's 8 positions: "" -> </s> then padding
    assert text[:, 0].abs().sum() > 0 and torch.equal(text[:, 1:], torch.zeros_like(text[:, 1:]))
    with pytest.raises(ValueError, match="frames must be 1 \\+ 4k"):
        bb.encode(clip[:, :, :4])
    with pytest.raises(ValueError, match="multiples of 8"):
        bb.encode(clip[..., :28])


def test_full_config_fits_a_tiny_wan_layout_checkpoint(tmp_path, monkeypatch):
    """``litlab fit --config configs/litevsr/full.yaml`` on the tiny checkpoint and a 3-clip REDS folder: the adapter
    trains on VAE latents (16 channels, patch (1, 2, 2) from the loaded configs), the transformer and the VAE stay
    bit-identical (the config's FrozenParamGuard), PSNR / SSIM / TDE are logged at every K and the frame grid's
    clips are decoded to the crop's pixels."""
    from safetensors.torch import load_file

    from litlab.cli import LitlabCLI
    from litlab.lit_modules.diffusion.dit import WanLatentBackbone
    from litlab.lit_modules.diffusion.report import SAMPLES_FILE

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    wan = write_tiny_wan(tmp_path / "tiny-wan")
    root = write_reds(tmp_path / "REDS")
    cli = LitlabCLI(args=full_config_args(tmp_path, wan, root))
    trainer, model = cli.trainer, cli.model
    assert trainer.state.finished and trainer.global_step == 2
    assert isinstance(model.backbone, WanLatentBackbone)
    assert not hasattr(model.backbone, "text_encoder")  # used once for the empty prompt, not kept
    assert model.conditioner.adapter.struct.embed.in_channels == 16
    assert model.transformer.gradient_checkpointing  # always at full scale
    (guard,) = [c for c in trainer.callbacks if type(c).__name__ == "FrozenParamGuard"]
    names = list(guard.before["backbone"])
    assert any(n.startswith("backbone.transformer.") for n in names)
    assert any(n.startswith("backbone.vae.") for n in names)
    assert guard.changed(model) == {"backbone": []}
    assert all(not p.requires_grad for p in model.backbone.parameters())
    m = trainer.callback_metrics
    for k in ("k1", "k2", "bicubic"):
        for key in ("psnr", "ssim", "tde"):
            assert torch.isfinite(m[f"val/{key}_{k}"]), (key, k)
    assert torch.isfinite(m["val/psnr_gap_k2_k1"]) and float(m["val/backbone_changed"]) == 0
    assert 0 < float(m["val/trainable_frac"])
    # the adapter trained: its hint projections left zero
    assert any(
        p.abs().sum() > 0 for n, p in model.conditioner.named_parameters() if n.startswith("adapter.zero.")
    )
    samples = load_file(str(cli.run_dir / SAMPLES_FILE))
    assert set(samples) == {"hq", "lq_nearest", "bicubic", "sr_k1", "sr_k2"}
    assert all(v.shape == (1, 3, 5, 32, 32) for v in samples.values())
    assert all(v.abs().max() <= 1 for v in samples.values())
    # checkpoints hold the trained tensors, not the frozen backbone (it is pretrained_path's); a strict load of
    # one takes the backbone from the loaded model
    ckpt = torch.load(cli.run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    keys = list(ckpt["state_dict"])
    assert keys and not any(k.startswith("backbone.") for k in keys)
    assert any(k.startswith("conditioner.adapter.zero.") for k in keys)
    trained = {k: v.clone() for k, v in model.conditioner.state_dict().items()}
    with torch.no_grad():
        for p in model.conditioner.parameters():
            p.zero_()
    model.load_state_dict(ckpt["state_dict"])  # strict
    assert all(torch.equal(v, model.conditioner.state_dict()[k]) for k, v in trained.items())


def test_gradient_checkpointing_gives_the_same_adapter_gradients(tmp_path, monkeypatch):
    """The hint hooks fire inside diffusers' checkpointed block calls: with the frozen blocks recomputed in the
    backward pass, the adapter's gradients equal those of the plain backward."""
    from litlab.lit_modules.diffusion.dit import WanLatentBackbone, load_wan
    from litlab.lit_modules.diffusion.flow_matching import FlowMatchingObjective
    from litlab.lit_modules.diffusion.litevsr import AdapterHints
    from litlab.lit_modules.diffusion.state_aware_adapter import AdapterConfig, StateAwareAdapter

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bb = WanLatentBackbone(load_wan(str(write_tiny_wan(tmp_path / "tiny-wan")))).requires_grad_(False).eval()
    t = bb.transformer
    torch.manual_seed(0)
    cfg = AdapterConfig(width=16, heads=2, inject_layers=(0, 1), freq_dim=16, rope_max_seq_len=32)
    cond = AdapterHints(StateAwareAdapter(cfg, bb.channels, bb.patch_size, t.patch_embedding.out_channels), t)
    with torch.no_grad():  # non-zero hint projections, so the gradients reach every adapter tensor
        for z in cond.adapter.zero:
            z.weight.normal_(0, 0.02)
    g = torch.Generator().manual_seed(1)
    z0, z_lq, eps = (torch.randn(2, 16, 2, 8, 8, generator=g) for _ in range(3))
    sigma, obj = torch.tensor([0.3, 0.8]), FlowMatchingObjective(3.0)

    def grads() -> dict[str, torch.Tensor]:
        cond.zero_grad(set_to_none=True)
        x = obj.noised(z0, eps, sigma)
        v = cond.velocity(t, bb.text(2), x, sigma, cond.prepare(z_lq), z_lq)
        obj.loss(v, z0, eps).backward()
        return {n: p.grad.clone() for n, p in cond.named_parameters() if p.grad is not None}

    calls = []
    t.blocks[1].register_forward_pre_hook(lambda module, args: calls.append(1))
    plain = grads()
    assert len(calls) == 1
    t.enable_gradient_checkpointing()
    recomputed = grads()
    assert len(calls) == 3  # block 1 (its input carries block 0's hint) ran again in the backward pass
    assert plain and set(plain) == set(recomputed)
    assert all(torch.allclose(plain[n], recomputed[n], atol=1e-6) for n in plain)
    assert all(p.grad is None for p in t.parameters())


def test_reds_datamodule_serves_the_contract_and_names_bad_folders(tmp_path):
    """HQ / LQ clips in [-1, 1] of the contract's shapes, seeded degradation, ``val_max_clips``; a crop larger than
    a clip's frames and a folder without clips fail at construction, naming them."""
    from litlab.datamodules.paired_video_sr import PairedVideoSRDataModule
    from litlab.lit_modules.core.errors import DatasetUnavailableError
    from litlab.lit_modules.diffusion.contract import VideoSRData, check_data

    root = write_reds(tmp_path / "REDS", clips=("000", "001", "002", "003"))
    kw = dict(root=str(root), frames=5, crop=(32, 32), steps=3, num_workers=0, exclude_clips=["000", "001"])
    dm = PairedVideoSRDataModule(**kw, val_max_clips=1)
    check_data(dm, VideoSRData, "test")
    assert list(dm.val_clips) == ["000"] and list(dm.train_clips) == ["002", "003"]
    (hq, lq), (hq2, lq2) = next(iter(dm.train_dataloader())), next(iter(dm.train_dataloader()))
    assert hq.shape == (1, 3, 5, 32, 32) and lq.shape == (1, 3, 5, 8, 8)
    assert hq.min() >= -1 and hq.max() <= 1 and lq.min() >= -1 and lq.max() <= 1
    assert torch.equal(hq, hq2) and torch.equal(lq, lq2)  # seeded crops and degradation
    (vhq, vlq), *rest = list(dm.val_dataloader())
    assert not rest and vhq.shape == (1, 3, 5, 32, 32) and vlq.shape == (1, 3, 5, 8, 8)
    with pytest.raises(ValueError, match="clip 002 .* smaller than crop 44x44"):
        PairedVideoSRDataModule(**{**kw, "crop": (44, 44)})
    with pytest.raises(ValueError, match="frames must be >= 2"):
        PairedVideoSRDataModule(**{**kw, "frames": 1})
    (tmp_path / "empty" / "000").mkdir(parents=True)
    with pytest.raises(DatasetUnavailableError, match="holds no clip of PNG frames"):
        PairedVideoSRDataModule(**{**kw, "root": str(tmp_path / "empty")})
