"""Multi-domain data for domain adaptation: one labelled source domain and one or more target domains.

Quick scale is generated here with seeded, vectorised numpy renderers (nothing is downloaded):

* ``render_dsprites_like``: 32×32 RGB shapes (square / ellipse / triangle) with continuous factors (scale, x, y)
  in three render styles that mirror dSprites' colour / noisy / scream domains (``C``, ``N``, ``S``), for
  source-free regression (``RegressionDomainsDataModule``).

Full scale reads the user's image folders and never downloads: ``check_domain_folder`` stops at once with the
folder it looked in and the layout it expects (``DOMAIN_LAYOUTS``); class folders are indexed as torchvision's
``ImageFolder`` does (``class_folder_samples``), image lists as RSD's (``load_image_list``).

Neither DataModule takes a seed: the renders, the digits split and its shifts draw from the run seed's
``"data"`` stream (``derive_seed``), a full-scale target's train/test split from ``"data.split"``, and the order
the target is served in from ``"batches"``, so every run of one card seed sees the same data.

Every loader yields tensors only. The source domain's dataset object is never handed to a target loader
(``source_dataset`` / ``target_train_dataset`` are distinct objects; tests assert it), so a source-free method
that trains on ``train_dataloader()`` cannot see source data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from litlab.lit_modules.core.errors import DatasetUnavailableError
from litlab.lit_modules.core.seeding import derive_seed

# ---- full scale: the layouts we read ---------------------------------------------------------------------------
DOMAIN_LAYOUTS: dict[str, dict] = {
    # classification: <root>/<domain>/<class>/<image>, the layout Office-31, Office-Home and PACS ship in
    # Office-31's archive nests the classes one level down, <domain>/images/<class>/: both are read
    "office31": {
        "domains": ("amazon", "dslr", "webcam"),
        "kind": "class folders",
        "classes": 31,
        "nested": "images",
    },
    "office_home": {
        "domains": ("Art", "Clipart", "Product", "Real_World"),
        "kind": "class folders",
        "classes": 65,
    },
    "pacs": {
        "domains": ("photo", "art_painting", "cartoon", "sketch"),
        "kind": "class folders",
        "classes": 7,
    },
    "domainnet": {
        "domains": ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
        "kind": "class folders",
        "classes": 345,
    },
    # regression: RSD's image lists, <root>/image_list/<domain>.txt with lines "<relative path> <factor> ..."
    # the regression targets are (scale, x, y); RSD's released lists (<domain>.txt beside the image folders) carry
    # (scale, orientation, x, y), Transfer-Learning-Library's all six latents (none, shape, scale, orientation, x,
    # y): "columns" picks the targets out of a line with that many values
    "dsprites": {
        "domains": ("color", "noisy", "scream"),
        "kind": "image list",
        "factors": 3,
        "columns": {4: (0, 2, 3), 6: (2, 4, 5)},
        "aliases": {
            "C": "color",
            "N": "noisy",
            "S": "scream",
        },  # the task letters of RSD's and TLLib's scripts
    },
    "mpi3d": {
        "domains": ("real", "realistic", "toy"),
        "kind": "image list",
        "factors": 2,
        "aliases": {"RL": "real", "RC": "realistic", "T": "toy"},
    },
}


def expected_layout(benchmark: str) -> str:
    spec = DOMAIN_LAYOUTS[benchmark]
    if spec["kind"] == "class folders":
        nested = f" (or <data_root>/<domain>/{spec['nested']}/<class>/<image>)" if "nested" in spec else ""
        return f"<data_root>/<domain>/<class>/<image>{nested}, domains {', '.join(spec['domains'])}"
    widths = " or ".join(str(n) for n in (spec["factors"], *spec.get("columns", {})))
    return (
        f"<data_root>/image_list/<domain>.txt or RSD's <data_root>/<domain>.txt (lines '<image path relative to "
        f"data_root> <{widths} factor values>'), domains {', '.join(spec['domains'])}"
    )


def domain_name(benchmark: str, name: str) -> str:
    """A domain by its name or its task letter(s) (dSprites' C, N, S, as the quick scale's renders are named and
    the cards' runs name them at every scale) -> its name."""
    return DOMAIN_LAYOUTS[benchmark].get("aliases", {}).get(name, name)


def domain_path(benchmark: str, data_root: str | Path, domain: str) -> Path:
    """A domain's class-folder root (``<data_root>/<domain>``, or its ``nested`` folder where the data set ships
    one and it is there) or its image list (``<data_root>/image_list/<domain>.txt``, or RSD's
    ``<data_root>/<domain>.txt`` where only that is there)."""
    spec = DOMAIN_LAYOUTS[benchmark]
    root = Path(data_root)
    if spec["kind"] != "class folders":
        listed, rsd = root / "image_list" / f"{domain}.txt", root / f"{domain}.txt"
        return rsd if rsd.is_file() and not listed.exists() else listed
    nested = root / domain / spec.get("nested", "")
    return nested if "nested" in spec and nested.is_dir() else root / domain


def check_domain_folder(benchmark: str, data_root: str | None, domains: list[str]) -> None:
    """Raise ``DatasetUnavailableError`` naming the first missing folder/list and the expected layout."""
    if benchmark not in DOMAIN_LAYOUTS:
        raise ValueError(f"unknown benchmark {benchmark!r}; expected one of {sorted(DOMAIN_LAYOUTS)}")
    known = DOMAIN_LAYOUTS[benchmark]["domains"]
    for d in domains:
        if d not in known:
            raise ValueError(f"{benchmark} has no domain {d!r}; domains: {', '.join(known)}")
    if data_root is None:
        raise DatasetUnavailableError(
            f"benchmark {benchmark!r} needs data.init_args.data_root, a local folder laid out as "
            f"{expected_layout(benchmark)}; nothing is downloaded at run time"
        )
    for d in domains:
        path = domain_path(benchmark, data_root, d)
        if not path.exists():
            raise DatasetUnavailableError(
                f"benchmark {benchmark!r}: {path} does not exist; data.init_args.data_root={data_root!r} must be "
                f"laid out as {expected_layout(benchmark)}; nothing is downloaded at run time"
            )


def _load_image(path: Path, size: int) -> torch.Tensor:
    from PIL import Image

    img = Image.open(path).convert("RGB").resize((size, size), Image.BILINEAR)
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()


# torchvision.datasets.folder.IMG_EXTENSIONS: the files ImageFolder reads
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def class_names(root: str | Path) -> list[str]:
    """The class folders of one domain folder, sorted (ImageFolder's ``find_classes``)."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir())


def class_folder_samples(root: str | Path) -> tuple[list[str], list[tuple[str, int]]]:
    """(classes, [(image path, class index)]) of one domain folder ``<root>/<class>/<image>``, as torchvision's
    ``ImageFolder(root)`` indexes it (classes: the sorted sub-folder names; images: sorted walk of each class
    folder, the extensions of ``IMG_EXTENSIONS``, case-insensitive). torchvision's own ``ImageFolder`` is used
    when it imports; the same rules written here stand in where it does not (torchvision is an optional
    dependency: its wheels must match the installed torch build)."""
    try:
        from torchvision.datasets import ImageFolder
    except (ImportError, RuntimeError):  # RuntimeError: a torchvision wheel built for another torch
        ImageFolder = None
    if ImageFolder is not None:
        try:
            ds = ImageFolder(str(root), allow_empty=True)
        except FileNotFoundError:  # no class folder at all
            return [], []
        return list(ds.classes), [(str(p), int(c)) for p, c in ds.samples]
    root = Path(root)
    classes = class_names(root)
    samples = []
    for c, name in enumerate(classes):
        for folder, _, files in sorted(os.walk(root / name, followlinks=True)):
            for f in sorted(files):
                if f.lower().endswith(IMG_EXTENSIONS):
                    samples.append((str(Path(folder) / f), c))
    return classes, samples


def load_class_folders(
    benchmark: str, data_root: str, domains: list[str], size: int
) -> tuple[list[str], dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Every image of each domain in the class-folder layout, resized to ``size``×``size``, in [0, 1], and its
    class index; every domain must hold the same class folders (the source's class order indexes them all)."""
    classes, out = None, {}
    for d in domains:
        root = domain_path(benchmark, data_root, d)
        names, samples = class_folder_samples(root)
        if not samples:
            raise DatasetUnavailableError(
                f"benchmark {benchmark!r}: {root} holds no image in a class folder (extensions "
                f"{', '.join(IMG_EXTENSIONS)}); expected {expected_layout(benchmark)}"
            )
        if classes is None:
            classes = names
        elif names != classes:
            extra = sorted(set(names) ^ set(classes))
            raise DatasetUnavailableError(
                f"benchmark {benchmark!r}: {root} has other class folders than {domains[0]!r} (differ: "
                f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}); every domain needs the same classes"
            )
        x = torch.stack([_load_image(Path(path), size) for path, _ in samples])
        out[d] = (x, torch.tensor([c for _, c in samples], dtype=torch.long))
    return classes, out


