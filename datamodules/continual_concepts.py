"""Continual concept personalisation data: a procedural shapes world (quick scale) or a local concept folder.

Quick scale (the CPU experiment of SCNS, "Submodular Concept Neuron Selection", ICML 2026; reconstructed, the
paper's body was not readable): 16×16 RGB renders in [-1, 1].

* base world: "a {colour} {shape}" — 6 shapes × 8 solid colours, random position, size and grey background
  shade; a base model (UNet + text encoder) is pre-trained on it, with the colour word dropped from a fifth of
  the prompts so that "a {shape}" is a prompt the base model knows (reconstructed).
* concepts t = 0..T-1: a base shape with a fixed two-colour pattern (vertical stripes, checker, horizontal
  stripes, half-split, diagonal hatching) never seen in pre-training; ``images_per_concept`` training renders
  with position / size jitter, prompt "a <V_t> {shape}"; a held-out set of ``heldout_per_concept`` fresh renders
  with a fixed ``(tau, eps)`` grid for the held-out denoising loss. ``concept_order`` says which entry of
  ``CONCEPTS`` task t draws (default entry t); an order that repeats a shape makes the stream conflict with itself
  (a second circle under the class word "circle").

Rendering is vectorised over images (masks from one coordinate grid). Randomness comes from the run's seed by
name (``core.seeding.derive_seed``): the renders, the held-out split and noise and the base-preservation set from
"data", the order of the training batches from "data.order", the calibration prompts from "prompts". The vocabulary
is word-level and fixed (no tokenizer download); the concept tokens ``<V0>`` … are reserved rows of it, so the
text encoder's embedding keeps its shape over the task sequence.

Full scale (``data_root``) reads a local folder in the CIFC / Custom-Diffusion layout (``images/<concept>/*.jpg``,
``caption/<concept>/<image stem>.txt``); nothing is downloaded, and a missing or empty concept folder stops the run
at once, naming it. Concepts t = 0..T-1 are the first ``num_concepts`` of ``concept_names``, in that order; each
one's images are resized (shorter side, bicubic) and centre-cropped to ``image_size``, in [-1, 1]; a seeded split
(the "data" stream, t) keeps ``heldout_images`` of them for the held-out grid and trains on the rest. Its class word
is ``class_words[t]`` (default: the folder name without trailing digits, ``_`` read as a space: "duck_toy" ->
"duck toy"). Prompts: an image's caption file, with ``<V_t>`` put before the first occurrence of the class word
(or "a <V_t> {class word}, " before the caption when the caption does not name it); without a caption file the
prompt is "a <V_t> {class word}" (``caption_sources[t]`` says which: "captions", "prompt" or "mixed"; one log
line per concept says it too). The held-out loss and the samples use "a <V_t> {class word}"; base preservation is
every concept's held-out images under "a {class word}" [R]; the general-neuron calibration prompts are templates
over the class words. ``images_per_concept`` and ``heldout_per_concept`` apply to the procedural world only. The
folder world has no base world to pre-train on: it runs on a pretrained checkpoint, whose tokenizer the harness
hands over with ``use_tokenizer`` (the captions and token rows are that tokenizer's).

Task ``t`` owns epoch ``t`` of one fit (one epoch = ``steps_per_task`` batches); the harness reads the task of the
current epoch through ``task_of_epoch``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from litlab.lit_modules.core.seeding import derive_seed

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
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
CALIBRATION_TEMPLATES = (  # generic prompts for the general-neuron calibration of a folder world
    "a photo of a {c}",
    "a {c} on a beach",
    "a {c} in the snow",
    "a painting of a {c}",
    "a close-up photo of a {c}",
    "a {c} in a city street",
    "a sketch of a {c}",
    "a {c} on a wooden table",
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
        data_root: str | None = None,
        concept_names: list[str] | None = None,
        class_words: list[str] | None = None,
        heldout_images: int = 1,
        concept_order: list[int] | None = None,
    ):
        super().__init__()
        if data_root is None and not 1 <= num_concepts <= MAX_CONCEPTS:
            raise ValueError(f"num_concepts must be in 1..{MAX_CONCEPTS}, got {num_concepts}")
        self.num_concepts = num_concepts
        self.concept_order = check_concept_order(concept_order, num_concepts)  # the procedural world's
        self.images_per_concept = images_per_concept
        self.image_size = image_size
        self.steps_per_task = steps_per_task
        self.batch_size = batch_size
        self.heldout_per_concept = heldout_per_concept
        self.eval_timesteps = list(eval_timesteps)
        self.num_calibration_prompts = num_calibration_prompts
        self._data_seed: int | None = None  # the run's "data" stream, drawn at first use
        self.data_root = data_root
        self.concept_names = concept_names
        self.vocab = VOCAB
        self.seq_len = SEQ_LEN
        self.heldout_images = heldout_images
        self._tokenize: Callable[[list[str]], Tensor] = tokenize
        self._token_id: Callable[[str], int] = token_id
        self._train: list[Tensor] = []
        self._heldout: list[Tensor] = []
        self._captions: list[list[str]] = []  # the training images' prompts (folder world)
        self.caption_sources: list[str] = []
        if data_root is not None:
            check_concept_folder(data_root, None)  # the folder itself first
            if not concept_names:
                raise ValueError(
                    f"data_root {data_root} needs data.init_args.concept_names; expected {CIFC_LAYOUT}"
                )
            if not 1 <= num_concepts <= len(concept_names):
                raise ValueError(
                    f"num_concepts must be in 1..{len(concept_names)} (the concept_names given), got {num_concepts}"
                )
            if class_words is not None and len(class_words) < num_concepts:
                raise ValueError(f"class_words has {len(class_words)} entries for {num_concepts} concepts")
            if heldout_images < 1:
                raise ValueError(f"heldout_images must be >= 1, got {heldout_images}")
            self.concept_names = list(concept_names[:num_concepts])
            check_concept_folder(data_root, self.concept_names, min_images=heldout_images + 1)
        self.class_words = (
            list(class_words[:num_concepts])
            if class_words
            else [default_class_word(n) for n in self.concept_names or []]
        )

    @property
    def data_seed(self) -> int:
        """The seed of the world this DataModule draws (renders, held-out split and noise, base-preservation
        set): the run's "data" stream, drawn once, so the data stays the data the DataModule first served."""
        if self._data_seed is None:
            self._data_seed = derive_seed("data")
        return self._data_seed

    def use_tokenizer(
        self, tokenize_fn: Callable[[list[str]], Tensor], token_id_fn: Callable[[str], int]
    ) -> None:
        """Prompts and token rows from a model's tokenizer instead of the fixed word-level vocabulary
        (``tokenize_fn(prompts) -> ids``, ``token_id_fn(word) -> row``; the harness passes its base's)."""
        self._tokenize, self._token_id = tokenize_fn, token_id_fn

    # ---- what the base model is pre-trained on -----------------------------------------------------
    def data_key(self) -> dict:
        if self.data_root is not None:
            return {
                "folder": str(self.data_root),
                "concepts": self.concept_names,
                "image_size": self.image_size,
            }
        return {"world": "shapes-v1", "image_size": self.image_size}

    def base_batch(self, batch_size: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """``batch_size`` base-world images and their prompt ids; the colour word dropped with prob. 0.2."""
        if self.data_root is not None:
            raise ValueError(
                f"the concept folder {self.data_root} has no base world to pre-train a small base on; give the "
                "model a pretrained checkpoint (model.init_args.pretrained_path)"
            )
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

    def base_eval_set(self) -> tuple[Tensor, Tensor]:
        """One render of each of the 48 base prompts "a {colour} {shape}" (base preservation, tau = 500; the
        "data" stream). Folder world: every concept's held-out images under its class-only prompt
        "a {class word}" [R]."""
        if self.data_root is not None:
            self.setup()
            prompts = [self.class_prompt(t) for t in range(self.num_concepts) for _ in self._heldout[t]]
            return torch.cat(self._heldout), self._tokenize(prompts)
        gen = torch.Generator().manual_seed(self.data_seed * 7919 + 90_000)
        pairs = [(s, c) for s in range(len(SHAPES)) for c in range(len(COLOURS))]
        shape = torch.tensor([s for s, _ in pairs])
        colour = torch.tensor([c for _, c in pairs])
        table = torch.tensor(list(COLOURS.values()))
        x = render(shape, table[colour], None, None, self.image_size, gen)
        names = list(COLOURS)
        return x, self._tokenize([f"a {names[c]} {SHAPES[s]}" for s, c in pairs])

    # ---- concepts ------------------------------------------------------------------------------
    def concept(self, t: int) -> dict:
        if self.data_root is not None:
            return {"name": self.concept_names[t], "token": f"<V{t}>", "class_word": self.class_words[t]}
        shape, pattern, c1, c2 = CONCEPTS[self.concept_order[t]]
        return {
            "shape": shape,
            "pattern": pattern,
            "colours": (c1, c2),
            "token": f"<V{t}>",
            "class_word": shape,
        }

    def concept_prompt(self, t: int) -> str:
        c = self.concept(t)
        return f"a {c['token']} {c['class_word']}"

    def class_prompt(self, t: int) -> str:
        return f"a {self.concept(t)['class_word']}"

    def concept_tokens(self) -> list[str]:
        return [self.concept(t)["token"] for t in range(self.num_concepts)]

    def token_ids(self, t: int) -> tuple[int, int]:
        """(id of <V_t>, id of its class word): the row to train and the row it is initialised from."""
        c = self.concept(t)
        return self._token_id(c["token"]), self._token_id(c["class_word"])

    def _render_concept(self, t: int, n: int, gen: torch.Generator) -> Tensor:
        shape, pattern, c1, c2 = CONCEPTS[self.concept_order[t]]
        idx = torch.full((n,), SHAPES.index(shape), dtype=torch.long)
        col1 = torch.tensor(COLOURS[c1]).expand(n, 3)
        col2 = torch.tensor(COLOURS[c2]).expand(n, 3)
        return render(idx, col1, col2, pattern, self.image_size, gen, jitter=0.6)

    def setup(self, stage: str | None = None) -> None:
        if self._train:
            return
        if self.data_root is not None:
            self._load_folder()
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

    def _load_folder(self) -> None:
        root = Path(self.data_root)
        self._train, self._heldout, self._captions, self.caption_sources = [], [], [], []
        for t, name in enumerate(self.concept_names):
            files = concept_images(root, name)
            gen = torch.Generator().manual_seed(self.data_seed * 7919 + 101 * t + 1)
            order = torch.randperm(len(files), generator=gen).tolist()
            held, train = order[: self.heldout_images], order[self.heldout_images :]
            images = torch.stack([load_image(f, self.image_size) for f in files])
            prompts, sources = [], set()
            for i in train:
                caption_file = root / "caption" / name / f"{files[i].stem}.txt"
                if caption_file.is_file():
                    prompts.append(self.caption_prompt(t, caption_file.read_text().strip()))
                    sources.add("captions")
                else:
                    prompts.append(self.concept_prompt(t))
                    sources.add("prompt")
            self._train.append(images[train])
            self._heldout.append(images[held])
            self._captions.append(prompts)
            self.caption_sources.append(sources.pop() if len(sources) == 1 else "mixed")
            fallback = repr(self.concept_prompt(t))
            said = {
                "captions": "caption files",
                "prompt": fallback,
                "mixed": f"caption files, else {fallback}",
            }
            rank_zero_info(
                f"concept {t} {name!r} (class word {self.class_words[t]!r}, token <V{t}>): {len(train)} training "
                f"images, {len(held)} held out; prompts from {said[self.caption_sources[t]]}"
            )

    def caption_prompt(self, t: int, caption: str) -> str:
        """``<V_t>`` put before the first occurrence of the class word in ``caption`` (whole words, any case),
        or "a <V_t> {class word}, {caption}" when the caption does not name it."""
        c = self.concept(t)
        words = r"\s+".join(re.escape(w) for w in c["class_word"].split())
        pattern = re.compile(rf"(?<![\w<])({words})(?!\w)", re.IGNORECASE)
        if caption and pattern.search(caption):
            return pattern.sub(lambda m: f"{c['token']} {m.group(1)}", caption, count=1)
        return f"{self.concept_prompt(t)}, {caption}" if caption else self.concept_prompt(t)

    def task_prompts(self, t: int) -> list[str]:
        """The prompt of each training image of concept t (``task_images(t)``'s order)."""
        self.setup()
        if self.data_root is not None:
            return list(self._captions[t])
        return [self.concept_prompt(t)] * len(self._train[t])

    def heldout(self, t: int, noise_shape: tuple[int, ...] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Concept t's held-out grid: images (N, 3, H, W), timesteps (N,), noise (N, *noise_shape) (default the
        image's shape; the latent shape for a latent model), with N = held-out images × len(eval_timesteps)
        and the noise fixed by (the "data" stream, t)."""
        self.setup()
        x = self._heldout[t]
        taus = torch.tensor(self.eval_timesteps)
        xs = x.repeat_interleave(len(taus), dim=0)
        ts = taus.repeat(len(x))
        gen = torch.Generator().manual_seed(self.data_seed * 7919 + 50_000 + t)
        shape = xs.shape if noise_shape is None else (len(xs), *noise_shape)
        return xs, ts, torch.randn(shape, generator=gen)

    def calibration_prompts(self) -> list[str]:
        """``num_calibration_prompts`` generic prompts from templates (CNS's general-neuron calibration)."""
        if self.data_root is not None:
            return [
                CALIBRATION_TEMPLATES[i % len(CALIBRATION_TEMPLATES)].format(
                    c=self.class_words[(i // len(CALIBRATION_TEMPLATES)) % len(self.class_words)]
                )
                for i in range(self.num_calibration_prompts)
            ]
        gen = torch.Generator().manual_seed(derive_seed("prompts"))
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
        """``steps_per_task`` batches of the current task's images with their prompts (sampled with
        replacement, order from the run's "data.order" stream and the task)."""
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        t = self.task_of_epoch(epoch)
        x = self.task_images(t)
        gen = torch.Generator().manual_seed(derive_seed("data.order") * 1000 + t)
        idx = torch.randint(0, len(x), (self.steps_per_task * self.batch_size,), generator=gen)
        if self.data_root is not None:
            ids = self._tokenize(self.task_prompts(t))[idx]
        else:
            ids = self._tokenize([self.concept_prompt(t)]).expand(len(idx), -1).clone()
        return DataLoader(TensorDataset(x[idx], ids), batch_size=self.batch_size, shuffle=False)


def check_concept_order(order: list[int] | None, num_concepts: int) -> list[int]:
    """Task t's entry of ``CONCEPTS`` (default: entry t); distinct entries, one per task."""
    if order is None:
        return list(range(num_concepts))
    order = list(order)
    if (
        len(order) < num_concepts
        or len(set(order)) != len(order)
        or not all(0 <= i < MAX_CONCEPTS for i in order)
    ):
        raise ValueError(
            f"concept_order must name at least num_concepts = {num_concepts} distinct entries of CONCEPTS "
            f"(0..{MAX_CONCEPTS - 1}), got {order}"
        )
    return order[:num_concepts]


def default_class_word(concept_name: str) -> str:
    """A concept folder's name read as its class word: "duck_toy" -> "duck toy", "dog2" -> "dog"."""
    return re.sub(r"\d+$", "", concept_name).replace("_", " ").strip() or concept_name


def concept_images(root: Path, name: str) -> list[Path]:
    folder = root / "images" / name
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def load_image(path: Path, size: int) -> Tensor:
    """(3, size, size) in [-1, 1]: shorter side resized to ``size`` (bicubic), centre crop."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        w, h = img.size
        scale = size / min(w, h)
        img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.BICUBIC)
        w, h = img.size
        left, top = (w - size) // 2, (h - size) // 2
        img = img.crop((left, top, left + size, top + size))
        arr = np.asarray(img, dtype=np.float32)
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous() / 127.5 - 1.0


def check_concept_folder(data_root: str, concept_names: list[str] | None, min_images: int = 1) -> None:
    """Stop at once when the full-scale concept folder, a concept's image folder or its images are missing
    (nothing is downloaded); caption files are optional."""
    root = Path(data_root)
    if not (root / "images").is_dir():
        raise FileNotFoundError(f"concept folder {root} not found or incomplete; expected {CIFC_LAYOUT}")
    for name in concept_names or []:
        if not (root / "images" / name).is_dir():
            raise FileNotFoundError(
                f"concept {name!r} has no folder {root / 'images' / name}; expected {CIFC_LAYOUT}"
            )
        found = len(concept_images(root, name))
        if found < min_images:
            raise FileNotFoundError(
                f"concept {name!r}: {found} images ({', '.join(IMAGE_SUFFIXES)}) in {root / 'images' / name}, "
                f"needs at least {min_images} (heldout_images + 1 to train on)"
            )
