"""Paired video super-resolution from a local REDS-style folder (full scale of LiteVSR, arXiv 2606.09250).

Layout: ``<root>/<clip>/<frame:08d>.png`` (REDS ``train_sharp`` / ``val_sharp``: clips ``000`` … ``269`` of 100
frames, 720×1280). Nothing is downloaded: a missing or empty folder stops the run at once
(``DatasetUnavailableError`` naming the folder and the layout). Each training sample is a random clip (every
clip not in ``exclude_clips``; REDS4 = 000, 011, 015, 020 is the usual test set), a random run of ``frames``
consecutive frames and a random ``crop``; the LQ copy is made on the fly by ``synthetic_vsr.degrade`` (blur,
area down ×``scale``, noise, 8-bit; the quick scale's degradation, seeded per sample). Validation reads
``val_root`` (default: the excluded clips of ``root``; the first ``val_max_clips`` of them when set), the first
``frames`` frames, centre-cropped, each clip's degradation seeded per clip. Both draw from the run's "data" stream
(``core.seeding.derive_seed``), the training samples and the validation clips from disjoint generators.

Contract (``lit_modules/diffusion/contract.VideoSRData``, as ``synthetic_vsr``; ``frame_size`` is ``crop``): batches ``(HQ, LQ)``, HQ
``(B, 3, frames, crop_h, crop_w)`` and LQ ``(B, 3, frames, crop_h/scale, crop_w/scale)``, both in [-1, 1] (the loop
maps frames to [0, 1] for its metrics). Frames are cropped as they are read. A clip with fewer than ``frames``
frames is skipped; a clip whose frames are smaller than ``crop`` stops the run at once, naming it.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from litlab.datamodules.synthetic_vsr import degrade
from litlab.lit_modules.core.errors import ConfigError, DatasetUnavailableError
from litlab.lit_modules.core.seeding import derive_seed

REDS_LAYOUT = (
    "<root>/<clip>/<frame:08d>.png, one folder of consecutive frames per clip (REDS train_sharp / val_sharp: "
    "unpack train_sharp.zip from the REDS page, seungjunnah.github.io/Datasets/reds, on a machine with internet "
    "and copy it here)"
)


def list_clips(
    root: str | Path, exclude: list[str] | None = None, only: list[str] | None = None
) -> dict[str, list[Path]]:
    """``{clip: sorted frame paths}``; ``DatasetUnavailableError`` when the folder is missing or holds no clip."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DatasetUnavailableError(f"video folder {root} does not exist; expected {REDS_LAYOUT}")
    clips = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if (exclude and d.name in exclude) or (only is not None and d.name not in only):
            continue
        frames = sorted(d.glob("*.png"))
        if frames:
            clips[d.name] = frames
    if not clips:
        raise DatasetUnavailableError(
            f"video folder {root} holds no clip of PNG frames; expected {REDS_LAYOUT}"
        )
    return clips


def read_frames(paths: list[Path], box: tuple[int, int, int, int] | None = None) -> Tensor:
    """(3, F, H, W) in [-1, 1]; ``box`` = (left, top, right, bottom) crops each frame as it is read."""
    import numpy as np
    from PIL import Image

    def load(p: Path):
        with Image.open(p) as img:
            img = img.convert("RGB")
            return np.asarray(img if box is None else img.crop(box))

    arr = np.stack([load(p) for p in paths])  # (F, H, W, 3)
    return torch.from_numpy(arr).permute(3, 0, 1, 2).float() / 127.5 - 1


def frame_size(path: Path) -> tuple[int, int]:
    """(H, W) of a frame, from its header."""
    from PIL import Image

    with Image.open(path) as img:
        return img.height, img.width


def check_crop(clips: dict[str, list[Path]], crop: tuple[int, int], frames: int) -> None:
    """Every clip long enough to be served must hold the crop (its first frame's size is checked)."""
    ch, cw = crop
    for name, paths in clips.items():
        if len(paths) < frames:
            continue
        h, w = frame_size(paths[0])
        if h < ch or w < cw:
            raise ValueError(f"clip {name} ({paths[0].parent}) is {h}x{w}, smaller than crop {ch}x{cw}")


