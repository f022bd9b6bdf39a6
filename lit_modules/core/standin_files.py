"""Files the stand-ins of the full configs write (``litlab fit --config configs/<slug>/full.yaml --stand-in``):
a few images in a data set's own on-disk layout, and a tiny model folder, each written atomically and drawn from
a generator the caller seeds, so a relaunch on the same work folder writes the same bytes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from litlab.lit_modules.core.io import atomic_path

# the format PIL writes, by the suffix a data set's files carry (atomic_path's temporary name has another suffix)
IMAGE_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG"}


def write_images(paths: Sequence[Path], labels: Sequence[int], size: int, gen: torch.Generator) -> None:
    """One ``size`` × ``size`` RGB image per path: a flat colour set by its label (so the classes differ) plus
    uniform noise from ``gen``, in the format its suffix names (``IMAGE_FORMATS``)."""
    from PIL import Image

    if len(paths) != len(labels):
        raise ValueError(f"{len(paths)} paths but {len(labels)} labels")
    for path, label in zip(paths, labels):
        fmt = IMAGE_FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise ValueError(f"{path}: suffix {path.suffix!r} is not one of {sorted(IMAGE_FORMATS)}")
        base = torch.tensor(
            [(37 * label) % 200, (71 * label) % 200, (113 * label) % 200], dtype=torch.float32
        )
        noise = torch.rand(size, size, 3, generator=gen) * 55
        pixels = (base + noise).clamp(0, 255).to(torch.uint8).numpy()
        with atomic_path(path) as tmp:
            Image.fromarray(np.ascontiguousarray(pixels)).save(tmp, format=fmt)


def write_model_folder(folder: Path, save: Callable[[Path], None]) -> Path:
    """``save(tmp)`` (a ``save_pretrained``, a ``torch.save``) into a temporary folder moved onto ``folder``; a
    folder already there is kept (a relaunch on the same work folder: the same seeded weights)."""
    if folder.is_dir():
        return folder
    with atomic_path(folder) as tmp:
        tmp.mkdir(parents=True)
        save(tmp)
    return folder
