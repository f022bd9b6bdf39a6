"""Stand-ins of the continual cards' full configs (``litlab fit --config configs/<slug>/full.yaml --stand-in``):
the config's Hugging Face ``ViTModel`` built from a ``ViTConfig`` with tiny sizes, and a few JPEGs in ImageNet-R's
folder layout as InfLoRA splits it (``<root>/train/<wnid>/*.jpg``, ``<root>/test/<wnid>/*.jpg``), so the full
loop (HF ViT backbone, image-folder DataModule, the method's task boundaries) runs on the CPU in seconds.

Sizes only: 4 classes in 2 tasks of 1 epoch (the config's 200 classes in 10 or 20 tasks need the real folder),
32-pixel images, batch 4, no loader workers, the LoRA rank where the tiny width cannot hold the config's."""

from __future__ import annotations

from pathlib import Path

import torch

from litlab.lit_modules.core.standin_files import write_images, write_model_folder

# four ImageNet-R classes (WordNet ids, the folder names ImageNet-R ships) and its file naming (<rendition>_<i>.jpg)
CLASSES = ("n01443537", "n01484850", "n01494475", "n01498041")
RENDITIONS = ("art", "cartoon", "sketch", "toy", "painting", "origami")
PER_CLASS = {"train": 4, "test": 2}
IMAGE_SIZE, PATCH, WIDTH = 32, 8, 32
TASKS = 2


def write_tiny_vit(folder: Path) -> Path:
    """``transformers.ViTModel`` (the class ``HFViTFeatures`` loads) from a ViTConfig of width 32, 2 blocks of 4
    heads, 32-pixel input in 8-pixel patches; random weights from a seeded generator."""
    import transformers

    def save(tmp: Path) -> None:
        config = transformers.ViTConfig(
            image_size=IMAGE_SIZE,
            patch_size=PATCH,
            hidden_size=WIDTH,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=2 * WIDTH,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(tmp)

    return write_model_folder(folder, save)


def write_imagenet_r(root: Path) -> Path:
    """``PER_CLASS`` JPEGs per split and class of ``CLASSES`` in InfLoRA's ImageNet-R split layout."""
    gen = torch.Generator().manual_seed(0)
    for split, n in PER_CLASS.items():
        for label, wnid in enumerate(CLASSES):
            paths = [root / split / wnid / f"{RENDITIONS[i % len(RENDITIONS)]}_{i}.jpg" for i in range(n)]
            write_images(paths, [label] * n, IMAGE_SIZE, gen)
    return root


def _stand_in(workdir: Path, rank: int | None) -> list[str]:
    vit = write_tiny_vit(workdir / "vit-tiny")
    data = write_imagenet_r(workdir / "imagenet-r")
    return [
        "--trainer.accelerator=cpu",
        f"--trainer.max_epochs={TASKS}",  # the harness checks num_tasks × epochs_per_task
        f"--model.init_args.backbone.name={vit}",
        f"--model.init_args.backbone.width={WIDTH}",
        *([f"--model.init_args.rank={rank}"] if rank is not None else []),
        f"--data.init_args.data_root={data}",
        f"--data.init_args.num_tasks={TASKS}",
        "--data.init_args.epochs_per_task=1",
        "--data.init_args.batch_size=4",
        "--data.init_args.num_workers=0",
        f"--data.init_args.image_size={IMAGE_SIZE}",
    ]


def stand_in_janus_lora(workdir: Path) -> list[str]:
    """Janus-LoRA's full config (ViT-B/16 in21k, ImageNet-R) on a tiny ViTModel; its rank 10 fits width 32."""
    return _stand_in(workdir, rank=None)


def stand_in_loda(workdir: Path) -> list[str]:
    """LoDA's full config (ViT-B/16 in21k, ImageNet-R) on a tiny ViTModel: rank 64 -> 8, so the general and the
    isolated branch (each of that rank) fit in the width of 32."""
    return _stand_in(workdir, rank=8)
