"""Continual concept personalisation data: a procedural shapes world (quick scale) or a local concept folder.

Quick scale (the CPU experiment of SCNS, "Submodular Concept Neuron Selection", ICML 2026; reconstructed, the
paper's body was not readable): 16×16 RGB renders in [-1, 1].

* base world: "a {colour} {shape}" — 6 shapes × 8 solid colours, random position, size and grey background
  shade; a base model (UNet + text encoder) is pre-trained on it, with the colour word dropped from a fifth of
  the prompts so that "a {shape}" is a prompt the base model knows (reconstructed).
* concepts t = 0..T-1: a base shape with a fixed two-colour pattern (vertical stripes, checker, horizontal
  stripes, half-split, diagonal hatching) never seen in pre-training; ``images_per_concept`` training renders
  with position / size jitter, prompt "a <V_t> {shape}"; a held-out set of ``heldout_per_concept`` fresh renders
  with a fixed ``(tau, eps)`` grid for the held-out denoising loss.

Rendering is vectorised over images (masks from one coordinate grid), seeded by ``data_seed``. The vocabulary
is word-level and fixed (no tokenizer download); the concept tokens ``<V0>`` … are reserved rows of it, so the
text encoder's embedding keeps its shape over the task sequence.

Full scale reads a local folder in the CIFC / Custom-Diffusion layout (``images/<concept>/*.jpg``,
``caption/<concept>/*.txt``): nothing is downloaded, and a missing folder stops the run at once.

Task ``t`` owns epoch ``t`` of one fit (one epoch = ``steps_per_task`` batches); the harness reads the task of the
current epoch through ``task_of_epoch``.
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring")
COLOURS = {
    "red": (1.0, -0.8, -0.8),
    "green": (-0.8, 0.9, -0.8),
    "blue": (-0.8, -0.6, 1.0),
    "yellow": (1.0, 0.9, -0.8),
    "purple": (0.5, -0.8, 0.8),
    "cyan": (-0.8, 0.9, 0.9),
    "orange": (1.0, 0.2, -0.9),
    "white": (1.0, 1.0, 1.0),
}
PATTERNS = ("vstripes", "checker", "hstripes", "half", "diagonal")
# (shape, pattern, colour 1, colour 2) of each concept, in task order
CONCEPTS = (
    ("circle", "vstripes", "red", "blue"),
    ("square", "checker", "yellow", "purple"),
    ("triangle", "hstripes", "green", "orange"),
    ("diamond", "half", "cyan", "red"),
    ("ring", "diagonal", "white", "green"),
    ("cross", "vstripes", "orange", "cyan"),
    ("square", "diagonal", "blue", "yellow"),
    ("circle", "checker", "green", "white"),
    ("triangle", "half", "purple", "yellow"),
    ("diamond", "hstripes", "white", "blue"),
)
MAX_CONCEPTS = len(CONCEPTS)
WORDS = ("a", "photo", "of", "small", "big", "bright", "dark", "on", "the", "left", "right", "in", "middle")
VOCAB = ("<pad>", "<bos>", "<eos>", *WORDS, *SHAPES, *COLOURS, *(f"<V{i}>" for i in range(MAX_CONCEPTS)))
SEQ_LEN = 8
TEMPLATES = (
    "a {colour} {shape}",
    "a photo of a {shape}",
    "a small {colour} {shape}",
    "a big {shape}",
    "a {shape} on the left",
    "a bright {colour} {shape}",
    "a dark {shape}",
    "the {colour} {shape} in the middle",
)

CIFC_LAYOUT = (
    "<data_root>/images/<concept>/*.jpg and <data_root>/caption/<concept>/*.txt (one caption per image, "
    "CIFC / Custom-Diffusion layout, github.com/JiahuaDong/CIFC); concepts in data.init_args.concept_names"
)


def tokenize(prompts: list[str]) -> Tensor:
    """Word-level ids ``[<bos>, words…, <eos>, <pad>…]`` of length ``SEQ_LEN``; an unknown word is an error."""
    index = {w: i for i, w in enumerate(VOCAB)}
    out = torch.zeros(len(prompts), SEQ_LEN, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        words = prompt.split()
        if len(words) > SEQ_LEN - 2:
            raise ValueError(f"prompt {prompt!r} has more than {SEQ_LEN - 2} words")
        unknown = [w for w in words if w not in index]
        if unknown:
            raise ValueError(f"prompt {prompt!r}: words {unknown} are not in the fixed vocabulary")
        ids = [1, *(index[w] for w in words), 2]
        out[row, : len(ids)] = torch.tensor(ids)
    return out


def token_id(word: str) -> int:
    return VOCAB.index(word)


def _shape_masks(dx: Tensor, dy: Tensor, r: Tensor) -> Tensor:
    """(n, 6, H, W) boolean masks of every shape at offsets dx, dy (n, H, W) and radius r (n, 1, 1)."""
    dist = (dx**2 + dy**2).sqrt()
    return torch.stack(
        [
            dist <= r,
            torch.maximum(dx.abs(), dy.abs()) <= r * 0.85,
            (dy <= r * 0.8) & (dy >= -r) & (dx.abs() <= (dy + r) * 0.55),
            dx.abs() + dy.abs() <= r * 1.1,
            ((dx.abs() <= r * 0.35) & (dy.abs() <= r)) | ((dy.abs() <= r * 0.35) & (dx.abs() <= r)),
            (dist <= r) & (dist >= r * 0.55),
        ],
        dim=1,
    )


def _pattern(name: str, xs: Tensor, ys: Tensor, cx: Tensor) -> Tensor:
    if name == "vstripes":
        return (xs.long() // 2) % 2 == 0
    if name == "hstripes":
        return (ys.long() // 2) % 2 == 0
    if name == "checker":
        return ((xs.long() // 2) + (ys.long() // 2)) % 2 == 0
    if name == "half":
        return xs < cx
    if name == "diagonal":
        return ((xs.long() + ys.long()) // 2) % 2 == 0
    raise ValueError(f"unknown pattern {name!r}; expected one of {PATTERNS}")


def render(
    shape_idx: Tensor,
    colour1: Tensor,
    colour2: Tensor | None,
    pattern: str | None,
    size: int,
    gen: torch.Generator,
    jitter: float = 1.0,
) -> Tensor:
    """``n`` images (n, 3, size, size): shape ``shape_idx[i]`` in colour ``colour1[i]`` (n, 3), or the two-colour
    ``pattern`` of ``colour1`` / ``colour2``, at a random centre and radius on a random grey background."""
    n = len(shape_idx)
    ys, xs = torch.meshgrid(
        torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32), indexing="ij"
    )
    half = size / 2
    cx = half - 0.5 + (torch.rand(n, 1, 1, generator=gen) - 0.5) * size * 0.35 * jitter
    cy = half - 0.5 + (torch.rand(n, 1, 1, generator=gen) - 0.5) * size * 0.35 * jitter
    r = size * (0.26 + 0.1 * jitter * torch.rand(n, 1, 1, generator=gen))
    masks = _shape_masks(xs - cx, ys - cy, r)  # (n, 6, H, W)
    mask = masks[torch.arange(n), shape_idx].unsqueeze(1)  # (n, 1, H, W)
    bg = -1.0 + 0.6 * torch.rand(n, 1, 1, 1, generator=gen)
    fg = colour1.view(n, 3, 1, 1).expand(n, 3, size, size)
    if pattern is not None:
        assert colour2 is not None
        pat = _pattern(pattern, xs.expand(n, size, size), ys.expand(n, size, size), cx).unsqueeze(1)
        fg = torch.where(pat, fg, colour2.view(n, 3, 1, 1).expand(n, 3, size, size))
    return torch.where(mask, fg, bg.expand(n, 3, size, size)).contiguous()


class ContinualConceptDataModule(L.LightningDataModule):
    """Base world + a sequence of ``num_concepts`` concepts (see the module docstring)."""

    def __init__(
        self,
        num_concepts: int = 5,
        images_per_concept: int = 5,
        image_size: int = 16,
        steps_per_task: int = 40,
        batch_size: int = 8,
        heldout_per_concept: int = 16,
        eval_timesteps: list[int] = [100, 300, 500, 700, 900],  # noqa: B006
        num_calibration_prompts: int = 64,
        data_seed: int = 0,
        data_root: str | None = None,
        concept_names: list[str] | None = None,
    ):
        super().__init__()
        if not 1 <= num_concepts <= MAX_CONCEPTS:
            raise ValueError(f"num_concepts must be in 1..{MAX_CONCEPTS}, got {num_concepts}")
        self.num_concepts = num_concepts
        self.images_per_concept = images_per_concept
        self.image_size = image_size
        self.steps_per_task = steps_per_task
        self.batch_size = batch_size
        self.heldout_per_concept = heldout_per_concept
        self.eval_timesteps = list(eval_timesteps)
        self.num_calibration_prompts = num_calibration_prompts
        self.data_seed = data_seed
        self.data_root = data_root
        self.concept_names = concept_names
        self.vocab = VOCAB
        self.seq_len = SEQ_LEN
        if data_root is not None:
            check_concept_folder(data_root, concept_names)
        self._train: list[Tensor] = []
        self._heldout: list[Tensor] = []

    # ---- what the base model is pre-trained on -----------------------------------------------------
    def data_key(self) -> dict:
        return {"world": "shapes-v1", "image_size": self.image_size}

    def base_batch(self, batch_size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """``batch_size`` base-world images and their prompt ids; the colour word dropped with prob. 0.2."""
        shape = torch.randint(0, len(SHAPES), (batch_size,), generator=gen)
        colour = torch.randint(0, len(COLOURS), (batch_size,), generator=gen)
        drop = torch.rand(batch_size, generator=gen) < 0.2
        table = torch.tensor(list(COLOURS.values()))
        x = render(shape, table[colour], None, None, self.image_size, gen)
        names = list(COLOURS)
        prompts = [
            f"a {SHAPES[s]}" if d else f"a {names[c]} {SHAPES[s]}"
            for s, c, d in zip(shape.tolist(), colour.tolist(), drop.tolist())
        ]
        return x, tokenize(prompts)

    def base_eval_set(self, gen_seed: int = 12345) -> tuple[Tensor, Tensor]:
        """One render of each of the 48 base prompts "a {colour} {shape}" (base preservation, tau = 500)."""
        gen = torch.Generator().manual_seed(gen_seed)
        pairs = [(s, c) for s in range(len(SHAPES)) for c in range(len(COLOURS))]
        shape = torch.tensor([s for s, _ in pairs])
        colour = torch.tensor([c for _, c in pairs])
        table = torch.tensor(list(COLOURS.values()))
        x = render(shape, table[colour], None, None, self.image_size, gen)
        names = list(COLOURS)
        return x, tokenize([f"a {names[c]} {SHAPES[s]}" for s, c in pairs])

    # ---- concepts ------------------------------------------------------------------------------
    def concept(self, t: int) -> dict:
        shape, pattern, c1, c2 = CONCEPTS[t]
        return {
            "shape": shape,
            "pattern": pattern,
            "colours": (c1, c2),
            "token": f"<V{t}>",
            "class_word": shape,
        }

    def concept_prompt(self, t: int) -> str:
        c = self.concept(t)
        return f"a {c['token']} {c['shape']}"

    def class_prompt(self, t: int) -> str:
        return f"a {self.concept(t)['shape']}"

    def token_ids(self, t: int) -> tuple[int, int]:
        """(id of <V_t>, id of its class word): the row to train and the row it is initialised from."""
        c = self.concept(t)
        return token_id(c["token"]), token_id(c["class_word"])

    def _render_concept(self, t: int, n: int, gen: torch.Generator) -> Tensor:
        shape, pattern, c1, c2 = CONCEPTS[t]
        idx = torch.full((n,), SHAPES.index(shape), dtype=torch.long)
        col1 = torch.tensor(COLOURS[c1]).expand(n, 3)
        col2 = torch.tensor(COLOURS[c2]).expand(n, 3)
        return render(idx, col1, col2, pattern, self.image_size, gen, jitter=0.6)

    def setup(self, stage: str | None = None) -> None:
        if self._train:
            return
        self._train, self._heldout = [], []
        for t in range(self.num_concepts):
            gen = torch.Generator().manual_seed(self.data_seed * 7919 + 101 * t + 1)
            self._train.append(self._render_concept(t, self.images_per_concept, gen))
            self._heldout.append(self._render_concept(t, self.heldout_per_concept, gen))

    def task_images(self, t: int) -> Tensor:
        """The ``images_per_concept`` training renders of concept t (the task's D_t)."""
        self.setup()
        return self._train[t]

    def heldout(self, t: int) -> tuple[Tensor, Tensor, Tensor]:
        """Concept t's held-out grid: images (N, 3, H, W), timesteps (N,), noise (N, 3, H, W), with
        N = heldout_per_concept × len(eval_timesteps) and the noise fixed by (data_seed, t)."""
        self.setup()
        x = self._heldout[t]
        taus = torch.tensor(self.eval_timesteps)
        xs = x.repeat_interleave(len(taus), dim=0)
        ts = taus.repeat(len(x))
        gen = torch.Generator().manual_seed(self.data_seed * 7919 + 50_000 + t)
        return xs, ts, torch.randn(xs.shape, generator=gen)

    def calibration_prompts(self) -> list[str]:
        """``num_calibration_prompts`` generic prompts from templates (CNS's general-neuron calibration)."""
        gen = torch.Generator().manual_seed(777)
        names = list(COLOURS)
        out = []
        for i in range(self.num_calibration_prompts):
            tmpl = TEMPLATES[i % len(TEMPLATES)]
            s = SHAPES[int(torch.randint(0, len(SHAPES), (1,), generator=gen))]
            c = names[int(torch.randint(0, len(names), (1,), generator=gen))]
            out.append(tmpl.format(shape=s, colour=c))
        return out

    # ---- the task of each epoch ------------------------------------------------------------------
    def task_of_epoch(self, epoch: int) -> int:
        return min(epoch, self.num_concepts - 1)

    def train_dataloader(self) -> DataLoader:
        """``steps_per_task`` batches of the current task's renders with its prompt (sampled with
        replacement, order seeded by (PL_GLOBAL_SEED, task))."""
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        t = self.task_of_epoch(epoch)
        x = self.task_images(t)
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0)) * 1000 + t
        gen = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, len(x), (self.steps_per_task * self.batch_size,), generator=gen)
        ids = tokenize([self.concept_prompt(t)]).expand(len(idx), -1)
        return DataLoader(TensorDataset(x[idx], ids.clone()), batch_size=self.batch_size, shuffle=False)


def check_concept_folder(data_root: str, concept_names: list[str] | None) -> None:
    """Stop at once when the full-scale concept folder is missing (nothing is downloaded)."""
    root = Path(data_root)
    if not (root / "images").is_dir() or not (root / "caption").is_dir():
        raise FileNotFoundError(f"concept folder {root} not found or incomplete; expected {CIFC_LAYOUT}")
    for name in concept_names or []:
        if not (root / "images" / name).is_dir():
            raise FileNotFoundError(
                f"concept {name!r} has no folder {root / 'images' / name}; expected {CIFC_LAYOUT}"
            )
