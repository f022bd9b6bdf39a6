"""LiteVSR (ICML 2026, arXiv 2606.09250): the acceptance checks of its reconstruction (spec §7), on tiny sizes.

§7.1 zero-init identity, §7.2 freezing (bit-identical backbone, no grads, optimizer holds the adapter only, the
logged trainable fraction equals an independent count, toy and full-scale fractions in range), §7.3 flow
identities against diffusers' FlowMatchEulerDiscreteScheduler, §7.4 call counts, §7.5 token alignment, §7.6
gradient flow and loss decrease, §7.8 live time modulation; plus the shared attention entry point, the data
module, the temporal-difference metric and the configs. The effect checks (§7.7) are the card's claims
(``litlab repro litevsr``).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from litlab.callbacks.frozen_guard import FrozenParamGuard
from litlab.callbacks.trainable_fraction import TrainableFractionLogger
from litlab.lit_modules.diffusion.dit import TinyDiT, TinyDiTConfig, wan_transformer
from litlab.lit_modules.diffusion.flow_matching import FlowMatchingObjective
from litlab.lit_modules.diffusion.hints import BlockHintInjector
from litlab.lit_modules.diffusion.litevsr import AdapterHints, LiteVSR
from litlab.lit_modules.diffusion.state_aware_adapter import AdapterConfig, StateAwareAdapter
from litlab.lit_modules.diffusion.vsr import TemporalDifferenceError, run_backbone
from litlab.model_shapes import MODEL_SHAPES

ROOT = Path(__file__).resolve().parents[1]
# small enough for milliseconds per forward: F = 2 frames of 16×16, patch (1, 4, 4) -> 32 tokens
SMALL = TinyDiTConfig(pretrain_steps=2, pretrain_batch=2)


def tiny_backbone(seed: int = 0) -> TinyDiT:
    torch.manual_seed(seed)
    model = TinyDiT(SMALL)
    # the Wan init leaves proj_out and the gates random: perturb every tensor so nothing is trivially zero
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return model.eval().requires_grad_(False)


def adapter_for(bb: TinyDiT, **kw) -> StateAwareAdapter:
    cfg = AdapterConfig(**kw)
    return StateAwareAdapter(cfg, 3, SMALL.patch_size, bb.transformer.patch_embedding.out_channels)


def clip(b=2, f=2, s=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, 3, f, s, s, generator=g) * 2 - 1


# ---- §7.1 zero-init identity -------------------------------------------------------------------------
def test_zero_init_identity():
    bb = tiny_backbone()
    cond = AdapterHints(adapter_for(bb), bb.transformer)
    x, z_lq = clip(seed=1), clip(seed=2)
    sigma = torch.tensor([0.3, 0.9])
    text = bb.text(2)
    plain = run_backbone(bb.transformer, text, x, sigma)
    state = cond.prepare(z_lq)
    adapted = cond.velocity(bb.transformer, text, x, sigma, state, z_lq)
    assert (adapted - plain).abs().max() <= 1e-6
    # and the hook leaves nothing behind outside its block
    assert torch.equal(run_backbone(bb.transformer, text, x, sigma), plain)


# ---- §7.3 flow identities -----------------------------------------------------------------------------
def test_flow_identities_against_the_diffusers_scheduler():
    obj = FlowMatchingObjective(3.0)
    g = torch.Generator().manual_seed(0)
    z0, eps = torch.randn(3, 3, 2, 4, 4, generator=g), torch.randn(3, 3, 2, 4, 4, generator=g)
    sigma = torch.tensor([0.1, 0.5, 0.97])
    x = obj.noised(z0, eps, sigma)
    assert (obj.x0_hat(x, sigma, obj.target(z0, eps)) - z0).abs().max() <= 1e-6
    x1 = obj.noised(z0, eps, 1.0)
    assert (obj.euler(x1, 1.0, 0.0, obj.target(z0, eps)) - z0).abs().max() <= 1e-6
    sched = obj.scheduler
    for i in (0, 137, 999):
        t = sched.timesteps[i : i + 1]
        s = float(sched.sigmas[i])
        want = (1 - s) * z0[:1] + s * eps[:1]
        assert (sched.scale_noise(z0[:1], t, eps[:1]) - want).abs().max() <= 1e-6
    assert obj.grid(1).tolist() == [1.0, 0.0]
    assert obj.grid(4).tolist() == pytest.approx([1.0, 0.8577, 0.6022, 0.0089, 0.0], abs=1e-4)
    # the sampler walks the scheduler's grid: with the true velocity of a fixed (z0, eps) every K lands on z0
    for k in (1, 4):
        seen: list[float] = []

        def true_velocity(x, s, i, seen=seen):
            seen.append(float(s[0]))
            return eps - z0

        out = obj.euler_sample(true_velocity, eps.clone(), k)
        assert seen == pytest.approx(obj.grid(k)[:-1].tolist())
        assert (out - z0).abs().max() <= 1e-5
    # training sigmas: logit-normal then shifted, inside (0, 1)
    s = obj.sample_sigma(10_000, torch.Generator().manual_seed(1))
    assert 0 < float(s.min()) and float(s.max()) < 1
    assert float(s.median()) == pytest.approx(0.75, abs=0.02)  # shift_3(0.5) = 0.75


# ---- §7.4 call counts ----------------------------------------------------------------------------------
class _Counter:
    def __init__(self, module):
        self.n = 0
        module.register_forward_hook(self)

    def __call__(self, *args):
        self.n += 1


def module_for(bb: TinyDiT, **kw) -> LiteVSR:
    model = LiteVSR(backbone=SMALL, **kw)
    model.backbone = bb
    model.scale = 4
    model.conditioner = model.build_conditioner()
    return model


@pytest.mark.parametrize("k", [1, 4])
def test_sampling_calls_structure_once_and_backbone_k_times(k):
    bb = tiny_backbone()
    model = module_for(bb)
    structural = _Counter(model.conditioner.adapter.struct)
    backbone = _Counter(bb.transformer)
    z_lq = clip(seed=3)
    masses = []
    model.sample(z_lq, k, torch.randn_like(z_lq), masses)
    assert (structural.n, backbone.n) == (1, k)
    assert len(masses) == k  # the structural attention mass of every step


class _FakeOpt:
    def zero_grad(self, set_to_none=True): ...

    def step(self): ...


@pytest.mark.parametrize("p_sc, calls", [(0.0, 1), (1.0, 2)])
def test_training_step_backbone_calls(monkeypatch, p_sc, calls):
    bb = tiny_backbone()
    model = module_for(bb, self_cond_prob=p_sc, grad_clip=0.0)
    monkeypatch.setattr(model, "optimizers", lambda: _FakeOpt())
    monkeypatch.setattr(model, "manual_backward", lambda loss: loss.backward())
    monkeypatch.setattr(model, "log", lambda *a, **k: None)
    structural = _Counter(model.conditioner.adapter.struct)
    backbone = _Counter(bb.transformer)
    model.training_step((clip(seed=4), clip(s=4, seed=5)), 0)
    assert (structural.n, backbone.n) == (1, calls)


# ---- §7.5 token alignment -----------------------------------------------------------------------------
def test_token_alignment_patch_embeds_and_hints():
    bb = tiny_backbone()
    adapter = adapter_for(bb)
    pe_s, pe_b = adapter.struct.embed, bb.transformer.patch_embedding
    with torch.no_grad():  # identity-like: output channel 0 sums the patch
        for conv in (pe_s, pe_b):
            conv.weight.zero_()
            conv.bias.zero_()
            conv.weight[0] = 1.0
    f, r, c = 1, 2, 3  # the (frame, row, col) patch
    z = torch.zeros(1, 3, 2, 16, 16)
    z[:, :, f, 4 * r : 4 * r + 4, 4 * c : 4 * c + 4] = 1.0
    want = f * 16 + r * 4 + c
    for conv in (pe_s, pe_b):
        tokens = conv(z).flatten(2).transpose(1, 2)[0, :, 0]
        assert torch.nonzero(tokens).flatten().tolist() == [want]
    # a hint at token n changes the hooked block's output at token n only
    bb = tiny_backbone()
    inj = BlockHintInjector(bb.transformer.blocks, [2])
    outs = {}
    bb.transformer.blocks[2].register_forward_hook(lambda m, a, o: outs.__setitem__("o", o.clone()))
    x, sigma, text = clip(b=1, seed=6), torch.tensor([0.5]), bb.text(1)
    run_backbone(bb.transformer, text, x, sigma)
    plain = outs["o"]
    hint = torch.zeros_like(plain)
    hint[0, want] = 1.0
    with inj.inject([hint]):
        run_backbone(bb.transformer, text, x, sigma)
    # the observing hook runs after the injector's, so it sees Block(h) + H
    changed = (outs["o"] - plain).abs().amax(-1)[0]
    assert torch.nonzero(changed).flatten().tolist() == [want]


# ---- §7.6 gradient flow --------------------------------------------------------------------------------
def test_gradient_flow_zero_init_then_upstream():
    bb = tiny_backbone()
    model = module_for(bb, self_cond_prob=0.0)
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=1e-2)
    hq, lq = clip(seed=7), clip(s=4, seed=8)

    def step():
        torch.manual_seed(0)
        from litlab.lit_modules.diffusion.contract import bicubic_up

        z0, z_lq = hq, bicubic_up(lq, 4)
        sigma = model.objective.sample_sigma(2)
        eps = torch.randn_like(z0)
        x = model.objective.noised(z0, eps, sigma)
        v = model.velocity(x, sigma, model.conditioner.prepare(z_lq), z_lq)
        loss = model.objective.loss(v, z0, eps)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        return loss

    step()
    named = dict(model.conditioner.adapter.named_parameters())
    zero = [n for n in named if n.startswith("zero.")]
    assert all(named[n].grad.abs().sum() > 0 for n in zero)
    opt.step()
    step()
    dead = [n for n, p in named.items() if p.grad is None or p.grad.abs().sum() == 0]
    assert not dead, dead
    assert all(p.grad is None for p in bb.parameters())


# ---- §7.2 freezing, §7.6 loss decrease, §7.8 time modulation: one short fit -------------------------------
@pytest.fixture(scope="module")
def short_fit(tmp_path_factory):
    import lightning as L

    from litlab.datamodules.synthetic_vsr import SyntheticVSRDataModule
    from litlab.lit_modules.core.seeding import derive_seed
    from litlab.lit_modules.diffusion.dit import pretrained_tiny_dit

    tmp = tmp_path_factory.mktemp("litevsr_fit")
    mp = pytest.MonkeyPatch()
    mp.setenv("LITLAB_CACHE", str(tmp / "cache"))
    dm = SyntheticVSRDataModule(
        frames=2,
        hq_size=16,
        pretrain_clips=16,
        train_clips=8,
        test_clips=4,
        batch_size=4,
        steps=50,
        eval_batch=4,
    )
    model = LiteVSR(backbone=SMALL, lr=3e-3, val_steps=[1, 2])
    losses = []

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))

    L.seed_everything(0)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp / "run"),
        callbacks=[Watch(), FrozenParamGuard(["backbone"]), TrainableFractionLogger("backbone.transformer")],
    )
    trainer.fit(model, datamodule=dm)
    fresh = pretrained_tiny_dit(SMALL, dm, derive_seed("backbone"))  # the cached backbone, as before training
    yield model, trainer, fresh, losses
    mp.undo()


def test_freezing_bit_identical_and_fraction(short_fit):
    model, trainer, fresh, _ = short_fit
    before, after = fresh.state_dict(), model.backbone.state_dict()
    assert list(before) == list(after) and all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None and not p.requires_grad for p in model.backbone.parameters())
    adapter_ids = {id(p) for p in model.conditioner.parameters()}
    held = [p for g in trainer.optimizers[0].param_groups for p in g["params"]]
    assert held and all(id(p) in adapter_ids for p in held) and len(held) == len(adapter_ids)
    phi = sum(p.numel() for p in model.conditioner.adapter.parameters())
    theta = sum(p.numel() for p in model.backbone.transformer.parameters())
    m = trainer.callback_metrics
    assert float(m["val/trainable_frac"]) == pytest.approx(phi / theta, rel=1e-6)
    assert float(m["val/trainable_params"]) == phi
    assert float(m["val/backbone_changed"]) == 0.0
    assert 0.08 <= phi / theta <= 0.16
    for k in (1, 2):
        assert math.isfinite(float(m[f"val/psnr_k{k}"])) and f"val/struct_attn_mass_k{k}_s0" in m
    assert "val/struct_attn_mass_k2_s1" in m
    gap = float(m["val/psnr_k2"]) - float(m["val/psnr_k1"])
    assert float(m["val/psnr_gap_k2_k1"]) == pytest.approx(gap, abs=1e-5)
    assert (Path(trainer.default_root_dir) / "vsr_samples.safetensors").exists()


def test_logged_metrics_match_a_by_hand_computation(short_fit):
    """val/psnr and val/tde of the bicubic input against numpy-level arithmetic: per-frame PSNR (frames in [0, 1],
    mean over frames), and mean |(SR_{t+1} - SR_t) - (HR_{t+1} - HR_t)|."""
    from litlab.datamodules.synthetic_vsr import bicubic_up

    model, trainer, _, _ = short_fit
    psnrs, tde_sum, tde_n = [], 0.0, 0
    for hq, lq in trainer.datamodule.val_dataloader():
        sr = (bicubic_up(lq, 4).clamp(-1, 1).double() + 1) / 2
        hr = (hq.double() + 1) / 2
        mse = ((sr - hr) ** 2).mean(dim=(1, 3, 4))  # (B, F): one number per frame
        psnrs += (10 * torch.log10(1 / mse)).flatten().tolist()
        d = sr.diff(dim=2) - hr.diff(dim=2)
        tde_sum, tde_n = tde_sum + float(d.abs().sum()), tde_n + d.numel()
    m = trainer.callback_metrics
    assert float(m["val/psnr_bicubic"]) == pytest.approx(sum(psnrs) / len(psnrs), abs=1e-4)
    assert float(m["val/tde_bicubic"]) == pytest.approx(tde_sum / tde_n, abs=1e-6)
    assert 0.0 < float(m["val/ssim_bicubic"]) < 1.0


def test_report_hook_tables_metrics_and_draws_the_frame_grid(short_fit, tmp_path):
    import json

    from PIL import Image

    from litlab.lit_modules.core.results import CardResult, RunResult, SeedRun
    from litlab.lit_modules.diffusion.litevsr import report

    _, trainer, _, _ = short_fit
    run_dir = Path(trainer.default_root_dir)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    (run_dir / "summary.json").write_text(json.dumps({"metrics": metrics}))
    seed_run = SeedRun(seed=0, value=metrics["val/psnr_k1"], run_dir=run_dir)
    runs = {
        name: RunResult(name, "val/psnr_k1", [0], [seed_run.value], seed_run.value, 0.0, [seed_run])
        for name in ("bicubic", "litevsr")
    }
    result = CardResult("litevsr", "t", "c", "quick", [0], "val/psnr_k1", "max", runs, "today", 1.0)
    extras = report(result, tmp_path)
    assert f"| litevsr | {metrics['val/psnr_k1']:.4g} ± 0 |" in extras.markdown  # runs by their card names
    (figure,) = extras.figures
    assert figure == tmp_path / "litevsr_frames.png"
    width, height = Image.open(figure).size
    assert height > width  # rows LQ, bicubic, litevsr, HQ over 2 frame columns


def test_loss_decreases(short_fit):
    losses = short_fit[3]
    assert len(losses) == 50
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.8 * first, (first, last)


def test_time_modulation_is_live(short_fit):
    model = short_fit[0]
    adapter = model.conditioner.adapter
    z_lq, x = clip(seed=9), clip(seed=10)
    s = adapter.structural(z_lq)
    with torch.no_grad():
        h_hi = torch.cat(adapter.hints(s, z_lq, x, torch.full((2,), 0.9)))
        h_lo = torch.cat(adapter.hints(s, z_lq, x, torch.full((2,), 0.1)))
    assert float((h_hi - h_lo).norm() / h_hi.norm()) > 1e-3


def test_full_scale_trainable_fraction_on_meta():
    with torch.device("meta"):
        # Wan2.1-T2V-1.3B's transformer config, as the full-scale plan records it
        wan = wan_transformer(**MODEL_SHAPES["Wan-AI/Wan2.1-T2V-1.3B-Diffusers:transformer"].arch)
        cfg = AdapterConfig(
            width=1536,
            heads=12,
            ffn_ratio=4.0,
            n_struct=2,
            n_refine=1,
            n_fuse=2,
            inject_layers=tuple(range(0, 30, 3)),
            freq_dim=256,
            rope_max_seq_len=1024,
        )
        adapter = StateAwareAdapter(cfg, 16, (1, 2, 2), 1536)
    theta = sum(p.numel() for p in wan.parameters())
    assert theta == 1_418_996_800
    assert 0.10 <= sum(p.numel() for p in adapter.parameters()) / theta <= 0.14


# ---- card invariants and mutations (issue 28) -----------------------------------------------------------------
def test_quick_config_trainable_fraction_in_band():
    """The card's former trainable_fraction_at_least / _at_most claims (seeds/litevsr.yaml): a configured
    architecture's parameter count, so a test. The quick config's adapter over its backbone's transformer, as
    ``TrainableFractionLogger`` logs it, is the recorded 0.130253 and inside the spec's band [0.08, 0.16]."""
    cfg = yaml.safe_load((ROOT / "configs/litevsr/quick.yaml").read_text())["model"]["init_args"]
    fields = set(TinyDiTConfig.__dataclass_fields__)
    bb_cfg = TinyDiTConfig(**{k: v for k, v in cfg["backbone"].items() if k in fields})
    torch.manual_seed(0)
    bb = TinyDiT(bb_cfg).eval().requires_grad_(False)
    model = LiteVSR(backbone=bb_cfg, adapter=cfg["adapter"])
    model.backbone = bb
    model.conditioner = model.build_conditioner()
    count, frac = TrainableFractionLogger("backbone.transformer").measure(model)
    assert count == sum(p.numel() for p in model.conditioner.adapter.parameters())
    assert frac == pytest.approx(0.130253, abs=1e-6)
    assert 0.08 <= frac <= 0.16