def load_image_list(
    benchmark: str, data_root: str, domain: str, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A regression domain in RSD's image-list layout: images resized to ``size`` and their factor rows."""
    lines = [
        ln.split() for ln in domain_path(benchmark, data_root, domain).read_text().splitlines() if ln.strip()
    ]
    spec = DOMAIN_LAYOUTS[benchmark]
    columns = {spec["factors"]: tuple(range(spec["factors"])), **spec.get("columns", {})}
    bad = [ln for ln in lines if len(ln) - 1 not in columns]
    if bad:
        raise DatasetUnavailableError(
            f"{domain_path(benchmark, data_root, domain)}: line {' '.join(bad[0])!r} does not have an image path "
            f"and {' or '.join(map(str, columns))} factor values ({expected_layout(benchmark)})"
        )
    x = torch.stack([_load_image(Path(data_root) / ln[0], size) for ln in lines])
    y = torch.tensor([[float(ln[1 + c]) for c in columns[len(ln) - 1]] for ln in lines], dtype=torch.float32)
    return x, y


# ---- quick scale: dSprites-like renders --------------------------------------------------------------------------
DSPRITES_STYLES = ("C", "N", "S")
SHAPES = ("square", "ellipse", "triangle")


def render_dsprites_like(style: str, n: int, rng: np.random.Generator, size: int = 32):
    """``n`` images (n, 3, size, size) in [0, 1] and labels (n, 3) = (normalised scale, x, y) in [0, 1].

    Factors: shape uniform over {square, ellipse, triangle}, scale ~ U(0.5, 1), orientation ~ U(0, 2π) (a
    nuisance), x, y ~ U(0, 1). Geometry in pixel coordinates (pixel centres at +0.5): half-size r = 7·scale,
    centre = 7 + pos·(size − 14); coordinates rotated by θ; square |u|, |v| ≤ 0.8r; ellipse (u/r)² + (v/0.6r)² ≤ 1;
    triangle −0.5r ≤ v ≤ r − 1.53|u|. Styles: ``C`` random colour U(0.3, 1)³ on black; ``N`` white shape on
    per-pixel, per-channel noise U(0, 1); ``S`` shape pixels = 1 − background on a smooth colour texture (per
    channel a sum of 4 terms sin(2π(f_x·x + f_y·y)/4 + φ), f ~ U(0.05, 0.35), φ ~ U(0, 2π), min-max
    normalised), standing in for dSprites' "scream" background.
    """
    if style not in DSPRITES_STYLES:
        raise ValueError(f"unknown dSprites-like style {style!r}; expected one of {DSPRITES_STYLES}")
    shape = rng.integers(0, 3, n)
    scale = rng.uniform(0.5, 1.0, n)
    theta = rng.uniform(0.0, 2 * np.pi, n)
    pos = rng.uniform(0.0, 1.0, (n, 2))
    r = (7.0 * scale)[:, None, None]
    cx = (7.0 + pos[:, 0] * (size - 14))[:, None, None]
    cy = (7.0 + pos[:, 1] * (size - 14))[:, None, None]
    grid = np.arange(size) + 0.5
    px, py = grid[None, None, :], grid[None, :, None]
    c, s = np.cos(theta)[:, None, None], np.sin(theta)[:, None, None]
    u = c * (px - cx) + s * (py - cy)
    v = -s * (px - cx) + c * (py - cy)
    sq = (np.abs(u) <= 0.8 * r) & (np.abs(v) <= 0.8 * r)
    el = (u / r) ** 2 + (v / (0.6 * r)) ** 2 <= 1.0
    tr = (v >= -0.5 * r) & (v <= r - 1.53 * np.abs(u))
    mask = np.where((shape == 0)[:, None, None], sq, np.where((shape == 1)[:, None, None], el, tr))
    mask = mask[:, None].astype(np.float32)  # (n, 1, H, W)
    if style == "C":
        colour = rng.uniform(0.3, 1.0, (n, 3, 1, 1))
        img = mask * colour
    elif style == "N":
        noise = rng.uniform(0.0, 1.0, (n, 3, size, size))
        img = np.where(mask > 0, 1.0, noise)
    else:
        f = rng.uniform(0.05, 0.35, (n, 3, 4, 2))
        phi = rng.uniform(0.0, 2 * np.pi, (n, 3, 4))
        xs = np.arange(size, dtype=np.float64)
        arg = (
            f[..., 0, None, None] * xs[None, None, None, None, :]
            + f[..., 1, None, None] * xs[None, None, None, :, None]
        )  # (n, 3, 4, H, W)
        tex = np.sin(2 * np.pi * arg / 4 + phi[..., None, None]).sum(2)
        lo, hi = tex.min(axis=(2, 3), keepdims=True), tex.max(axis=(2, 3), keepdims=True)
        tex = (tex - lo) / np.maximum(hi - lo, 1e-8)
        img = np.where(mask > 0, 1.0 - tex, tex)
    labels = np.stack([(scale - 0.5) / 0.5, pos[:, 0], pos[:, 1]], axis=1)
    return torch.from_numpy(img.astype(np.float32)), torch.from_numpy(labels.astype(np.float32))


class IndexedImages(Dataset):
    """Images with their position in the domain's set: ``(x, index)``, no labels (an unlabelled target)."""

    def __init__(self, x: torch.Tensor):
        self.x = x

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], i


