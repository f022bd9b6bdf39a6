"""A sequence of tasks for continual learning, built offline; the DataModule side of the continual family's
contract (``litlab.lit_modules.continual.contract.ContinualData``).

One ``fit`` walks through the tasks: task ``t`` owns epochs ``[t·E, (t+1)·E)`` with ``E = epochs_per_task``,
and ``train_dataloader()`` (reloaded every epoch: ``trainer.reload_dataloaders_every_n_epochs: 1``) serves
the task of the current epoch. A checkpoint at an epoch boundary therefore resumes in the right task with no
extra state here. Test sets stay per task (``task_test_loader(j)``) for the accuracy matrix R[i, j].

Benchmarks (data that ships with a package, no download):
* ``digits``  sklearn's 8×8 digits, /16, stratified 70/30 split drawn from the run's ``data.split`` stream →
  (1, 8, 8) images.
* ``text``    which of 10 stdlib modules a 64-character docstring snippet comes from (local corpus) → (64,)
  ids.
* ``mnist1d`` MNIST-1D (Greydanus, "Scaling Down Deep Learning", arXiv 2011.14439) generated locally with
  ``mnist1d.data.make_dataset(get_dataset_args())`` (4000/1000, 40 features; the generator seeded from the run's
  ``data`` stream), standardised, cut into 10 tokens of 4 → (10, 4) token sequences. Cached in LITLAB_CACHE.

Scenarios:
* ``split``    class-incremental: classes (``class_order``: sorted, or shuffled by the run's ``data.class_order``
               stream) chunked into tasks.
* ``permuted`` domain-incremental: all classes every task; task t > 0 applies a fixed random feature
               permutation.
* ``rotated``  domain-incremental: task t rotates digits by t·``rotation_step`` degrees (MNIST-1D: circular
               shift by t·``shift_step`` positions).

``cumulative=True`` trains task t on the union of tasks 0..t (the joint-training upper bound).

Seeds: none of its own. Every random draw takes a named stream of the run's one seed
(``litlab.lit_modules.core.seeding.derive_seed``): ``data.split`` the digits / text train-test split, ``data``
MNIST-1D's generation, ``data.class_order`` the shuffled class order, ``data.permutation`` the permuted scenario's
feature permutations, ``data.order`` the batch order of each epoch. So the runs of one card seed see the same
tasks, and another seed draws other ones.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import ConcatDataset, DataLoader, Dataset, TensorDataset

from litlab.datamodules.bundled import load_bundled
from litlab.lit_modules.core.corpus import CharTokenizer, module_docstrings, normalise
from litlab.lit_modules.core.errors import DatasetUnavailableError
from litlab.lit_modules.core.io import atomic_path, cache_dir
from litlab.lit_modules.core.seeding import derive_seed, fingerprint, record_artefact

Benchmark = Literal["digits", "mnist1d", "text", "imagenet_r", "cifar100", "domainnet"]
# ``text``: which stdlib module a 64-character docstring snippet comes from (the local corpus of
# litlab.lit_modules.core.corpus), 10 modules with the most docstring text, for a small pre-trained language
# model (TinyGPT).
TEXT_MODULES = (
    "logging",
    "doctest",
    "difflib",
    "inspect",
    "pdb",
    "typing",
    "threading",
    "ipaddress",
    "statistics",
    "unittest.mock",
)
# Full scale: image folders the user provides, ``<data_root>/{train,test}/<class>/<image>``
# (the layout of InfLoRA's ImageNet-R / DomainNet splits; CIFAR-100 exported to PNG folders).
FOLDER_BENCHMARKS = {
    "imagenet_r": "ImageNet-R (200 classes): https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar, split 80/20 "
    "per class into train/ and test/ as in InfLoRA (github.com/liangyanshuo/InfLoRA)",
    "cifar100": "CIFAR-100: https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz, written out as "
    "train/<class>/*.png and test/<class>/*.png",
    "domainnet": "DomainNet (345 classes, 6 domains): http://ai.bu.edu/M3SDA/, with InfLoRA's train/test lists "
    "arranged as train/<class>/ and test/<class>/",
}
Scenario = Literal["split", "permuted", "rotated"]


def load_digits_split(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """sklearn digits /16, stratified 70/30 train/test split drawn with ``random_state=seed``."""
    from sklearn.model_selection import train_test_split

    X, y = load_bundled("digits")
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, stratify=y, random_state=seed)
    to_img = lambda a: torch.tensor(a / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)  # noqa: E731
    return to_img(Xtr), torch.tensor(ytr), to_img(Xte), torch.tensor(yte)


def load_mnist1d(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MNIST-1D made locally (never ``get_dataset()``, which downloads); cached as a tensor file. ``seed`` 0 is
    the package's default generation; another seed replaces the generator's seed (a new draw of the data)."""

    path = cache_dir() / ("mnist1d-default.pt" if seed == 0 else f"mnist1d-seed{seed}.pt")
    record_artefact("mnist1d", fingerprint("mnist1d", seed))  # a cached data set: the ledger names its draw
    if path.exists():
        d = torch.load(path, weights_only=True)
    else:
        try:
            from mnist1d.data import get_dataset_args, make_dataset
        except ImportError as err:
            raise ImportError("benchmark 'mnist1d' needs the mnist1d package: pip install mnist1d") from err
        args = get_dataset_args()
        if seed:
            args.seed = seed
        raw = make_dataset(args)
        d = {k: torch.tensor(np.asarray(raw[k])) for k in ("x", "y", "x_test", "y_test")}
        with atomic_path(path) as tmp:
            torch.save(d, tmp)
    x, xt = d["x"].float(), d["x_test"].float()
    mean, std = x.mean(), x.std()
    tok = lambda a: ((a - mean) / std).view(-1, 10, 4)  # noqa: E731
    return tok(x), d["y"].long(), tok(xt), d["y_test"].long()