def test_one_step_gap_mutation_sampler_skipping_the_last_step(monkeypatch):
    """The card's mechanism claim one_step_near_eight: PSNR(K = 8) - PSNR(K = 1) <= 1 dB, measured as the
    validation step measures it. With a velocity field that is straight (constant in x and sigma: what a fitted
    flow-matching adapter approximates) every K of the real sampler lands on the same clean estimate (gap 0).
    A plausible wrong sampler, a hand-written Euler loop over K - 1 of the grid's intervals (the last step to
    sigma = 0 skipped), returns the noise at K = 1 but nearly the estimate at K = 8: the gap then exceeds the
    claim's 1 dB."""
    from torchmetrics.image import PeakSignalNoiseRatio

    from litlab.lit_modules.diffusion.vsr import frames_01

    model = module_for(tiny_backbone())
    hq = clip(seed=5)
    g = torch.Generator().manual_seed(6)
    estimate = (hq + 0.3 * torch.randn(hq.shape, generator=g)).clamp(-1, 1)  # an imperfect clean estimate
    eps = torch.randn(hq.shape, generator=g)
    monkeypatch.setattr(model, "velocity", lambda x, sigma, state, x0_in, record=False: eps - estimate)

    def gap() -> float:
        psnr = {}
        for k in (1, 8):
            metric = PeakSignalNoiseRatio(data_range=1.0, dim=(1, 2, 3))
            metric.update(frames_01(model.sample(estimate, k, eps.clone())), frames_01(hq))
            psnr[k] = float(metric.compute())
        return psnr[8] - psnr[1]

    real = gap()
    assert abs(real) <= 1e-3 and real <= 1.0  # the claim holds (K = 1 is as good as K = 8)

    objective = model.objective

    def skip_last_step(velocity, x, steps, on_step=None):
        sched = objective.inference_scheduler(steps)
        for i, t in enumerate(sched.timesteps[:-1]):
            v = velocity(x, sched.sigmas[i].to(x.dtype).expand(len(x)), i)
            x = sched.step(v, t, x, return_dict=False)[0]
        return x

    monkeypatch.setattr(objective, "euler_sample", skip_last_step)
    assert gap() > 1.0  # the broken sampler fails the claim