def weak_augment(x: torch.Tensor, brightness: float, noise: float) -> torch.Tensor:
    """Brightness × U(1 − b, 1 + b) per image and Gaussian noise σ = ``noise``, clipped to [0, 1] (torch's RNG)."""
    scale = 1.0 + (torch.rand(x.shape[0], 1, 1, 1) * 2 - 1) * brightness
    return (x * scale + noise * torch.randn_like(x)).clamp(0.0, 1.0)


class TwoViews:
    """Collate for the unlabelled target loader: ``(view_1, view_2, index)``, two independent weak augmentations."""

    def __init__(self, brightness: float, noise: float):
        self.brightness, self.noise = brightness, noise

    def __call__(self, items):
        x = torch.stack([it[0] for it in items])
        idx = torch.tensor([it[1] for it in items], dtype=torch.long)
        return weak_augment(x, self.brightness, self.noise), weak_augment(x, self.brightness, self.noise), idx


Benchmark = Literal["dsprites_like", "dsprites", "mpi3d"]


class RegressionDomainsDataModule(L.LightningDataModule):
    """A labelled source domain and one unlabelled target domain with continuous labels in [0, 1]^T.

    ``train_dataloader()`` is the target's unlabelled training split, ``(view_1, view_2, index)``;
    ``val_dataloader()`` / ``test_dataloader()`` its labelled test split, ``(x, y)``; ``source_train_loader()``
    the source domain, ``(x, y)``, for the source stage only. Quick scale (``dsprites_like``) renders
    ``n_per_domain`` images per domain from ``np.random.default_rng([derive_seed("data"), domain index])`` and
    splits each target into ``n_target_train`` unlabelled training and the rest test images; the source uses all
    of its own. Full scale (``dsprites``, ``mpi3d``) reads RSD's image lists under ``data_root`` (labels min-max
    normalised with the source domain's range, which ``label_range`` holds) and shuffles the target before the
    70/30 split with ``derive_seed("data.split")``.
    """

    task = "regression"

    def __init__(
        self,
        benchmark: Benchmark = "dsprites_like",
        source: str = "C",
        target: str = "N",
        n_per_domain: int = 1200,
        n_target_train: int = 800,
        size: int = 32,
        batch_size: int = 64,
        aug_brightness: float = 0.1,
        aug_noise: float = 0.03,
        data_root: str | None = None,
        num_workers: int = 0,
    ):
        super().__init__()
        self.save_hyperparameters()
        if benchmark == "dsprites_like":
            for d in (source, target):
                if d not in DSPRITES_STYLES:
                    raise ValueError(f"dsprites_like domains are {DSPRITES_STYLES}, got {d!r}")
            if not 0 < n_target_train < n_per_domain:
                raise ValueError(f"n_target_train must be in (0, {n_per_domain}), got {n_target_train}")
            self.num_outputs = 3
        else:
            source, target = domain_name(benchmark, source), domain_name(benchmark, target)
            check_domain_folder(benchmark, data_root, [source, target])
            self.num_outputs = DOMAIN_LAYOUTS[benchmark]["factors"]
        if source == target:
            raise ValueError(f"source and target are the same domain {source!r}")
        self.source_domain, self.target_domains = source, [target]
        self.target = target
        self.input_shape = (3, size, size)
        self.factor_names = (
            ["scale", "x", "y"] if self.num_outputs == 3 else [f"f{i}" for i in range(self.num_outputs)]
        )
        self._ready = False
        self._render_seed: int | None = None  # the "data" stream the renders were drawn from (set in setup)

    def data_key(self) -> dict:
        """What shapes the source domain's data: part of the source stage's cache key (the renders' seed at
        quick scale; the image list's files at full scale)."""
        h = self.hparams
        key = {"benchmark": h.benchmark, "source": self.source_domain, "n": h.n_per_domain, "size": h.size}
        if h.benchmark == "dsprites_like":
            key["data_seed"] = self._render_seed if self._render_seed is not None else derive_seed("data")
        return key | {"data_root": h.data_root}

    def setup(self, stage: str | None = None) -> None:
        if self._ready:
            return
        h = self.hparams
        if h.benchmark == "dsprites_like":
            self._render_seed = derive_seed("data")

            def dom(name):
                rng = np.random.default_rng([self._render_seed, DSPRITES_STYLES.index(name)])
                return render_dsprites_like(name, h.n_per_domain, rng, h.size)

            xs, ys = dom(h.source)
            xt, yt = dom(h.target)
            self.label_range = torch.tensor([[0.0] * 3, [1.0] * 3])
        else:
            xs, ys = load_image_list(h.benchmark, h.data_root, self.source_domain, h.size)
            xt, yt = load_image_list(h.benchmark, h.data_root, self.target, h.size)
            lo, hi = ys.min(0).values, ys.max(0).values
            self.label_range = torch.stack([lo, hi])
            ys = (ys - lo) / (hi - lo).clamp_min(1e-8)
            yt = ((yt - lo) / (hi - lo).clamp_min(1e-8)).clamp(0, 1)
            perm = torch.randperm(len(xt), generator=torch.Generator().manual_seed(derive_seed("data.split")))
            xt, yt = xt[perm], yt[perm]
        n_tr = h.n_target_train if h.benchmark == "dsprites_like" else int(0.7 * len(xt))
        self.source_dataset = TensorDataset(xs, ys)
        self.target_train_dataset = IndexedImages(xt[:n_tr])
        self.target_test_dataset = TensorDataset(xt[n_tr:], yt[n_tr:])
        self._target_train_labels = yt[:n_tr]  # held back: only tests and diagnostics read it
        self._ready = True

    def target_size(self, target: str | None = None) -> int:
        return len(self.target_train_dataset)

    def source_train_loader(self, batch_size: int = 64, shuffle: bool = True, seed: int = 0) -> DataLoader:
        gen = torch.Generator().manual_seed(seed)
        return DataLoader(self.source_dataset, batch_size=batch_size, shuffle=shuffle, generator=gen)

    def target_plain_loader(self, target: str | None = None, batch_size: int = 256) -> DataLoader:
        """The target's unlabelled training images in order, ``(x, index)``: bank passes, BN statistics."""
        return DataLoader(self.target_train_dataset, batch_size=batch_size, shuffle=False)

    def train_dataloader(self) -> DataLoader:
        # the order depends on (run seed, epoch) only: a resumed run sees the same batches
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        gen = torch.Generator().manual_seed(derive_seed("batches") + 1000 * epoch)
        order = torch.randperm(len(self.target_train_dataset), generator=gen).tolist()
        return DataLoader(
            self.target_train_dataset,
            batch_size=self.hparams.batch_size,
            sampler=order,
            collate_fn=TwoViews(self.hparams.aug_brightness, self.hparams.aug_noise),
            num_workers=self.hparams.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.target_test_dataset, batch_size=400)

    def test_dataloader(self) -> DataLoader:
        return self.val_dataloader()


