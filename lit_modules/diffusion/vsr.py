"""Video super-resolution on a frozen flow-matching video DiT: the loop every VSR method of the family shares.

``FrozenDiTVSR`` holds the frozen backbone (a diffusers ``WanTransformer3DModel``: ``dit.TinyDiT`` pre-trained
here and cached per run seed (its "backbone" stream) at the quick scale, in pixel space; with ``pretrained_path``,
``dit.WanLatentBackbone``: a diffusers Wan checkpoint's transformer on its AutoencoderKLWan latents, with the
empty-prompt umT5 embedding computed once), the flow-matching objective (``flow_matching``), and one
``Conditioner``: the trainable part a method adds (an adapter that injects hints, a trainable copy, ...). It
trains only ``conditioner.parameters()`` and evaluates every method the same way:

  training step (LiteVSR spec §3.5, arXiv 2606.09250 reconstruction):
      z0 = E(Y), z_lq = E(Up_s(X)) (bicubic; E = the VAE's normalised latents, the identity at the quick scale)
      sigma = shift(sigmoid(u)), u ~ N(0, 1);  eps ~ N(0, I);  x = (1 − sigma) z0 + sigma eps
      state = conditioner.prepare(z_lq)                                  (once per clip, with grad)
      x0_in = z_lq; with prob. p_sc (conditioners that self-condition, per step):
          x0_in = x − sigma · no_grad(v(x, sigma; state.detach(), z_lq))  (self-conditioning, Analog Bits
          arXiv 2208.04202)
      loss = mean((v(x, sigma; state, x0_in) − (eps − z0))²);  AdamW on the conditioner only, grad-clip
  sampling (§3.6): state once; x = eps, x0_in = z_lq; on the scheduler's K-step grid
      v = v(x, sigma_i; state, x0_in);  x0_in = x − sigma_i v;  x = scheduler.step(v, t_i, x)

Validation runs once, after the last training step, on the held-out clips, for every K in ``val_steps`` with
the same noise for every method (the run's "eval" stream and the batch; latent-shaped at full scale), samples
decoded to pixels (D, the identity at the quick scale): ``val/psnr_k{K}``, ``val/ssim_k{K}``
(torchmetrics, frames in [0, 1], per-frame mean), ``val/tde_k{K}`` (``TemporalDifferenceError``),
``val/psnr_gap_k{K}_k1`` (``psnr_k{K} − psnr_k1`` of the same fit, when K = 1 is among the steps), the bicubic
input's ``val/psnr_bicubic`` / ``ssim`` / ``tde`` (Up_s(X) in pixels; the ``bicubic`` variant's K rows are
D(E(Up_s(X))), the VAE's round trip of it, at full scale) and ``val/struct_attn_mass_k{K}_s{i}`` when the conditioner
has one. Two callbacks of the configs' ``trainer.callbacks`` add ``val/trainable_frac`` (``|phi| / |theta_DiT|``,
``TrainableFractionLogger("backbone.transformer")``), ``val/trainable_params`` and ``val/backbone_changed`` (the
number of backbone tensors that are no longer bit-identical, ``FrozenParamGuard(["backbone"])``, which also makes
the fit raise at its end if a backbone tensor changed, holds a .grad or is in the optimizer).
At full scale (``pretrained_path``) the frozen transformer's blocks are recomputed in the backward pass
(diffusers' ``enable_gradient_checkpointing``, non-reentrant; the hint hooks run inside the checkpointed call), the
memory saving the spec's full-scale recipe assumes; the quick scale runs without it (no new option, so the quick
card's run identities are unchanged).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure

from litlab.lit_modules.core.config import as_config
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.diffusion.contract import VideoSRData, bicubic_up, check_data
from litlab.lit_modules.diffusion.dit import TinyDiTConfig, WanLatentBackbone, pretrained_tiny_dit
from litlab.lit_modules.diffusion.flow_matching import FlowMatchingObjective
from litlab.lit_modules.diffusion.freeze import freeze_
from litlab.lit_modules.diffusion.report import SAMPLES_FILE


class TemporalDifferenceError(Metric):
    """``mean |(SR_{t+1} − SR_t) − (HR_{t+1} − HR_t)|`` over clips (B, C, F, H, W); lower = more consistent."""

    higher_is_better = False
    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor) -> None:
        if preds.shape != target.shape or preds.ndim != 5 or preds.shape[2] < 2:
            raise ValueError(
                f"clips (B, C, F >= 2, H, W) of equal shape expected, got {tuple(preds.shape)} and "
                f"{tuple(target.shape)}"
            )
        d = preds.diff(dim=2).double() - target.diff(dim=2).double()
        self.total += d.abs().sum()
        self.count += d.numel()

    def compute(self) -> Tensor:
        return (self.total / self.count.clamp_min(1)).float()


def frames_01(clip: Tensor) -> Tensor:
    """(B, 3, F, H, W) in [-1, 1] -> (B·F, 3, H, W) in [0, 1]."""
    return ((clip.clamp(-1, 1) + 1) / 2).transpose(1, 2).flatten(0, 1)


class Conditioner(nn.Module):
    """What a method adds to the frozen backbone; everything it owns is trained.

    ``prepare(z_lq)`` runs once per clip (per training step, per sampling run); ``velocity(transformer, text,
    x, sigma, state, x0_in)`` runs the frozen ``transformer`` (or the method's own network) once and returns the
    velocity. ``self_conditioning``: whether the training step may feed a first clean estimate back as x0_in."""

    self_conditioning = False

    def prepare(self, z_lq: Tensor) -> Any:
        return z_lq

    def detach(self, state: Any) -> Any:
        return state.detach() if isinstance(state, Tensor) else state

    def velocity(self, transformer, text, x, sigma, state, x0_in, record: bool = False) -> Tensor:
        raise NotImplementedError

    def struct_attn_mass(self) -> Tensor | None:
        return None


def run_backbone(transformer: nn.Module, text: Tensor, x: Tensor, sigma: Tensor) -> Tensor:
    return transformer(x, sigma * 1000.0, text, return_dict=False)[0]


class FrozenDiTVSR(L.LightningModule):
    """The shared loop (see the module docstring); ``build_conditioner()`` is the method's (None: the bicubic
    input itself, nothing trained)."""

    def __init__(
        self,
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
        super().__init__()
        self.save_hyperparameters()
        self.backbone_cfg = as_config(TinyDiTConfig, backbone, "backbone")
        if not 0.0 <= self_cond_prob <= 1.0:
            raise ValueError(f"self_cond_prob must be in [0, 1], got {self_cond_prob}")
        if not val_steps or any(int(k) < 1 for k in val_steps):
            raise ValueError(f"val_steps must be a non-empty list of step counts >= 1, got {val_steps}")
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        self.automatic_optimization = False
        self.objective = FlowMatchingObjective(flow_shift)
        self.val_steps = [int(k) for k in val_steps]
        self.backbone: Any = None
        self.conditioner: Conditioner | None = None
        self.scale = 4
        keys = [f"k{k}" for k in self.val_steps] + ["bicubic"]
        self.psnr = nn.ModuleDict({k: PeakSignalNoiseRatio(data_range=1.0, dim=(1, 2, 3)) for k in keys})
        self.ssim = nn.ModuleDict({k: StructuralSimilarityIndexMeasure(data_range=1.0) for k in keys})
        self.tde = nn.ModuleDict({k: TemporalDifferenceError() for k in keys})
        self._mass: dict[tuple[int, int], list[Tensor]] = defaultdict(list)
        self._samples: dict[str, Tensor] | None = None  # the first validation batch's clips, for the report
        self._built = False
        if pretrained_path is not None:
            # the full scale: loaded here, so an absent checkpoint stops the run at once, naming it and its part;
            # ``backbone`` (the tiny config) is not used
            self.backbone = freeze_(WanLatentBackbone.from_pretrained(pretrained_path))

    # ---- construction ---------------------------------------------------------------------------
    def build_conditioner(self) -> Conditioner | None:
        raise NotImplementedError

    def setup(self, stage: str) -> None:
        if self._built:
            return
        dm = self.trainer.datamodule
        check_data(dm, VideoSRData, type(self).__qualname__)
        self.scale = int(dm.scale)
        if self.backbone is None:
            self.backbone = freeze_(pretrained_tiny_dit(self.backbone_cfg, dm, derive_seed("backbone")))
        else:  # the latent grid: a clip of the data module's geometry must fit it (error names both)
            self.backbone.check_clip((1, 3, int(dm.frames), *dm.frame_size))
        if self.hparams.pretrained_path is not None:  # spec §3.5: frozen blocks recomputed in backward
            self.transformer.enable_gradient_checkpointing()
        self.conditioner = self.build_conditioner()
        self._built = True

    # ---- checkpoints: at full scale the frozen backbone is the checkpoint's (pretrained_path), not saved again ----
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.hparams.pretrained_path is not None:
            state = checkpoint["state_dict"]
            checkpoint["state_dict"] = {k: v for k, v in state.items() if not k.startswith("backbone.")}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """A full-scale checkpoint holds no backbone tensors: they are taken from the loaded backbone, so a strict
        load still checks every trained tensor."""
        if (
            self.hparams.pretrained_path is not None
            and self.backbone is not None
            and not any(k.startswith("backbone.") for k in state_dict)
        ):
            frozen = {f"backbone.{k}": v for k, v in self.backbone.state_dict().items()}
            state_dict = {**frozen, **state_dict}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    @property
    def transformer(self) -> nn.Module:
        return self.backbone.transformer

    def text(self, batch: int) -> Tensor:
        return self.backbone.text(batch)

    def train(self, mode: bool = True):
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()  # frozen parts stay in eval mode (spec §3.5)
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        return (
            [] if self.conditioner is None else [p for p in self.conditioner.parameters() if p.requires_grad]
        )

    def configure_optimizers(self):
        params = self.trainable_parameters()
        if not params:
            return None
        h = self.hparams
        return torch.optim.AdamW(params, lr=h.lr, betas=tuple(h.betas), weight_decay=h.weight_decay)

    # ---- the adapted model ---------------------------------------------------------------------------
    def velocity(self, x: Tensor, sigma: Tensor, state, x0_in: Tensor, record: bool = False) -> Tensor:
        return self.conditioner.velocity(self.transformer, self.text(len(x)), x, sigma, state, x0_in, record)

    def training_step(self, batch, batch_idx: int):
        if self.conditioner is None:
            return None  # bicubic: nothing to train
        hq, lq = batch
        z0, z_lq = self.backbone.encode(hq), self.backbone.encode(bicubic_up(lq, self.scale))
        sigma = self.objective.sample_sigma(len(z0)).to(z0)
        eps = torch.randn_like(z0)
        x = self.objective.noised(z0, eps, sigma)
        state = self.conditioner.prepare(z_lq)
        x0_in = z_lq
        p_sc = self.hparams.self_cond_prob
        if self.conditioner.self_conditioning and p_sc > 0 and float(torch.rand(())) < p_sc:
            with torch.no_grad():
                v1 = self.velocity(x, sigma, self.conditioner.detach(state), z_lq)
            x0_in = self.objective.x0_hat(x, sigma, v1)
        v = self.velocity(x, sigma, state, x0_in)
        loss = self.objective.loss(v, z0, eps)
        opt = self.optimizers()
        opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        if self.hparams.grad_clip > 0:
            self.clip_gradients(opt, gradient_clip_val=self.hparams.grad_clip, gradient_clip_algorithm="norm")
        opt.step()
        self.log("train/loss", loss.detach(), prog_bar=True)
        return loss.detach()

    # ---- sampling ----------------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, z_lq: Tensor, steps: int, eps: Tensor, masses: list | None = None) -> Tensor:
        """§3.6: the SR clip's latents (pixels at the quick scale) after ``steps`` Euler steps."""
        if self.conditioner is None:
            return z_lq
        state = self.conditioner.prepare(z_lq)
        box = {"x0_in": z_lq}

        def velocity(x: Tensor, sigma: Tensor, i: int) -> Tensor:
            v = self.velocity(x, sigma, state, box["x0_in"], record=masses is not None)
            mass = self.conditioner.struct_attn_mass()
            if masses is not None and mass is not None:
                masses.append(mass)
            return v

        def on_step(i: int, sigma: Tensor, x0_hat: Tensor) -> None:
            box["x0_in"] = x0_hat

        return self.objective.euler_sample(velocity, eps, steps, on_step)

    def validation_step(self, batch, batch_idx: int) -> None:
        hq, lq = batch
        up = bicubic_up(lq, self.scale)
        z_lq = self.backbone.encode(up)
        gen = torch.Generator().manual_seed(derive_seed("eval") * 100_003 + batch_idx)
        eps = torch.randn(self.backbone.latent_shape(tuple(hq.shape)), generator=gen).to(hq)
        target = frames_01(hq)
        outs = {"bicubic": up}
        for k in self.val_steps:
            masses: list[Tensor] = []
            outs[f"k{k}"] = self.backbone.decode(self.sample(z_lq, k, eps, masses))
            for i, m in enumerate(masses):
                self._mass[(k, i)].append(m)
        if batch_idx == 0:
            n = min(2, len(hq))
            lq_nearest = torch.nn.functional.interpolate(
                lq[:n].flatten(1, 2), scale_factor=self.scale, mode="nearest"
            ).unflatten(1, (lq.shape[1], lq.shape[2]))
            self._samples = {"hq": hq[:n], "lq_nearest": lq_nearest, "bicubic": up[:n]}
            self._samples.update(
                {f"sr_{key}": sr[:n].clamp(-1, 1) for key, sr in outs.items() if key != "bicubic"}
            )
        for key, sr in outs.items():
            self.psnr[key].update(frames_01(sr), target)
            self.ssim[key].update(frames_01(sr), target)
            self.tde[key].update((sr.clamp(-1, 1) + 1) / 2, (hq + 1) / 2)

    def on_validation_epoch_end(self) -> None:
        out = {}
        for key in self.psnr:
            out[f"val/psnr_{key}"] = self.psnr[key].compute()
            out[f"val/ssim_{key}"] = self.ssim[key].compute()
            out[f"val/tde_{key}"] = self.tde[key].compute()
            self.psnr[key].reset()
            self.ssim[key].reset()
            self.tde[key].reset()
        if 1 in self.val_steps:  # the single-step gap (spec §7.7: K = 1 within 1.0 dB of K = 8), per fit
            for k in self.val_steps:
                if k != 1:
                    out[f"val/psnr_gap_k{k}_k1"] = out[f"val/psnr_k{k}"] - out["val/psnr_k1"]
        for (k, i), ms in sorted(self._mass.items()):
            out[f"val/struct_attn_mass_k{k}_s{i}"] = torch.cat(ms).mean()
        self._mass.clear()
        self.save_samples()
        for name, value in out.items():
            self.log(name, value, on_step=False, on_epoch=True)

    def save_samples(self) -> None:
        """The first held-out clips (HQ, LQ, bicubic, every K) in the run folder, for the report's frame grid."""
        samples, self._samples = self._samples, None
        if samples is None or self._trainer is None or self.trainer.sanity_checking or self.global_rank != 0:
            return
        from safetensors.torch import save_file

        root = Path(self.trainer.default_root_dir)
        root.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in samples.items()}, str(root / SAMPLES_FILE))