# ---- baselines -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["full_finetune", "controlnet_copy", "structural_only"])
def test_baselines_start_at_the_backbone(variant):
    bb = tiny_backbone()
    model = module_for(bb, variant=variant)
    x, z_lq, sigma, text = clip(seed=11), clip(seed=12), torch.tensor([0.2, 0.7]), bb.text(2)
    plain = run_backbone(bb.transformer, text, x, sigma)
    v = model.conditioner.velocity(bb.transformer, text, x, sigma, model.conditioner.prepare(z_lq), z_lq)
    assert (v - plain).abs().max() <= 1e-5
    frac = sum(p.numel() for p in model.trainable_parameters()) / sum(p.numel() for p in bb.parameters())
    assert {"full_finetune": frac > 1.0, "controlnet_copy": 0.4 < frac < 0.6, "structural_only": frac < 0.1}[
        variant
    ]
    assert all(not p.requires_grad for p in bb.parameters())


# ---- pieces ----------------------------------------------------------------------------------------------
def test_temporal_difference_error_by_hand():
    m = TemporalDifferenceError()
    hr = torch.zeros(1, 1, 3, 1, 2)
    sr = hr.clone()
    sr[0, 0, 1] = 0.5  # frame 1 off by 0.5: diffs (0.5, -0.5) against (0, 0) at 2 pixels each
    m.update(sr, hr)
    assert float(m.compute()) == pytest.approx(0.5)
    m.update(hr, hr)
    assert float(m.compute()) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="clips"):
        m.update(torch.zeros(1, 3, 1, 4, 4), torch.zeros(1, 3, 1, 4, 4))


