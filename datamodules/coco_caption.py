"""COCO captioning on the Karpathy split, read from the user's disk (full scale of Gap-Init, arXiv 2602.01522).

Layout (nothing is downloaded; a missing folder or file stops the run at once, ``DatasetUnavailableError`` naming
it and this layout)::

    <data_root>/dataset_coco.json          the Karpathy split (Karpathy & Fei-Fei, "Deep Visual-Semantic
                                           Alignments for Generating Image Descriptions", arXiv 1412.2306):
                                           {"images": [{"filepath", "filename", "split", "cocoid",
                                                        "sentences": [{"raw": ...}, ...]}, ...]}
    <data_root>/train2014/COCO_train2014_<id:012d>.jpg   (each image at <data_root>/<filepath>/<filename>)
    <data_root>/val2014/COCO_val2014_<id:012d>.jpg

Splits as the json names them: "train" (82,783 images), "restval" (30,504), "val" (5,000), "test" (5,000).
Training reads one record per (image, caption) pair of ``train_splits`` (default train + restval, the 113K
training images of BLIP / BLIP-2); validation and test one record per image of ``val_split`` / ``test_split``,
with every reference caption (the first one is the teacher-forced target, all of them are the references of the
caption metric). ``calibration_dataloader`` gives ``calib_size`` training pairs (Gap-Init's calibration set).

What the batches hold is the model's business: the method hands over its encoder with ``use_encoder`` (a
picklable callable ``(images: list[PIL.Image], captions: list[str]) -> dict of tensors``; the tokenizer, image
processor, prompt and the image-token layout are the backbone's), and every loader's collate calls it, in the
loader's workers. Evaluation batches also carry ``references`` (a list of lists of strings).

Randomness comes from the run seed by name (``core.seeding.derive_seed``): the calibration pairs from
"calibration", the training order from "batches" (a fresh permutation per epoch, reproducible on resume).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from litlab.datamodules.digits_pairs import EpochPermutation
from litlab.lit_modules.core.errors import DatasetUnavailableError
from litlab.lit_modules.core.seeding import derive_seed

KARPATHY_FILE = "dataset_coco.json"
COCO_KARPATHY_LAYOUT = (
    f"<data_root>/{KARPATHY_FILE} (the Karpathy split: caption_datasets.zip from "
    "cs.stanford.edu/people/karpathy/deepimagesent) and the COCO 2014 images it names, "
    "<data_root>/train2014/*.jpg and <data_root>/val2014/*.jpg (train2014.zip and val2014.zip from "
    "images.cocodataset.org/zips); download them on a machine with internet and copy the folder here"
)
SPLITS = ("train", "restval", "val", "test")

Encode = Callable[[list[Any], list[str]], dict[str, torch.Tensor]]


def read_karpathy_split(data_root: str | Path, annotations: str | Path | None = None) -> list[dict]:
    """The ``images`` records of the Karpathy json; ``DatasetUnavailableError`` naming what is missing."""
    root = Path(data_root).expanduser()
    if not root.is_dir():
        raise DatasetUnavailableError(f"COCO folder {root} does not exist; expected {COCO_KARPATHY_LAYOUT}")
    path = Path(annotations).expanduser() if annotations else root / KARPATHY_FILE
    if not path.is_file():
        raise DatasetUnavailableError(
            f"Karpathy split file {path} does not exist; expected {COCO_KARPATHY_LAYOUT}"
        )
    try:
        images = json.loads(path.read_text())["images"]
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise DatasetUnavailableError(
            f"{path} is not a Karpathy split file (a json with an 'images' list): {err}"
        ) from err
    return images


def load_image(path: Path):
    """The RGB image at ``path``; a missing file names itself and the layout."""
    from PIL import Image

    if not path.is_file():
        raise DatasetUnavailableError(f"COCO image {path} does not exist; expected {COCO_KARPATHY_LAYOUT}")
    with Image.open(path) as img:
        return img.convert("RGB")


class _Records(Dataset):
    """``(image path, target caption, references)`` records; items are ``(PIL image, caption, references)``."""

    def __init__(self, records: list[tuple[Path, str, list[str]]]):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        path, caption, refs = self.records[i]
        return load_image(path), caption, refs


class _Collate:
    """The model's encoder over a batch of records; evaluation batches keep the references."""

    def __init__(self, encode: Encode, with_references: bool):
        self.encode, self.with_references = encode, with_references

    def __call__(self, items: list[tuple[Any, str, list[str]]]) -> dict[str, Any]:
        images, captions, refs = zip(*items)
        batch: dict[str, Any] = dict(self.encode(list(images), list(captions)))
        if self.with_references:
            batch["references"] = [list(r) for r in refs]
        return batch