class _Clips(Dataset):
    def __init__(
        self,
        clips: dict[str, list[Path]],
        frames: int,
        crop: tuple[int, int],
        scale: int,
        length: int,
        train: bool,
        seed: int,
        blur_sigma,
        noise_std,
    ):
        self.items = [(k, v) for k, v in clips.items() if len(v) >= frames]
        if not self.items:
            raise DatasetUnavailableError(f"no clip has {frames} frames; expected {REDS_LAYOUT}")
        self.frames, self.crop, self.scale, self.length, self.train = frames, crop, scale, length, train
        self.seed, self.blur_sigma, self.noise_std = seed, blur_sigma, noise_std

    def __len__(self) -> int:
        return self.length if self.train else len(self.items)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        name, paths = (
            self.items[int(torch.randint(len(self.items), (1,), generator=gen))]
            if self.train
            else self.items[i]
        )
        start = int(torch.randint(len(paths) - self.frames + 1, (1,), generator=gen)) if self.train else 0
        ch, cw = self.crop
        h, w = frame_size(paths[start])
        if h < ch or w < cw:
            raise ValueError(f"clip {name} is {h}x{w}, smaller than crop {ch}x{cw}")
        if self.train:
            top = int(torch.randint(h - ch + 1, (1,), generator=gen))
            left = int(torch.randint(w - cw + 1, (1,), generator=gen))
        else:
            top, left = (h - ch) // 2, (w - cw) // 2
        hq = read_frames(paths[start : start + self.frames], (left, top, left + cw, top + ch))
        lq = degrade(hq[None], self.scale, gen, self.blur_sigma, self.noise_std)[0]
        return hq, lq


class PairedVideoSRDataModule(L.LightningDataModule):
    """REDS-style folder -> (HQ, LQ) clip pairs (see the module docstring)."""

    def __init__(
        self,
        root: str | None = None,
        val_root: str | None = None,
        frames: int = 33,
        crop: tuple[int, int] = (480, 832),
        scale: int = 4,
        batch_size: int = 1,
        steps: int = 6000,
        exclude_clips: list[str] = ["000", "011", "015", "020"],  # noqa: B006
        blur_sigma: tuple[float, float] = (0.8, 1.6),
        noise_std: float = 0.02,
        num_workers: int = 4,
        val_max_clips: int | None = None,
    ):
        super().__init__()
        if root is None:
            raise DatasetUnavailableError(f"data.init_args.root is not set; expected {REDS_LAYOUT}")
        if crop[0] % scale or crop[1] % scale:
            raise ValueError(f"crop {tuple(crop)} must be a multiple of scale={scale}")
        if frames < 2:
            raise ValueError(f"frames must be >= 2 (the temporal metrics compare neighbours), got {frames}")
        if val_max_clips is not None and val_max_clips < 1:
            raise ValueError(f"val_max_clips must be >= 1 or null, got {val_max_clips}")
        self.train_clips = list_clips(root, exclude=list(exclude_clips))
        self.val_clips = list_clips(val_root) if val_root else list_clips(root, only=list(exclude_clips))
        if val_max_clips is not None:
            self.val_clips = dict(list(self.val_clips.items())[:val_max_clips])
        check_crop(self.train_clips, tuple(crop), frames)
        check_crop(self.val_clips, tuple(crop), frames)
        self.frames, self.crop, self.scale = frames, tuple(crop), scale
        self.frame_size = self.crop
        self.batch_size, self.steps, self.num_workers = batch_size, steps, num_workers
        self.blur_sigma, self.noise_std = tuple(blur_sigma), noise_std

    def data_key(self) -> dict:
        return {"world": "reds-folder", "clips": sorted(self.train_clips), "frames": self.frames}

    def pretrain_batch(self, batch_size: int, gen: torch.Generator) -> Tensor:
        raise ConfigError(
            "the full scale uses a pre-trained backbone (model.init_args.pretrained_path: a Wan2.1 folder or Hub id); "
            "nothing is pre-trained on REDS"
        )

    def train_dataloader(self) -> DataLoader:
        seed = 2 * derive_seed("data")  # even: training samples; odd (val_dataloader): validation clips
        ds = _Clips(
            self.train_clips,
            self.frames,
            self.crop,
            self.scale,
            self.steps * self.batch_size,
            True,
            seed,
            self.blur_sigma,
            self.noise_std,
        )
        return DataLoader(ds, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        ds = _Clips(
            self.val_clips,
            self.frames,
            self.crop,
            self.scale,
            0,
            False,
            2 * derive_seed("data") + 1,
            self.blur_sigma,
            self.noise_std,
        )
        return DataLoader(ds, batch_size=1, shuffle=False, num_workers=self.num_workers)