def test_shared_attention_entry_point():
    from litlab.kernels.attention import attention, attention_reference

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 20, 16, generator=g, requires_grad=True)
    k, v = torch.randn(2, 2, 40, 16, generator=g), torch.randn(2, 2, 40, 16, generator=g)
    ref = attention_reference(q, k, v)
    out = attention(q, k, v)
    assert (out - ref).abs().max() <= 1e-5
    out.sum().backward()
    assert q.grad is not None
    with pytest.raises(RuntimeError, match="forward-only"):
        attention(q, k, v, impl="triton")
    with pytest.raises(ValueError, match="impl"):
        attention(q, k, v, impl="fast")


def test_shared_attention_triton_path_interpreted():
    import os

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("needs TRITON_INTERPRET=1 (the test conftest sets it without a GPU)")
    from litlab.kernels.attention import attention, attention_reference

    g = torch.Generator().manual_seed(1)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(1, 2, 24, 16, generator=g).to(dev)
    k, v = torch.randn(1, 2, 40, 16, generator=g).to(dev), torch.randn(1, 2, 40, 16, generator=g).to(dev)
    with torch.no_grad():
        out = attention(q, k, v, impl="triton")
    assert (out - attention_reference(q, k, v)).abs().max() <= 2e-3


def test_data_module_pairs_are_seeded_and_degraded(monkeypatch):
    from litlab.datamodules.synthetic_vsr import SyntheticVSRDataModule
    from litlab.lit_modules.core.seeding import derive_seed

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    dm = SyntheticVSRDataModule(frames=3, hq_size=16, pretrain_clips=4, train_clips=4, test_clips=2)
    hq, lq = dm.pairs("train")
    assert hq.shape == (4, 3, 3, 16, 16) and lq.shape == (4, 3, 3, 4, 4)
    assert float(hq.min()) >= -1 and float(hq.max()) <= 1
    assert torch.allclose(((lq + 1) / 2 * 255), ((lq + 1) / 2 * 255).round(), atol=1e-3)  # 8-bit
    again = SyntheticVSRDataModule(frames=3, hq_size=16, pretrain_clips=4, train_clips=4, test_clips=2)
    assert torch.equal(again.pairs("train")[0], hq)
    assert dm.data_seed == derive_seed("data") and dm.data_key()["data_seed"] == dm.data_seed  # the cache key
    order = next(iter(dm.train_dataloader()))[0]
    monkeypatch.setenv("PL_GLOBAL_SEED", "1")  # another run seed: other clips and another batch order
    other = SyntheticVSRDataModule(frames=3, hq_size=16, pretrain_clips=4, train_clips=4, test_clips=2)
    assert not torch.equal(other.pairs("train")[0], hq)
    # dm keeps the clips it drew, but its batch order is the run's "data.order" stream
    assert torch.equal(dm.pairs("train")[0], hq) and not torch.equal(
        next(iter(dm.train_dataloader()))[0], order
    )
    assert not torch.equal(dm.pairs("test")[0][:2], hq[:2])  # disjoint generators per split
    assert (hq[:, :, 1] != hq[:, :, 0]).any()  # things move
    with pytest.raises(ValueError, match="hq_size=18"):
        SyntheticVSRDataModule(hq_size=18)