# ---- quick scale: multi-target digits (classification) ------------------------------------------------------------
DIGIT_TARGETS = ("T1", "T2", "T3")


def _affine(x: torch.Tensor, angle: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate by ``angle`` (radians), scale by ``scale`` and shift by ``shift`` (normalised coords) each image."""
    import torch.nn.functional as F

    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack(
        [torch.stack([cos, -sin, -shift[:, 0]], 1), torch.stack([sin, cos, -shift[:, 1]], 1)], 1
    )  # (n, 2, 3): output -> input sampling grid
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def digits_domains(seed: int, spurious: bool = False) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Source and three targets from scikit-learn's bundled digits (1797 8×8 images), 16×16 RGB in [0, 1.5].

    Shuffled with ``seed`` and split disjointly: source 800 (clean grey digit on black); T1 330 (rotated by
    ±U(10°, 25°), times an RGB tint U(0.4, 1)³); T2 330 (low contrast 0.25 + 0.5·g, Gaussian noise σ = 0.2);
    T3 337 (shrunk to U(0.75, 0.9), shifted ±0.15, pasted on a sinusoidal colour texture
    0.35·(0.5 + 0.5 sin(a x + b y + φ)) per channel). ``spurious``: a label-correlated background cue, in the
    source 80 % of class-k images get background brightness 0.1·(k mod 3), in each target the class-to-level
    mapping is a fresh permutation (the cue misleads there).
    """
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(X), generator=gen)
    x = torch.tensor(X, dtype=torch.float32)[perm].view(-1, 1, 8, 8) / 16.0
    labels = torch.tensor(y, dtype=torch.long)[perm]
    x = F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False).clamp(0, 1).repeat(1, 3, 1, 1)
    cuts = {"source": (0, 800), "T1": (800, 1130), "T2": (1130, 1460), "T3": (1460, len(x))}
    out = {}
    for name, (a, b) in cuts.items():
        g, yy = x[a:b].clone(), labels[a:b]
        n = len(g)
        if name == "T1":
            sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
            angle = sign * (10 + 15 * torch.rand(n, generator=gen)) * torch.pi / 180
            g = _affine(g, angle, torch.ones(n), torch.zeros(n, 2))
            g = g * (0.4 + 0.6 * torch.rand(n, 3, 1, 1, generator=gen))
        elif name == "T2":
            g = 0.25 + 0.5 * g + 0.2 * torch.randn(g.shape, generator=gen)
        elif name == "T3":
            scale = 0.75 + 0.15 * torch.rand(n, generator=gen)
            shift = (torch.rand(n, 2, generator=gen) * 2 - 1) * 0.15
            g = _affine(g, torch.zeros(n), scale, shift).clamp(0, 1)
            coords = torch.linspace(-1, 1, 16)
            ab = (torch.rand(n, 3, 2, generator=gen) * 2 - 1) * 4
            phi = torch.rand(n, 3, generator=gen) * 2 * torch.pi
            arg = (
                ab[..., 0, None, None] * coords[None, None, None, :]
                + ab[..., 1, None, None] * coords[None, None, :, None]
            )
            tex = 0.35 * (0.5 + 0.5 * torch.sin(arg + phi[..., None, None]))
            g = g + (1 - g) * tex
        if spurious:
            levels = torch.arange(10) % 3
            if name != "source":
                levels = levels[torch.randperm(10, generator=gen)]
            apply = torch.rand(n, generator=gen) < (0.8 if name == "source" else 1.0)
            bright = 0.1 * levels[yy].float() * apply.float()
            ink = g.amax(1, keepdim=True).clamp(0, 1)
            g = g + (1 - ink) * bright[:, None, None, None]
        out[name] = (g.clamp(0, 1.5), yy)
    return out