class CocoKarpathyCaptionDataModule(L.LightningDataModule):
    """COCO Karpathy captioning from ``data_root`` (layout in the module docstring)."""

    def __init__(
        self,
        data_root: str,
        annotations: str | None = None,
        train_splits: list[str] | None = None,
        val_split: str = "val",
        test_split: str = "test",
        batch_size: int = 16,
        eval_batch_size: int = 16,
        calib_size: int = 256,
        num_workers: int = 4,
    ):
        super().__init__()
        train_splits = ["train", "restval"] if train_splits is None else list(train_splits)
        for s in [*train_splits, val_split, test_split]:
            if s not in SPLITS:
                raise ValueError(f"split {s!r} is not a Karpathy split; expected one of {SPLITS}")
        if min(batch_size, eval_batch_size, calib_size) < 1 or num_workers < 0:
            raise ValueError(
                f"batch_size, eval_batch_size, calib_size must be >= 1 and num_workers >= 0, got {batch_size}, "
                f"{eval_batch_size}, {calib_size}, {num_workers}"
            )
        self.save_hyperparameters()
        self.root = Path(data_root).expanduser()
        self.train_splits = train_splits
        self._images = read_karpathy_split(data_root, annotations)  # at once: a missing folder stops here
        self._encode: Encode | None = None

    # ---- what the method hands over -----------------------------------------------------------------
    def use_encoder(self, encode: Encode) -> None:
        """The backbone's batch encoder (images and captions to tensors), applied in every loader's collate."""
        self._encode = encode

    # ---- records ---------------------------------------------------------------------------------------
    def _split(self, names: list[str]) -> list[dict]:
        return [im for im in self._images if im.get("split") in names]

    def _path(self, image: dict) -> Path:
        return self.root / image.get("filepath", "") / image["filename"]

    def pairs(self) -> list[tuple[Path, str, list[str]]]:
        """One record per (image, caption) pair of the training splits, in file order."""
        out = []
        for im in self._split(self.train_splits):
            refs = [s["raw"] for s in im["sentences"]]
            out += [(self._path(im), r, refs) for r in refs]
        if not out:
            raise DatasetUnavailableError(
                f"the Karpathy split file in {self.root} has no caption in splits {self.train_splits}"
            )
        return out

    def images(self, split: str) -> list[tuple[Path, str, list[str]]]:
        """One record per image of ``split``: its first caption as the target, all of them as references."""
        out = []
        for im in self._split([split]):
            refs = [s["raw"] for s in im["sentences"]]
            if refs:
                out.append((self._path(im), refs[0], refs))
        if not out:
            raise DatasetUnavailableError(
                f"the Karpathy split file in {self.root} has no captioned image in split {split!r}"
            )
        return out

    # ---- loaders -----------------------------------------------------------------------------------------
    def _loader(
        self, records, batch_size: int, evaluation: bool, sampler=None, persistent=False
    ) -> DataLoader:
        if self._encode is None:
            raise RuntimeError(
                f"{type(self).__name__}: no batch encoder; the method hands its backbone's over with "
                "use_encoder() in its setup"
            )
        workers = self.hparams.num_workers
        return DataLoader(
            _Records(records),
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=_Collate(self._encode, with_references=evaluation),
            num_workers=workers,
            persistent_workers=persistent and workers > 0,  # the training loader's, every epoch
        )

    def calibration_dataloader(self) -> DataLoader:
        """``calib_size`` training pairs (the run's "calibration" draw): Gap-Init's calibration set D_cal."""
        pairs = self.pairs()
        if self.hparams.calib_size > len(pairs):
            raise ValueError(f"calib_size={self.hparams.calib_size} exceeds the {len(pairs)} training pairs")
        g = torch.Generator().manual_seed(derive_seed("calibration"))
        idx = torch.randperm(len(pairs), generator=g)[: self.hparams.calib_size].tolist()
        return self._loader([pairs[i] for i in idx], self.hparams.eval_batch_size, evaluation=False)

    def train_dataloader(self) -> DataLoader:
        pairs = self.pairs()
        sampler = EpochPermutation(len(pairs), derive_seed("batches"))
        return self._loader(
            pairs, self.hparams.batch_size, evaluation=False, sampler=sampler, persistent=True
        )

    def val_dataloader(self) -> DataLoader:
        return self._loader(
            self.images(self.hparams.val_split), self.hparams.eval_batch_size, evaluation=True
        )

    def test_dataloader(self) -> DataLoader:
        return self._loader(
            self.images(self.hparams.test_split), self.hparams.eval_batch_size, evaluation=True
        )