# ---- configs ---------------------------------------------------------------------------------------------
def test_quick_config_parses():
    from jsonargparse import ArgumentParser

    from litlab.datamodules.synthetic_vsr import SyntheticVSRDataModule

    cfg = yaml.safe_load((ROOT / "configs/litevsr/quick.yaml").read_text())
    parser = ArgumentParser()
    parser.add_class_arguments(LiteVSR, "model")
    parser.add_class_arguments(SyntheticVSRDataModule, "data")
    ns = parser.parse_object({"model": cfg["model"]["init_args"], "data": cfg["data"]["init_args"]})
    assert ns.model.variant == "litevsr"
    assert cfg["model"]["class_path"] == "litlab.lit_modules.diffusion.litevsr.LiteVSR"
    # the probes the card reads (val/backbone_changed, val/trainable_frac) are the configs' callbacks
    for name in ("quick", "full"):
        callbacks = yaml.safe_load((ROOT / f"configs/litevsr/{name}.yaml").read_text())["trainer"][
            "callbacks"
        ]
        assert [c["class_path"].rsplit(".", 1)[1] for c in callbacks] == [
            "FrozenParamGuard",
            "TrainableFractionLogger",
        ]
        assert callbacks[0]["init_args"] == {"modules": ["backbone"]}
        assert callbacks[1]["init_args"] == {"reference": "backbone.transformer"}