def load_text_snippets(seed: int, chars: int = 64, per_class: int = 280) -> tuple[torch.Tensor, ...]:
    """Character ids of non-overlapping ``chars``-long docstring windows of each of ``TEXT_MODULES`` (label =
    module), ``per_class`` windows each, drawn and split 70/30 with ``seed``."""
    tok, gen = CharTokenizer(), torch.Generator().manual_seed(seed)
    xtr, ytr, xte, yte = [], [], [], []
    for label, name in enumerate(TEXT_MODULES):
        text = "\n\n".join(normalise(d) for d in module_docstrings(importlib.import_module(name)))
        ids = tok.encode(text)
        windows = ids[: len(ids) // chars * chars].view(-1, chars)
        windows = windows[torch.randperm(len(windows), generator=gen)[:per_class]]
        cut = int(0.7 * len(windows))
        xtr.append(windows[:cut])
        xte.append(windows[cut:])
        ytr.append(torch.full((cut,), label))
        yte.append(torch.full((len(windows) - cut,), label))
    return torch.cat(xtr), torch.cat(ytr), torch.cat(xte), torch.cat(yte)


def rotate_images(x: torch.Tensor, degrees: float) -> torch.Tensor:
    if degrees == 0:
        return x
    a = math.radians(degrees)
    theta = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]], dtype=x.dtype)
    grid = F.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False, padding_mode="zeros")