class MultiTargetDigitsDataModule(L.LightningDataModule):
    """A labelled source and the unlabelled targets T1-T3 (``digits_domains``), for multi-target adaptation.

    The digits split and the targets' shifts are drawn from ``derive_seed("data")``. Domain indices: source 0,
    targets 1..M in ``targets`` order. Methods draw their own batches from
    ``source_x/source_y`` and ``target_x[m]`` (an iteration-bounded schedule: ``train_dataloader()`` yields only
    the step index, ``steps`` of them, or with ``steps=0`` as many as the module's ``total_steps()``). Evaluation is transductive (D-CGCT's protocol): ``val_dataloader()``
    yields every target image with its label and domain index, ``(x, y, d)``; labels of target images are read
    by the evaluation only. Full scale (``benchmark`` office31 / office_home / pacs / domainnet) reads the class
    folders ``<data_root>/<domain>/<class>/<image>`` (``class_folder_samples``: torchvision's ImageFolder
    indexing), resized to ``image_size`` in [0, 1] (a ResNet backbone normalises with the ImageNet statistics
    itself), and fails at once without them. Every image is held in memory as float32, as the toy's are: about
    0.6 MB per image at 224, so Office-31 (4,110 images) takes about 2.5 GB, Office-Home (15,588) about 9.4 GB;
    DomainNet (about 600 k images) needs a streaming reader, which this DataModule is not.
    """

    task = "classification"

    def __init__(
        self,
        benchmark: Literal["digits", "office31", "office_home", "pacs", "domainnet"] = "digits",
        source: str = "source",
        targets: list[str] | None = None,
        spurious: bool = False,
        steps: int = 0,
        data_root: str | None = None,
        image_size: int = 224,
    ):
        super().__init__()
        self.save_hyperparameters()
        if benchmark != "digits":
            if not targets:
                raise ValueError(
                    f"benchmark {benchmark!r} needs data.init_args.targets, some of "
                    f"{', '.join(d for d in DOMAIN_LAYOUTS[benchmark]['domains'] if d != source)}"
                )
            check_domain_folder(benchmark, data_root, [source, *targets])
            if spurious:
                raise ValueError("spurious=true is a variant of the digits toy only")
            self.num_outputs = len(class_names(domain_path(benchmark, data_root, source)))
            self.input_shape = (3, image_size, image_size)
        else:
            for t in targets or DIGIT_TARGETS:
                if t not in DIGIT_TARGETS:
                    raise ValueError(f"digits targets are {DIGIT_TARGETS}, got {t!r}")
            self.num_outputs = 10
            self.input_shape = (3, 16, 16)
        targets = list(targets or DIGIT_TARGETS)
        if source in targets:
            raise ValueError(f"the source domain {source!r} is also a target")
        self.source_domain, self.target_domains = source, targets
        self.num_domains = 1 + len(targets)
        self._ready = False
        self._digits_seed: int | None = None  # the "data" stream the digits were drawn from (set in setup)

    def data_key(self) -> dict:
        """What shapes the source domain's data: part of the source stage's cache key."""
        h = self.hparams
        if h.benchmark == "digits":
            seed = self._digits_seed if self._digits_seed is not None else derive_seed("data")
            return {"benchmark": h.benchmark, "data_seed": seed, "spurious": h.spurious}
        # the class folders are the data: no seed shapes them
        return {
            "benchmark": h.benchmark,
            "spurious": h.spurious,
            "data_root": str(h.data_root),
            "source": h.source,
            "image_size": h.image_size,
        }

    def setup(self, stage: str | None = None) -> None:
        if self._ready:
            return
        h = self.hparams
        if h.benchmark == "digits":
            self._digits_seed = derive_seed("data")
            doms = digits_domains(self._digits_seed, h.spurious)
            self.classes = [str(c) for c in range(10)]
        else:
            domains = [self.source_domain, *self.target_domains]
            self.classes, doms = load_class_folders(h.benchmark, h.data_root, domains, h.image_size)
            doms["source"] = doms[self.source_domain]
        self.source_x, self.source_y = doms["source"]
        self.source_dataset = TensorDataset(self.source_x, self.source_y)
        self.target_x = [doms[t][0] for t in self.target_domains]
        self._target_y = [doms[t][1] for t in self.target_domains]  # evaluation only
        self._ready = True

    def source_train_loader(self, batch_size: int = 32, shuffle: bool = True, seed: int = 0) -> DataLoader:
        gen = torch.Generator().manual_seed(seed)
        return DataLoader(self.source_dataset, batch_size=batch_size, shuffle=shuffle, generator=gen)

    def train_dataloader(self) -> DataLoader:
        """Step indices: ``steps``, or (``steps=0``) as many as the module's schedule, ``total_steps()``."""
        n = self.hparams.steps
        module = self.trainer.lightning_module if self.trainer is not None else None
        if not n and module is not None and hasattr(module, "total_steps"):
            n = module.total_steps()
        return DataLoader(torch.arange(max(1, n)), batch_size=1, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        xs = torch.cat(self.target_x)
        ys = torch.cat(self._target_y)
        ds = torch.cat([torch.full((len(x),), m + 1) for m, x in enumerate(self.target_x)])
        return DataLoader(TensorDataset(xs, ys, ds), batch_size=512)