def test_full_config_fails_offline_naming_the_model(monkeypatch, tmp_path):
    from litlab.lit_modules.core.errors import ModelUnavailableError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    cfg = yaml.safe_load((ROOT / "configs/litevsr/full.yaml").read_text())
    model_id = cfg["model"]["init_args"]["pretrained_path"]
    assert model_id == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    with pytest.raises(ModelUnavailableError, match="Wan-AI/Wan2.1-T2V-1.3B-Diffusers"):
        LiteVSR(pretrained_path=model_id)


def test_reds_folder_missing_fails_at_once(tmp_path):
    from litlab.datamodules.paired_video_sr import PairedVideoSRDataModule
    from litlab.lit_modules.core.errors import DatasetUnavailableError

    with pytest.raises(DatasetUnavailableError, match="<clip>/<frame:08d>.png"):
        PairedVideoSRDataModule(root=str(tmp_path / "REDS"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetUnavailableError, match="no clip"):
        PairedVideoSRDataModule(root=str(tmp_path / "empty"))
    with pytest.raises(DatasetUnavailableError, match="root is not set"):
        PairedVideoSRDataModule()


def test_reds_folder_reads_pairs(tmp_path):
    import numpy as np
    from PIL import Image

    from litlab.datamodules.paired_video_sr import PairedVideoSRDataModule

    for clip_name in ("000", "001"):
        d = tmp_path / clip_name
        d.mkdir()
        for i in range(3):
            Image.fromarray(np.full((16, 24, 3), 40 * i, dtype=np.uint8)).save(d / f"{i:08d}.png")
    dm = PairedVideoSRDataModule(
        root=str(tmp_path), frames=2, crop=(8, 8), steps=2, exclude_clips=["000"], num_workers=0
    )
    hq, lq = next(iter(dm.train_dataloader()))
    assert hq.shape == (1, 3, 2, 8, 8) and lq.shape == (1, 3, 2, 2, 2)
    assert list(dm.val_clips) == ["000"] and list(dm.train_clips) == ["001"]


def test_the_card_wires_the_report_hook():
    """seeds/litevsr.yaml names the hook that draws the LQ / SR / HQ frame grid the README promises (a card edit
    once dropped the line and every test still passed)."""
    from litlab.cards import load_card

    card = load_card(Path(__file__).resolve().parent.parent / "seeds" / "litevsr.yaml")
    assert card.report_hook == "litlab.lit_modules.diffusion.litevsr:report"