class ContinualDataModule(L.LightningDataModule):
    """Task sequence over one offline benchmark; see the module docstring for the layout of one fit."""

    def __init__(
        self,
        benchmark: Benchmark = "digits",
        scenario: Scenario = "split",
        num_tasks: int = 5,
        epochs_per_task: int = 3,
        batch_size: int = 32,
        class_order: Literal["sorted", "shuffled"] = "sorted",
        rotation_step: float = 30.0,
        shift_step: int = 4,
        cumulative: bool = False,
        num_workers: int = 0,
        data_root: str | None = None,
        image_size: int = 224,
    ):
        super().__init__()
        self.save_hyperparameters()
        if benchmark not in Benchmark.__args__:
            raise ValueError(
                f"unknown continual benchmark {benchmark!r}; expected one of {Benchmark.__args__}"
            )
        if benchmark in FOLDER_BENCHMARKS:
            _check_folder(benchmark, data_root)
        if (benchmark in FOLDER_BENCHMARKS or benchmark == "text") and scenario != "split":
            raise ValueError(
                f"benchmark {benchmark!r} is class-incremental only: scenario must be 'split', got {scenario!r}"
            )
        if scenario not in ("split", "permuted", "rotated"):
            raise ValueError(f"unknown scenario {scenario!r}; expected 'split', 'permuted' or 'rotated'")
        if class_order not in ("sorted", "shuffled"):
            raise ValueError(f"class_order must be 'sorted' or 'shuffled', got {class_order!r}")
        if num_tasks < 1 or epochs_per_task < 1 or batch_size < 1:
            raise ValueError(
                f"num_tasks, epochs_per_task and batch_size must be >= 1, got "
                f"{num_tasks}, {epochs_per_task}, {batch_size}"
            )
        self.num_classes = len(_folder_classes(data_root)) if benchmark in FOLDER_BENCHMARKS else 10
        if scenario == "split" and self.num_classes % num_tasks:
            raise ValueError(
                f"split scenario cuts the {self.num_classes} classes evenly: num_tasks must divide "
                f"{self.num_classes}, got {num_tasks}"
            )
        self.num_tasks, self.epochs_per_task = num_tasks, epochs_per_task
        self._ready = False

    # ---- building the tasks ----------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self._ready:
            return
        hp = self.hparams
        if hp.benchmark in FOLDER_BENCHMARKS:
            self._setup_folders()
            self._ready = True
            return
        if hp.benchmark == "mnist1d":  # generated: the draw is the data itself
            xtr, ytr, xte, yte = load_mnist1d(derive_seed("data"))
        else:  # a fixed data set: the draw is its train-test split
            load = load_digits_split if hp.benchmark == "digits" else load_text_snippets
            xtr, ytr, xte, yte = load(derive_seed("data.split"))
        self.pretext_inputs = xtr  # unlabelled, untransformed training inputs for backbone pre-training
        self.input_kind = {"digits": "image", "mnist1d": "tokens", "text": "text"}[hp.benchmark]
        self.input_shape = tuple(xtr.shape[1:])
        if hp.scenario == "split":
            self.task_classes = self._class_split()
            pick = lambda x, y, cs: (x[torch.isin(y, torch.tensor(cs))], y[torch.isin(y, torch.tensor(cs))])  # noqa: E731
            self.train_sets = [pick(xtr, ytr, cs) for cs in self.task_classes]
            self.test_sets = [pick(xte, yte, cs) for cs in self.task_classes]
        else:
            self.task_classes = [list(range(10)) for _ in range(hp.num_tasks)]
            self.train_sets = [(self._transform(xtr, t), ytr) for t in range(hp.num_tasks)]
            self.test_sets = [(self._transform(xte, t), yte) for t in range(hp.num_tasks)]
        self._ready = True

    def _class_split(self) -> list[list[int]]:
        hp, n = self.hparams, self.num_classes
        if hp.class_order == "sorted":
            order = list(range(n))
        else:
            gen = torch.Generator().manual_seed(derive_seed("data.class_order"))
            order = torch.randperm(n, generator=gen).tolist()
        per = n // hp.num_tasks
        return [order[t * per : (t + 1) * per] for t in range(hp.num_tasks)]

    def _setup_folders(self) -> None:
        hp = self.hparams
        classes = _folder_classes(hp.data_root)
        self.task_classes = self._class_split()
        self.input_kind, self.input_shape = "image", (3, hp.image_size, hp.image_size)
        self.pretext_inputs = None
        files = {
            split: [
                (str(f), c)
                for c, name in enumerate(classes)
                for f in sorted((Path(hp.data_root) / split / name).iterdir())
            ]
            for split in ("train", "test")
        }
        pick = lambda split, cs: _ImageFiles([fc for fc in files[split] if fc[1] in cs], hp.image_size)  # noqa: E731
        self.train_sets = [pick("train", set(cs)) for cs in self.task_classes]
        self.test_sets = [pick("test", set(cs)) for cs in self.task_classes]

    def _transform(self, x: torch.Tensor, t: int) -> torch.Tensor:
        hp = self.hparams
        if t == 0:
            return x
        if hp.scenario == "permuted":
            flat = x.reshape(x.shape[0], -1)
            perm = torch.randperm(
                flat.shape[1], generator=torch.Generator().manual_seed(derive_seed("data.permutation") + t)
            )
            return flat[:, perm].reshape(x.shape)
        if hp.benchmark == "digits":
            return rotate_images(x, t * hp.rotation_step)
        flat = x.reshape(x.shape[0], -1)
        return torch.roll(flat, shifts=t * hp.shift_step, dims=1).reshape(x.shape)

    @property
    def cumulative(self) -> bool:
        """Task t trains on the union of tasks 0..t (joint training, the upper bound)."""
        return bool(self.hparams.cumulative)

    @property
    def scenario_kind(self) -> Literal["class", "domain"]:
        return "class" if self.hparams.scenario == "split" else "domain"

    # ---- which task is on ------------------------------------------------------------------------
    def task_of_epoch(self, epoch: int) -> int:
        return min(epoch // self.epochs_per_task, self.num_tasks - 1)

    @property
    def current_task(self) -> int:
        return self.task_of_epoch(self.trainer.current_epoch) if self.trainer is not None else 0

    def train_classes(self, t: int) -> list[int]:
        """Classes whose logits the training loss sees at task t (all seen ones when cumulative)."""
        if self.hparams.cumulative:
            return sorted({c for s in range(t + 1) for c in self.task_classes[s]})
        return list(self.task_classes[t])

    def _dataset(self, sets: list, t: int) -> Dataset:
        return sets[t] if isinstance(sets[t], Dataset) else TensorDataset(*sets[t])

    def _task_train(self, t: int) -> Dataset:
        tasks = range(t + 1) if self.hparams.cumulative else [t]
        return ConcatDataset([self._dataset(self.train_sets, s) for s in tasks])

    # ---- loaders ---------------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        if (
            trainer is not None
            and not trainer.fast_dev_run
            and trainer.reload_dataloaders_every_n_epochs != 1
        ):
            raise ValueError(
                "ContinualDataModule serves one task per block of epochs: set "
                "trainer.reload_dataloaders_every_n_epochs: 1 (got "
                f"{trainer.reload_dataloaders_every_n_epochs})"
            )
        t = self.current_task
        # the shuffle depends on (run seed, epoch) only: a run resumed from a checkpoint sees the same batches
        epoch = trainer.current_epoch if trainer else 0
        gen = torch.Generator().manual_seed(derive_seed("data.order") + 1000 * epoch)
        data = self._task_train(t)
        order = torch.randperm(len(data), generator=gen).tolist()  # fixed at creation: the same however often
        return DataLoader(
            data,
            batch_size=self.hparams.batch_size,
            sampler=order,  # Lightning iterates it
            num_workers=self.hparams.num_workers,
            drop_last=False,
        )

    def task_train_loader(self, t: int, batch_size: int = 256) -> DataLoader:
        """Task t's training data in order (no shuffle): statistics passes, prototypes."""
        return DataLoader(
            self._dataset(self.train_sets, t), batch_size=batch_size, num_workers=self.hparams.num_workers
        )

    def task_test_loader(self, t: int, batch_size: int = 512) -> DataLoader:
        return DataLoader(
            self._dataset(self.test_sets, t), batch_size=batch_size, num_workers=self.hparams.num_workers
        )

    def test_dataloader(self) -> list[DataLoader]:
        """``litlab test``: every task's test set, one loader per task (Lightning's ``dataloader_idx`` is the
        task)."""
        return [self.task_test_loader(t) for t in range(self.num_tasks)]


# ---- full scale: user-provided image folders --------------------------------------------------------------
def _check_folder(benchmark: str, data_root: str | None) -> None:
    for split in ("train", "test"):
        if data_root is None or not (Path(data_root) / split).is_dir():
            raise DatasetUnavailableError(
                f"benchmark {benchmark!r} needs data.init_args.data_root pointing at a folder with train/<class>/ "
                f"and test/<class>/ image folders (got data_root={data_root!r}); no package ships it and nothing "
                f"is downloaded at run time. Get it: {FOLDER_BENCHMARKS[benchmark]}"
            )


def _folder_classes(data_root: str) -> list[str]:
    return sorted(p.name for p in (Path(data_root) / "train").iterdir() if p.is_dir())


class _ImageFiles(Dataset):
    """(path, label) pairs read lazily with PIL, resized to a square, scaled to [-1, 1] (ViT in21k's mean/std
    0.5)."""

    def __init__(self, items: list[tuple[str, int]], size: int):
        self.items, self.size = items, size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        path, label = self.items[i]
        img = Image.open(path).convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        x = torch.tensor(np.asarray(img), dtype=torch.float32).permute(2, 0, 1) / 127.5 - 1.0
        return x, label
