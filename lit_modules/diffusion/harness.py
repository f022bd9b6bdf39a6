"""Continual personalisation of a text-to-image diffusion model by row-selective updates: the loop and the tools
every neuron-selection method of the family shares (SCNS, "Submodular Concept Neuron Selection", ICML 2026, §3.2
of its reconstruction; the CNS predecessor, arXiv 2510.02296, follows the same loop with another selection).

``ContinualNeuronTuning`` walks the concept stream of a ``contract.ConceptStreamData`` inside one ``fit``: task t
owns epoch t (``steps_per_task`` batches). The method owns what happens per task, in three hooks:

    begin_task(t, dm)       at the start of task t's epoch: the method's steps up to training (e.g. SCNS:
                            token init, selection of S_t), ending with ``tune_rows(t, S_t, dm, info)``;
    training_step           each batch of task t (e.g. SCNS: an AdamW step of ``denoising_loss``);
    end_task(t, dm)         after task t's last batch, before that epoch's checkpoint: ``merge_rows(t, dm)``,
                            the method's steps after the merge (SCNS: the Fisher of task t), ``evaluate_task``.

The tools the hooks call:

    init_concept_token(t)   the token row <V_t> ← its class word's row;
    tune_rows(t, S_t)       a ``RowDeltaBranch`` (zeros) on each projection that has selected rows, the token row
                            unfrozen with its gradient masked to <V_t>, a fresh AdamW (weight_decay 0) over both,
                            handed to the Trainer; logs |S_t| and its parameter fraction;
    denoising_loss          the masked DDPM ε-loss (``ddpm.ddpm_losses``) of a batch of the task's images;
    merge_rows(t)           W[S_t] += Δ and the plain ``nn.Linear`` put back (fusion-free); the token row frozen
                            again; the freezing guard checks that only rows S_t and the token row changed;
    evaluate_task(t)        the held-out denoising loss ℓ_t(t) of the new concept (of every seen concept k ≤ t
                            with ``full_matrix``; always after the last task), the samples, the task's numbers and,
                            after the last task, the stream's metrics.

Metrics (``self.log``; the loss proxy of the quick scale replaces CLIP image alignment, spec §6):
``val/forgetting`` FG = mean_{k<T}(ℓ_k(T) − ℓ_k(k)), ``val/plasticity`` PL = mean_k(ℓ_k(base, class-only
prompt) − ℓ_k(k)), ``val/final_loss`` mean_k ℓ_k(T), ``val/base_drift`` (loss on the DataModule's base-preservation
set at τ = 500 after the stream minus before), ``val/changed_frac`` mean_t |S_t|·c / |θ_UNet|, ``val/neurons``
mean |S_t|; a method adds its own (SCNS: ``val/risk_sum``).

Samples (``sampling.per_concept`` > 0; for the report's grids, no metric reads them): SDEdit-style DDIM samples
(η = 0, ``sampling.steps`` on the full grid, started at ``sampling.t_start``; ``ddpm.ddim_sample``) of concept k's
first held-out renders, noised with one fixed noise per k — from the base under the class-only prompt (before task
1), after task k and after the last task under "a <V_k> {class}" — and those renders themselves, written to
``concept_samples.safetensors`` in the run folder after the last task. ``sampling.t_start = 0`` samples from pure
noise instead (the 150-step quick base cannot: its one-step x̂0 is noise from τ ≈ 500 up, measured on seed 0).
They use their own generator (the run's "samples" stream), so the stream's numbers are the same with and without
them. ``sampling.guidance`` w != 1 samples with classifier-free guidance against the empty prompt (full scale:
SD1.5 was trained with it; the quick-scale base was not, so its default is 1: no guidance).

Randomness, by name from the run's seed (``core.seeding.derive_seed``): "backbone" (the quick-scale base's
pre-training; ``backbone_seed`` pins it, so that every run seed tunes one base and the seeds vary the stream
alone), "eval" (the noise of the base-preservation loss), "samples" (the sample grids); the DataModule draws the
data, the Trainer's seed the training noise.

Two bases, one loop: without ``pretrained_path`` the quick-scale ``ddpm.TinyT2I`` (pixel space, fixed word-level
vocabulary, pre-trained here on the DataModule's base world); with it, ``ddpm.LatentT2I`` loaded from a
diffusers-layout folder or hub id (Stable Diffusion 1.5 in ``configs/scns/full.yaml``): the images of the stream
are VAE latents (``x0``: posterior mean × ``scaling_factor``; samples are decoded back through the VAE), the CLIP
tokenizer gets the concept tokens ``<V_t>`` (the embedding grows by their rows; each is set from its class word
at the start of its task, as at the quick scale) and the DataModule tokenises its prompts with it; the training
scheduler is the checkpoint's (as a ``DDPMScheduler``). Everything the loop computes goes through the base's
``tokenize`` / ``x0`` / ``decode``, which the tiny base answers as before, so the quick scale's numbers did not move.
The latent loop is tested end to end on a tiny diffusers-layout checkpoint; it has not been run at SD1.5 scale.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.errors import CheckpointError
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.diffusion.contract import ConceptStreamData, check_data
from litlab.lit_modules.diffusion.ddpm import (
    LatentT2I,
    TinyT2IConfig,
    ddim_sample,
    ddpm_losses,
    make_scheduler,
    pretrained_tiny_t2i,
)
from litlab.lit_modules.diffusion.neurons import (
    GroundSet,
    attach_row_deltas,
    ground_set,
    merge_row_deltas,
)
from litlab.lit_modules.diffusion.report import CONCEPT_SAMPLES_FILE as SAMPLES_FILE


@config_part
class SamplingConfig:
    """The report's sample grids (see the module docstring): ``per_concept`` samples per concept (0: none), DDIM
    with ``steps`` on the full grid from ``t_start`` (0: from pure noise), classifier-free ``guidance`` (1: none)."""

    per_concept: int = 0
    steps: int = 50
    t_start: int = 300
    guidance: float = 1.0

    def __post_init__(self) -> None:
        if self.per_concept < 0 or self.steps < 1 or self.t_start < 0:
            raise ValueError(
                f"sampling.per_concept and sampling.t_start must be >= 0 and sampling.steps >= 1, got "
                f"{self.per_concept}, {self.t_start}, {self.steps}"
            )


class ContinualNeuronTuning(L.LightningModule):
    """The task loop and its tools (see the module docstring); a method implements ``begin_task``,
    ``training_step`` and ``end_task``."""

    def __init__(
        self,
        base: TinyT2IConfig = TinyT2IConfig(),  # noqa: B008
        pretrained_path: str | None = None,
        ground_set: str = "kv",
        lr_rows: float = 1e-3,
        lr_token: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eval_batch: int = 128,
        full_matrix: bool = False,
        sampling: SamplingConfig = SamplingConfig(),  # noqa: B008
        backbone_seed: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.base_cfg = as_config(TinyT2IConfig, base, "base")
        self.sampling = as_config(SamplingConfig, sampling, "sampling")
        self.automatic_optimization = False
        self.model: Any = None
        self.gs: GroundSet | None = None
        self.loss_matrix: dict[int, dict[int, float]] = {}  # ℓ_k(t): [k][t]
        self.base_class_loss: dict[int, float] = {}
        self.base_loss_before: float | None = None
        self.task_log: list[dict[str, float]] = []
        self.samples: dict[str, Tensor] = {}  # base_k / after_k / final_k / ref_k (see the module docstring)
        self.selections: list[
            list[int]
        ] = []  # S_t as flat neuron indices: all a task leaves besides its merge
        self._opt: torch.optim.Optimizer | None = None
        self._adapted: dict = {}
        self._selected: Tensor | None = None
        self._token_hook = None
        if pretrained_path is not None:  # stops at once offline, naming the checkpoint
            self.model = LatentT2I.from_pretrained(pretrained_path)
            self.scheduler = self.model.scheduler
        else:
            self.scheduler = make_scheduler(self.base_cfg.num_train_timesteps)
        self.num_train_timesteps = int(self.scheduler.config.num_train_timesteps)

    # ---- construction ---------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.gs is not None:
            return
        dm = self.trainer.datamodule
        check_data(dm, ConceptStreamData, type(self).__qualname__)
        if self.model is None:
            if dm.data_root is not None:
                raise ValueError(
                    f"the concept folder {dm.data_root} needs a pretrained text-to-image base: set "
                    "model.init_args.pretrained_path (the tiny base is pre-trained on the procedural world only)"
                )
            # backbone_seed set: one base for every run seed (the ledger records the stream as pinned)
            backbone = derive_seed("backbone", fixed=self.hparams.backbone_seed)
            self.model = pretrained_tiny_t2i(self.base_cfg, dm, backbone)
        else:  # the latent base: its tokenizer learns the concept tokens and tokenises the DataModule's prompts
            self.model.add_concept_tokens(dm.concept_tokens())
            dm.use_tokenizer(self.model.tokenize, self.model.token_id)
        self.model.requires_grad_(False)
        self.model.eval()
        self.gs: GroundSet = ground_set(self.model.unet, self.hparams.ground_set)
        self.unet_params = sum(p.numel() for p in self.model.unet.parameters())

    def configure_optimizers(self):
        return None  # one AdamW per task, built in tune_rows (manual optimisation)

    def tokenize(self, prompts: list[str]) -> Tensor:
        return self.model.tokenize(prompts)

    def encode(self, ids: Tensor) -> Tensor:
        return self.model.encode(ids.to(self.device))

    def to_x0(self, images: Tensor) -> Tensor:
        """What the UNet denoises: the images themselves (tiny base) or their VAE latents (latent base)."""
        return self.model.x0(images.to(self.device))

    def task_losses(self, x0: Tensor, prompt: str, t: Tensor, noise: Tensor) -> Tensor:
        """Per-sample ε-loss of ``x0`` (already ``to_x0``) under ``prompt``."""
        ids = self.tokenize([prompt]).expand(len(x0), -1)
        return ddpm_losses(self.model.unet, self.scheduler, x0, self.encode(ids), t, noise)

    @torch.no_grad()
    def heldout_loss(self, dm, k: int, prompt: str) -> float:
        x, ts, noise = dm.heldout(k, self.model.x0_shape(dm.image_size))
        total = 0.0
        for i in range(0, len(x), self.hparams.eval_batch):
            sl = slice(i, i + self.hparams.eval_batch)
            total += float(self.task_losses(self.to_x0(x[sl]), prompt, ts[sl], noise[sl]).sum())
        return total / len(x)

    @torch.no_grad()
    def base_loss(self, dm) -> float:
        x, ids = dm.base_eval_set()
        x0 = self.to_x0(x)
        gen = torch.Generator().manual_seed(derive_seed("eval"))
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.full((len(x),), 500, dtype=torch.long)
        return float(ddpm_losses(self.model.unet, self.scheduler, x0, self.encode(ids), t, noise).mean())

    def sample_inputs(self, dm, k: int) -> Tensor:
        """Concept k's first ``sampling.per_concept`` held-out images (distinct images of its held-out grid; taken
        again in turn when a concept folder holds out fewer, each then with its own noise)."""
        x, ts, _ = dm.heldout(k)
        x = x[ts == ts[0]]
        return x[torch.arange(self.sampling.per_concept) % len(x)]

    @torch.no_grad()
    def sample_concepts(self, dm, concepts: list[int], prompts: list[str]) -> list[Tensor]:
        """``sampling.per_concept`` samples per concept in ``concepts`` (one batch), each concept from its own
        fixed noise and held-out renders (the same in every column of the grid and in every method)."""
        n, t0 = self.sampling.per_concept, self.sampling.t_start
        init = self.to_x0(torch.cat([self.sample_inputs(dm, k) for k in concepts]))
        noise_seed = derive_seed("samples")
        noise = torch.cat(
            [
                torch.randn(n, *init.shape[1:], generator=torch.Generator().manual_seed(noise_seed + k))
                for k in concepts
            ]
        )
        ids = self.tokenize(prompts).repeat_interleave(n, dim=0)
        guidance = self.sampling.guidance
        uncond = self.encode(self.tokenize([""] * len(ids))) if guidance != 1.0 else None
        x = ddim_sample(
            self.model.unet,
            self.scheduler,
            self.encode(ids),
            noise.to(init.device, init.dtype),
            self.sampling.steps,
            init=init if t0 else None,
            t_start=t0 or None,
            clamp=False,
            uncond=uncond,
            guidance=guidance,
        )
        return list(self.model.decode(x).cpu().split(n))

    def save_samples(self) -> None:
        if not self.samples or self._trainer is None or self.global_rank != 0:
            return
        from pathlib import Path

        from safetensors.torch import save_file

        root = Path(self.trainer.default_root_dir)
        root.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.samples.items()}, str(root / SAMPLES_FILE))

    # ---- the method's hooks (see the module docstring) ----------------------------------------------
    def begin_task(self, t: int, dm) -> None:
        """Everything of task t before its first batch; ends with ``tune_rows``."""
        raise NotImplementedError

    def end_task(self, t: int, dm) -> None:
        """Everything of task t after its last batch: ``merge_rows`` first, ``evaluate_task`` last."""
        raise NotImplementedError

    # ---- the loop ---------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        dm = self.trainer.datamodule
        if not self.base_class_loss:
            self.base_class_loss = {
                k: self.heldout_loss(dm, k, dm.class_prompt(k)) for k in range(dm.num_concepts)
            }
            self.base_loss_before = self.base_loss(dm)
            if self.sampling.per_concept:
                ks = list(range(dm.num_concepts))
                base = self.sample_concepts(dm, ks, [dm.class_prompt(k) for k in ks])
                for k in ks:
                    self.samples[f"base_{k}"] = base[k]
                    self.samples[f"ref_{k}"] = self.sample_inputs(dm, k).clone()

    def on_train_epoch_start(self) -> None:
        dm = self.trainer.datamodule
        self.begin_task(dm.task_of_epoch(self.current_epoch), dm)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        dm = self.trainer.datamodule
        if batch_idx == self.trainer.num_training_batches - 1:
            self.end_task(dm.task_of_epoch(self.current_epoch), dm)

    # ---- the tools of a task ------------------------------------------------------------------------
    def init_concept_token(self, t: int, dm) -> None:
        """<V_t>'s embedding row ← its class word's row."""
        emb = self.model.text_encoder.get_input_embeddings().weight
        new_row, class_row = dm.token_ids(t)
        with torch.no_grad():
            emb[new_row] = emb[class_row]

    def tune_rows(self, t: int, selected: Tensor, dm, info: dict[str, float]) -> None:
        """Make rows ``selected`` (flat neuron indices S_t) and <V_t>'s token row the only trainable weights of task
        t, under one AdamW (weight decay 0) the Trainer steps; ``info`` (numbers about the selection) is logged at
        the task's end with |S_t| and its parameter fraction."""
        selected = torch.as_tensor(selected, dtype=torch.long)
        info = {
            **info,
            "neurons": float(len(selected)),
            "changed_frac": float(self.gs.costs[selected].sum()) / self.unet_params,
        }
        self._selected = selected
        self.selections.append(selected.tolist())
        self._before = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self._adapted = attach_row_deltas(self.model.unet, self.gs.split(selected))
        deltas = [layer.branches["rows"].delta for layer in self._adapted.values()]
        emb = self.model.text_encoder.get_input_embeddings().weight
        new_row = dm.token_ids(t)[0]
        emb.requires_grad_(True)
        mask = torch.zeros(emb.shape[0], 1, dtype=emb.dtype, device=emb.device)
        mask[new_row] = 1.0
        self._token_hook = emb.register_hook(lambda g: g * mask)
        groups = [
            {"params": deltas, "lr": self.hparams.lr_rows},
            {"params": [emb], "lr": self.hparams.lr_token},
        ]
        self._opt = torch.optim.AdamW(groups, betas=tuple(self.hparams.betas), weight_decay=0.0)
        if self._trainer is not None:  # the Trainer steps (and counts) the task's optimizer
            self.trainer.strategy.optimizers = [self._opt]
        self.task_log.append(info)

    def denoising_loss(self, images: Tensor, ids: Tensor) -> Tensor:
        """The ε-loss of a batch of the task's images under their prompt ids, at uniform random timesteps."""
        x0 = self.to_x0(images)
        steps = torch.randint(0, self.num_train_timesteps, (len(x0),))
        noise = torch.randn_like(x0)
        return ddpm_losses(self.model.unet, self.scheduler, x0, self.encode(ids), steps, noise).mean()

    def merge_rows(self, t: int, dm) -> None:
        """W[S_t] += Δ with the plain ``nn.Linear`` put back (fusion-free), the token row frozen again, and the
        freezing check of task t."""
        merge_row_deltas(self.model.unet, self._adapted)
        self._adapted = {}
        self._token_hook.remove()
        emb = self.model.text_encoder.get_input_embeddings().weight
        emb.requires_grad_(False)
        emb.grad = None
        self._opt = None
        self.check_frozen(t, dm)

    def evaluate_task(self, t: int, dm) -> None:
        """ℓ_k(t) of the new concept (every seen one with ``full_matrix`` or after the last task), its samples, the
        task's logged numbers and, after the last task, the stream's metrics."""
        last = t == dm.num_concepts - 1
        for k in range(t + 1) if (self.hparams.full_matrix or last) else [t]:
            self.loss_matrix.setdefault(k, {})[t] = self.heldout_loss(dm, k, dm.concept_prompt(k))
        if self.sampling.per_concept:
            self.samples[f"after_{t}"] = self.sample_concepts(dm, [t], [dm.concept_prompt(t)])[0]
            if last:
                ks = list(range(t + 1))
                final = self.sample_concepts(dm, ks, [dm.concept_prompt(k) for k in ks])
                for k in ks:
                    self.samples[f"final_{k}"] = final[k]
                self.save_samples()
        info = self.task_log[t]
        for key, value in info.items():
            self.log(f"task/{key}_{t}", value, on_step=False, on_epoch=True)
        self.log(f"task/loss_{t}_{t}", self.loss_matrix[t][t], on_step=False, on_epoch=True)
        if last:
            self.log_stream(dm)

    def check_frozen(self, t: int, dm) -> None:
        """Every tensor is bit-identical to its pre-task value except rows S_t of the K/V weights and the
        embedding row of <V_t> (the spec's ``FrozenOutsideMaskGuard``); raises otherwise."""
        after = self.model.state_dict()
        allowed_rows = {f"unet.{name}.weight": rows for name, rows in self.gs.split(self._selected).items()}
        emb_key = next(k for k in after if k.endswith("token_embedding.weight"))
        allowed_rows[emb_key] = torch.tensor([dm.token_ids(t)[0]], device=after[emb_key].device)
        changed_frac = 0.0
        for key, before in self._before.items():
            diff = (
                (after[key] != before).reshape(before.shape[0], -1).any(1)
                if before.ndim
                else after[key] != before
            )
            rows = allowed_rows.get(key)
            if rows is None:
                if bool(diff.any()):
                    raise RuntimeError(f"task {t}: {key} changed outside the selected neurons")
                continue
            outside = diff.clone()
            outside[rows] = False
            if bool(outside.any()):
                raise RuntimeError(f"task {t}: {key} changed in rows outside the selection")
            if key != emb_key:
                changed_frac += float(diff.sum()) * before.shape[1]
        self.task_log[t]["measured_changed_frac"] = changed_frac / self.unet_params
        self._before = {}

    def log_stream(self, dm) -> None:
        T = dm.num_concepts
        last = T - 1
        fg = [self.loss_matrix[k][last] - self.loss_matrix[k][k] for k in range(T - 1)]
        pl = [self.base_class_loss[k] - self.loss_matrix[k][k] for k in range(T)]
        out = {
            "val/forgetting": sum(fg) / max(len(fg), 1),
            "val/plasticity": sum(pl) / len(pl),
            "val/final_loss": sum(self.loss_matrix[k][last] for k in range(T)) / T,
            "val/base_drift": self.base_loss(dm) - self.base_loss_before,
            "val/changed_frac": sum(i["changed_frac"] for i in self.task_log) / T,
            "val/measured_changed_frac": sum(i["measured_changed_frac"] for i in self.task_log) / T,
            "val/neurons": sum(i["neurons"] for i in self.task_log) / T,
        }
        for key, value in out.items():
            self.log(key, value, on_step=False, on_epoch=True)

    # ---- checkpoints: the stream's state travels with the merged weights --------------------------
    def stream_state(self) -> dict:
        return {
            "loss_matrix": self.loss_matrix,
            "base_class_loss": self.base_class_loss,
            "task_log": self.task_log,
            "selections": self.selections,
            "base_loss_before": self.base_loss_before,
            "samples": self.samples,
        }

    def load_stream_state(self, state: dict) -> None:
        self.loss_matrix = {
            int(k): {int(t): v for t, v in row.items()} for k, row in state["loss_matrix"].items()
        }
        self.base_class_loss = {int(k): v for k, v in state["base_class_loss"].items()}
        self.task_log = list(state["task_log"])
        self.selections = list(state["selections"])
        self.base_loss_before = state["base_loss_before"]
        self.samples = dict(state.get("samples") or {})

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["neuron_stream"] = self.stream_state()
        # inside a task, S_t's row branches, the token row's hook and the task's optimizer exist only in this
        # process: the stream resumes from a task boundary (an epoch-end checkpoint), never from here
        checkpoint["neuron_stream_in_task"] = bool(self._adapted)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if checkpoint.get("neuron_stream_in_task"):
            raise CheckpointError(
                f"this checkpoint (step {checkpoint.get('global_step')}) was written in the middle of a concept's "
                "task, while its selected rows were being tuned (a mid-epoch or preemption checkpoint); the "
                "concept stream resumes only from a task boundary: pass --ckpt_path <an epoch-end checkpoint of "
                "the run folder>, or start the run again"
            )
        if "neuron_stream" in checkpoint:
            self.load_stream_state(checkpoint["neuron_stream"])
