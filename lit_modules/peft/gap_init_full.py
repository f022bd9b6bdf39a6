"""Gap-Init at full scale — "When Is Rank-1 Enough? Geometry-Guided Initialization for Parameter-Efficient
Fine-Tuning" (H. Zhao, S. C. Han, E. Hovy, ICML 2026, arXiv 2602.01522; the algorithm box of the authors' project
page) on a vision-language model: rank-1 LoRA on BLIP-2 OPT-2.7B's language model, COCO Karpathy captioning.

Algorithm (the box of ``gap_init.py``, on a VLM whose language model has width d and L blocks):
    (1) calibration pass of the frozen model over D_cal (``calib_size`` training pairs), output_hidden_states:
        h_l = the language model's residual stream at the input of block l (h_0: the input embeddings, with the
        Q-Former's projected query outputs at the image-token positions); per pair i and layer l,
        z_v = mean of h_l over the image-token positions, z_t = mean over the text positions (the prompt and
        the caption), g_{i,l} = z_t − z_v                                                   (spec §3.2)
    (2) ĝ_l = normalise(mean_i smooth(g_{i,l}))                       (``estimate_layer_gaps``, spec §3.2)
    (3) every LoRA-wrapped q_proj / v_proj of block l: B[:, 0] = ĝ_l, A = 0 (``gap_factors``), so the model is
        unchanged at step 0                                                                  (spec §3.3)
    (4) captioning fine-tuning: the teacher-forced language-model loss on the caption, base frozen, only the
        adapter factors train                                                                (spec §3.4)
``init`` switches the rule, as at the quick scale: ``gap``, ``peft_default`` (A Kaiming-uniform, B = 0: PEFT's)
or ``reverse_random`` (A = 0, B a random orthonormal direction: the pattern without the alignment).

Reconstructed (the paper's body and code could not be read): the targets (q_proj, v_proj of every LLM block), the
scale s = alpha / r with alpha = 2r, the smoothing (``trimmed_unit``), the hidden state that defines a layer's
gap (the input of block l, as above), which positions are "text" (prompt and caption, padding excluded), the
rank > 1 and output-width-mismatch rules (``mismatch``: ``map`` B[:, 0] = normalise(W₀ ĝ), ``default``: PEFT's),
and the backbone and data (BLIP-2 OPT-2.7B on COCO Karpathy: our choice, the paper's backbones are not known).

The backbone's recipe (BLIP-2, Li et al., arXiv 2301.12597, §4.2 image captioning and its table of captioning
fine-tuning hyper-parameters): the prompt "a photo of" before the caption, masked out of the loss; AdamW (β 0.9,
0.999, weight decay 0.05), 1000 warm-up steps then cosine decay, 5 epochs, batch 256 (the config); beam search with
5 beams for the caption metric. Captions are pre-processed as BLIP does (lower case, punctuation dropped, at most
50 words) and end with a newline, as the authors' released training code has it (reconstructed); the decoded
length bounds (8 to 30 new tokens) are ours; the LoRA learning rate 2e-4 on a 2.7B model is the spec's
(reconstructed). Deviations: the HF processor's 224 px images (the paper fine-tunes at 364 px, with the ViT and
Q-Former trainable; here everything but the adapters is frozen, the point of the method). Metrics: the
validation loss, teacher-forced token accuracy on the caption and BLEU-4 of the decoded captions against every
reference (torchmetrics) and CIDEr-D (``blip2_captioning.cider_d``, the COCO evaluation code's algorithm), both on
lower-cased words without punctuation: not the COCO toolkit's PTB tokeniser, so close to but not exactly the
paper's numbers.

Checkpoints hold the adapter factors and the init statistics, never the public frozen backbone. BLIP-2 specific:
the image tokens are the ``num_query_tokens`` placeholders BLIP-2's processor puts before the text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor
from torchmetrics.text import BLEUScore

from litlab.lit_modules.core.adapters import AdapterLinear, adapter_parameters, inject_adapters
from litlab.lit_modules.core.config import as_config
from litlab.lit_modules.core.contracts import check_protocol
from litlab.lit_modules.core.errors import CheckpointError
from litlab.lit_modules.core.hf import dtype_from_name, load_from_folder_cache_or_hub
from litlab.lit_modules.core.schedules import warmup_then_decay_lr
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.peft.blip2_captioning import (
    DECODING,
    CaptionEncoder,
    Decoding,
    corpus_cider,
    decode_captions,
    metric_words,
    modality_means,
    pre_caption,
    write_coco_karpathy,
    write_tiny_blip2,
)
from litlab.lit_modules.peft.contract import CaptionedImages
from litlab.lit_modules.peft.gap_init import (
    INIT_RULES,
    InitRule,
    Smooth,
    estimate_layer_gaps,
    gap_dominance,
    gap_factors,
    reverse_random_factors,
)

Mismatch = Literal["map", "default"]
LAYER = re.compile(r"\.layers\.(\d+)\.")
INIT_STATS = (
    "cos_B_g",
    "gap_norm",
    "rho_g",
    "grad_A",
    "grad_B",
    "max_delta",
)  # buffers init_<key>, logs init/<key>


def llm_targets(targets: list[str]) -> str:
    """The ``inject_adapters`` pattern of the language model's linear layers named ``targets`` (never the ViT's or
    the Q-Former's)."""
    return rf"language_model\..*\.({'|'.join(map(re.escape, targets))})"


class GapInitCaptioning(L.LightningModule):
    """Rank-r LoRA on a frozen BLIP-2's language model (``targets`` of every block), initialised by ``init``,
    fine-tuned on captions. Reads ``trainer.datamodule`` through ``litlab.lit_modules.peft.contract.CaptionedImages``
    (the project's: ``litlab.datamodules.coco_caption.CocoKarpathyCaptionDataModule``).

    Logs ``train/loss``; ``val/loss``, ``val/token_acc``, ``val/bleu4``, ``val/cider`` (``test/…`` alike); at
    validation, what the init measured, where it did (``init/<key>``, ``INIT_STATS``): ``cos_B_g`` (mean cos(B[:, 0],
    ĝ_l)), ``gap_norm`` (mean over layers of ‖mean_i g_{i,l}‖), ``rho_g`` (the premise at step 0), ``grad_A``,
    ``grad_B`` (the first step's factor gradient norms, §7.3), ``max_delta`` (max |ΔW| after the init: 0, a no-op).
    The frozen backbone stays in eval mode, as ``from_pretrained`` leaves it (no dropout)."""

    def __init__(
        self,
        backbone: str = "Salesforce/blip2-opt-2.7b",
        revision: str | None = None,
        dtype: str = "bfloat16",
        init: InitRule = "gap",
        rank: int = 1,
        alpha: float | None = None,
        targets: list[str] | None = None,
        noise: float = 0.0,
        smooth: Smooth = "trimmed_unit",
        mismatch: Mismatch = "map",
        prompt: str = "a photo of",
        max_text_tokens: int = 32,
        decoding: Decoding = DECODING,
        lr: float = 2e-4,
        weight_decay: float = 0.05,
        warmup_steps: int = 1000,
    ):
        super().__init__()
        if init not in INIT_RULES:
            raise ValueError(f"init must be one of {INIT_RULES}, got {init!r}")
        if rank < 1 or noise < 0 or max_text_tokens < 2 or warmup_steps < 0:
            raise ValueError(
                f"need rank >= 1, noise >= 0, max_text_tokens >= 2, warmup_steps >= 0; got {rank}, {noise}, "
                f"{max_text_tokens}, {warmup_steps}"
            )
        if mismatch not in ("map", "default"):
            raise ValueError(f"mismatch must be 'map' or 'default', got {mismatch!r}")
        self.save_hyperparameters()
        self.targets = list(targets) if targets is not None else ["q_proj", "v_proj"]
        self.alpha = float(2 * rank if alpha is None else alpha)
        self.decoding = as_config(Decoding, decoding, "decoding")
        import transformers

        torch_dtype = dtype_from_name(dtype)  # a typo fails before any loading
        self.model = load_from_folder_cache_or_hub(  # offline: ModelUnavailableError naming the id, at once
            transformers.Blip2ForConditionalGeneration.from_pretrained,
            backbone,
            revision,
            "model",
            dtype=torch_dtype,
        )
        processor = load_from_folder_cache_or_hub(
            transformers.Blip2Processor.from_pretrained, backbone, revision, "processor"
        )
        cfg = self.model.config
        image_token = getattr(cfg, "image_token_id", None) or cfg.image_token_index
        self.encoder = CaptionEncoder(processor, cfg.num_query_tokens, image_token, prompt, max_text_tokens)
        self.n_layers = cfg.text_config.num_hidden_layers
        self.model.requires_grad_(False)
        # the frozen backbone is not in the run's checkpoints (on_save_checkpoint)
        self.strict_loading = False
        self.adapted: dict[str, AdapterLinear] | None = None
        self.initialised = init != "gap"  # gap needs the calibration pass, on the device (on_fit_start)
        for key in INIT_STATS:
            self.register_buffer(f"init_{key}", torch.tensor(float("nan")))
        self.val_bleu, self.test_bleu = BLEUScore(n_gram=4), BLEUScore(n_gram=4)
        # (caption, references) of the evaluation epoch, for CIDEr-D
        self.decoded: list[tuple[str, list[str]]] = []

    # ---- setup: adapters (3), the data-free rules at once ---------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule
        check_protocol(dm, CaptionedImages, type(self).__name__)
        dm.use_encoder(self.encoder)
        if self.adapted is not None:
            return
        hp = self.hparams
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed("init"))  # PEFT's Kaiming A draws from the run's "init" stream
            self.adapted = inject_adapters(
                self.model,
                llm_targets(self.targets),
                rank=hp.rank,
                alpha=self.alpha,
                init="kaiming_A_zero_B" if hp.init == "peft_default" else "zeros",
            )
        if hp.init == "reverse_random":
            gen = torch.Generator().manual_seed(derive_seed("init"))
            for layer in self.adapted.values():
                A0, B0 = reverse_random_factors(layer.in_features, layer.out_features, hp.rank, gen)
                self._set_factors(layer, A0, B0)
        if hp.init != "gap":
            self._record_no_op()

    def on_fit_start(self) -> None:  # and before a validate or test without a checkpoint
        self._initialise()

    on_validation_start = on_test_start = on_fit_start

    def _initialise(self) -> None:
        """(1)–(3) once, with the model on its device; a checkpoint's factors (``on_load_checkpoint``) stand instead."""
        if self.initialised:
            return
        gaps = self.layer_gaps(self.trainer.datamodule.calibration_dataloader())
        hp, gen = self.hparams, torch.Generator().manual_seed(derive_seed("init"))
        cosines = []
        for name, layer in self.adapted.items():
            g_hat, per_sample = gaps[int(LAYER.search(name).group(1))]
            d = g_hat.numel()
            if layer.out_features == d:  # (3) B[:, 0] = ĝ_l, A = 0
                A0, B0 = gap_factors(g_hat, layer.in_features, hp.rank, per_sample, hp.noise, gen)
                cosines.append(torch.nn.functional.cosine_similarity(B0[:, 0], g_hat, dim=0))
            elif hp.mismatch == "map" and layer.in_features == d and hp.rank == 1:  # reconstructed: W₀ ĝ
                W0 = layer.base.weight.detach().float().cpu()
                A0, B0 = gap_factors(g_hat, d, 1, None, hp.noise, gen, map_gap_through=W0)
            else:  # PEFT's default for a module whose spaces are not the gap's
                A0 = torch.empty(hp.rank, layer.in_features)
                torch.nn.init.kaiming_uniform_(A0, a=5**0.5, generator=gen)
                B0 = torch.zeros(layer.out_features, hp.rank)
            self._set_factors(layer, A0, B0)
        self.init_cos_B_g.fill_(float(torch.stack(cosines).mean()) if cosines else float("nan"))
        self.init_gap_norm.fill_(float(torch.stack([g[1].mean(0).norm() for g in gaps.values()]).mean()))
        if not torch.is_inference_mode_enabled():  # validate / test run in it: no gradient to read
            first = next(iter(self.trainer.datamodule.calibration_dataloader()))
            self.init_rho_g.fill_(self.gap_dominance_at_init(first, {k: g[0] for k, g in gaps.items()}))
        self._record_no_op()
        self.initialised = True

    @torch.enable_grad()
    def gap_dominance_at_init(self, batch: dict[str, Tensor], g_hats: dict[int, Tensor]) -> float:
        """The premise (spec §6.7, §7.4): ρ_g = E[(ĝ_l·δ)²] / E[‖δ‖²] of the captioning loss's gradients δ at the
        outputs of the adapted modules of width d, at step 0 (the adapters are a no-op, so δ is the same under
        every init rule), on one calibration batch; the mean over modules (1/d for directions unrelated to ĝ)."""
        ratios, handles = [], []

        def tap(g_hat: Tensor):
            def hook(module, inputs, output: Tensor) -> None:
                output.register_hook(
                    lambda d: ratios.append(gap_dominance(d.reshape(-1, d.shape[-1]), g_hat))
                )

            return hook

        for name, layer in self.adapted.items():
            g_hat = g_hats[int(LAYER.search(name).group(1))].to(self.device)
            if layer.out_features == g_hat.numel():
                handles.append(layer.register_forward_hook(tap(g_hat)))
        try:
            with self.trainer.precision_plugin.forward_context():
                self._forward({k: v.to(self.device) for k, v in batch.items()}).loss.backward()
        finally:
            for handle in handles:
                handle.remove()
            for p in adapter_parameters(self.adapted):
                p.grad = None  # a measurement, not a training step
        return sum(ratios) / len(ratios) if ratios else float("nan")

    def layer_gaps(self, loader) -> dict[int, tuple[Tensor, Tensor]]:
        """(1)–(2): ``{l: (ĝ_l, per-sample gaps [n, d])}`` for l = 0..L−1 from a pass of the frozen model (its
        adapters are still a no-op) over ``loader``. Each pair's hidden states are pooled to its two means as the
        batch passes (``modality_means``); ``estimate_layer_gaps`` then reads the pooled [n, 2, d] (visual mean,
        text mean), which is the same as reading every position."""
        with self.trainer.precision_plugin.forward_context():
            pooled = modality_means(
                self.model, loader, self.encoder.image_token_id, self.n_layers, self.device
            )
        n = pooled[0].shape[0]
        only = lambda k: torch.tensor([[k == 0, k == 1]] * n)  # noqa: E731  (position 0: visual, 1: text)
        return estimate_layer_gaps(pooled, only(0), only(1), self.hparams.smooth)

    @torch.no_grad()
    def _set_factors(self, layer: AdapterLinear, A0: Tensor, B0: Tensor) -> None:
        branch = layer.branches["default"]
        branch.A.copy_(A0)
        branch.B.copy_(B0)

    @torch.no_grad()
    def _record_no_op(self) -> None:
        self.init_max_delta.fill_(max(float(m.delta_weight().abs().max()) for m in self.adapted.values()))

    # ---- training (4) and evaluation -------------------------------------------------------------------
    def _forward(self, batch: dict[str, Any]):
        return self.model(
            pixel_values=batch["pixel_values"].to(self.model.dtype),
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
        )

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self._forward(batch).loss
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["input_ids"]))
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_bleu)

    def test_step(self, batch, batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_bleu)

    def _evaluate(self, batch: dict[str, Any], stage: str, bleu: BLEUScore) -> None:
        out = self._forward(batch)
        target = batch["labels"][:, 1:]
        scored = target != -100
        n_tokens = int(scored.sum())
        correct = (out.logits[:, :-1].argmax(-1) == target) & scored
        self.log(f"{stage}/loss", out.loss, batch_size=n_tokens, sync_dist=True)
        self.log(f"{stage}/token_acc", correct.sum() / n_tokens, batch_size=n_tokens, sync_dist=True)
        captions = decode_captions(self.model, self.encoder, batch["pixel_values"], self.decoding)
        decoded = [metric_words(c) for c in captions]
        refs = [[metric_words(r) for r in rs] for rs in batch["references"]]
        bleu.update(decoded, refs)
        self.log(f"{stage}/bleu4", bleu, batch_size=len(refs))
        self.decoded += zip(decoded, refs)
        if stage == "val":  # what the init measured (NaN where not measured: not logged)
            for key in INIT_STATS:
                value = getattr(self, f"init_{key}")
                if torch.isfinite(value):
                    self.log(f"init/{key}", value, batch_size=1, sync_dist=True)

    def on_validation_epoch_end(self) -> None:
        self._log_cider("val")

    def on_test_epoch_end(self) -> None:
        self._log_cider("test")

    def _log_cider(self, stage: str) -> None:
        # over every rank's images (so equal on every rank); the next epoch starts empty
        cider, self.decoded = corpus_cider(self.decoded), []
        if cider is not None:
            self.log(f"{stage}/cider", cider, batch_size=1, sync_dist=True)

    def on_before_optimizer_step(self, optimizer) -> None:
        # the first step's gradients (spec §7.3): Gap-Init's reach A only, PEFT's default's B only
        if self.global_step == 0:
            for key in ("A", "B"):
                grads = [m.branches["default"].factors()[key].grad for m in self.adapted.values()]
                norms = [g.float().norm() for g in grads if g is not None]
                getattr(self, f"init_grad_{key}").fill_(float(torch.stack(norms).norm()) if norms else 0.0)

    def configure_optimizers(self):
        hp = self.hparams
        opt = torch.optim.AdamW(
            adapter_parameters(self.adapted), lr=hp.lr, betas=(0.9, 0.999), weight_decay=hp.weight_decay
        )
        total = int(self.trainer.estimated_stepping_batches)
        sched = warmup_then_decay_lr(opt, warmup_steps=hp.warmup_steps, total_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- checkpoints: what trains, not the public backbone -----------------------------------------------
    def _own_keys(self, state: dict[str, Tensor]) -> list[str]:
        """The adapter factors and the init statistics (no branch is ever merged here, so the adapters' merge
        records, their ``_extra_state``, are empty and stay out)."""
        trainable = {n for n, p in self.named_parameters() if p.requires_grad}
        return [k for k in state if k in trainable or k.startswith("init_")]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint["state_dict"]
        checkpoint["state_dict"] = {k: state[k] for k in self._own_keys(state)}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Refuse a checkpoint whose tensors are not exactly this model's own (loading is not strict: the frozen
        backbone is not in it, so Lightning would pass over a missing or a surplus adapter tensor in silence)."""
        own, saved = set(self._own_keys(self.state_dict())), set(checkpoint["state_dict"])
        for what, keys in (("lacks", sorted(own - saved)), ("has surplus", sorted(saved - own))):
            if keys:
                raise CheckpointError(
                    f"the checkpoint {what} {len(keys)} adapter tensors (first: {keys[0]!r}) for "
                    f"{type(self).__name__} with targets {self.targets}, rank {self.hparams.rank} on "
                    f"{self.hparams.backbone!r}: it was written by another model"
                )
        self.initialised = True  # the factors come from the checkpoint


# ---- stand-in (issue 32) -------------------------------------------------------------------------------------
def stand_in_gap_init(workdir: Path) -> list[str]:
    """``litlab fit --config configs/gap_init/full.yaml`` on the CPU: a tiny ``Blip2ForConditionalGeneration`` with
    its ``Blip2Processor`` (``blip2_captioning.write_tiny_blip2``, its tokenizer trained on the captions) and a COCO
    folder in the Karpathy layout (``write_coco_karpathy``: 14 images, ``dataset_coco.json``). Fit: 2 steps of
    batch 2 (one epoch) in fp32, 8 calibration pairs, short decoding."""
    coco, model_dir = workdir / "coco", workdir / "blip2-opt-tiny"
    captions = write_coco_karpathy(coco, torch.Generator().manual_seed(0))
    write_tiny_blip2(model_dir, [f"a photo of {pre_caption(c)}\n" for c in captions])
    return [
        f"--model.init_args.backbone={model_dir}",
        "--model.init_args.dtype=float32",
        "--model.init_args.warmup_steps=1",
        "--model.init_args.decoding.max_new_tokens=4",
        "--model.init_args.decoding.min_new_tokens=1",
        "--model.init_args.decoding.num_beams=2",
        f"--data.init_args.data_root={coco}",
        "--data.init_args.batch_size=2",
        "--data.init_args.eval_batch_size=2",
        "--data.init_args.calib_size=8",
        "--data.init_args.num_workers=0",
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.precision=32",
        "--trainer.limit_train_batches=2",  # epochs of 2 steps: max_steps=20 (.ci/gpu_checks) is 10 epochs
        "--trainer.max_epochs=10",
        "--trainer.max_steps=2",
        "--trainer.accumulate_grad_batches=1",
        "--trainer.log_every_n_steps=1",
    ]
