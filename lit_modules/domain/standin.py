"""Stand-ins of the domain cards' full configs (``litlab fit --config configs/<slug>/full.yaml --stand-in``): a few
JPEGs in the layout of Office-31's archive (U³CF) and a few JPEGs with dSprites' image lists as RSD releases them (SFDA regression),
and the config's torchvision ResNet (resnet50, resnet18: the class the config names, at its own size) with random
weights instead of the ImageNet ones (``net.backbone_weights: null``, the config's own switch), so the full loop
(class folders or image lists, the ResNet backbone, the cached source stage, adaptation, evaluation) runs on the CPU
in seconds on 64-pixel images.

The files are written without torchvision; the fit needs it, as the full configs do: where it does not import, the
module stops at construction with the configs' message naming the install line (``nets.resnet_weights_file``)."""

from __future__ import annotations

from pathlib import Path

import torch

from litlab.lit_modules.core.standin_files import write_images

IMAGE_SIZE = 64  # a ResNet's last feature map is then 2 x 2: batch norm sees more than one value per channel
# three of Office-31's 31 classes, in each of the config's domains (amazon -> dslr, webcam), as frame_<i>.jpg
OFFICE31_DOMAINS = ("amazon", "dslr", "webcam")
OFFICE31_CLASSES = ("back_pack", "bike", "calculator")
OFFICE31_PER_CLASS = 3
# dSprites' three domains (the config's color -> noisy, and scream for the C -> S task) in RSD's release:
# <domain>/<i>.jpg and <domain>.txt, lines '<path> <scale> <orientation> <x> <y>', each factor scaled to [0, 1]
DSPRITES_DOMAINS = ("color", "noisy", "scream")
DSPRITES_PER_DOMAIN = 24  # a 70/30 target split of 16 / 8 images: more than the density's k = 10 neighbours


def write_office31(root: Path) -> Path:
    """``<root>/<domain>/images/<class>/frame_<i>.jpg``, the layout of Office-31's archive."""
    gen = torch.Generator().manual_seed(0)
    for domain in OFFICE31_DOMAINS:
        for label, name in enumerate(OFFICE31_CLASSES):
            paths = [
                root / domain / "images" / name / f"frame_{i + 1:04d}.jpg" for i in range(OFFICE31_PER_CLASS)
            ]
            write_images(paths, [label] * len(paths), IMAGE_SIZE, gen)
    return root


def write_dsprites_lists(root: Path) -> Path:
    """``<root>/<domain>/<i>.jpg`` and ``<root>/<domain>.txt`` as RSD releases dSprites: one line per image, its
    path relative to ``root`` and four factor values in [0, 1] (scale, orientation, x, y; the DataModule keeps
    scale, x and y)."""
    from litlab.lit_modules.core.io import atomic_write_text

    gen = torch.Generator().manual_seed(0)
    for domain in DSPRITES_DOMAINS:
        factors = torch.rand(DSPRITES_PER_DOMAIN, 4, generator=gen)
        names = [f"{domain}/{i}.jpg" for i in range(DSPRITES_PER_DOMAIN)]
        write_images([root / n for n in names], list(range(DSPRITES_PER_DOMAIN)), IMAGE_SIZE, gen)
        lines = [f"{n} {' '.join(f'{v:.6f}' for v in row.tolist())}" for n, row in zip(names, factors)]
        atomic_write_text(root / f"{domain}.txt", "\n".join(lines) + "\n")
    return root


def stand_in_u3cf(workdir: Path) -> list[str]:
    """U³CF's full config (Office-31 amazon -> dslr, webcam; ResNet-50): 2 source iterations, 2 curriculum
    iterations per target, 2 causal iterations, batches of 4, a 16-wide bottleneck and latent."""
    data = write_office31(workdir / "office31")
    return [
        "--trainer.accelerator=cpu",
        "--trainer.log_every_n_steps=1",
        # one mapping, merged into the config's net
        "--model.init_args.net={backbone_weights: null, feat_dim: 16, latent: 16}",
        "--model.init_args.source_stage.iters=2",
        "--model.init_args.source_stage.batch_size=4",
        "--model.init_args.curriculum.iters_per_target=2",
        "--model.init_args.curriculum.batch_source=4",
        "--model.init_args.curriculum.batch_target=4",
        "--model.init_args.causal.iters=2",
        "--model.init_args.causal.batch_size=4",
        "--model.init_args.causal.kl_anneal_steps=2",
        f"--data.init_args.data_root={data}",
        f"--data.init_args.image_size={IMAGE_SIZE}",
    ]


def stand_in_sfda_regression(workdir: Path) -> list[str]:
    """SFDA regression's full config (dSprites color -> noisy; ResNet-18): 1 source epoch, 2 adaptation epochs,
    batches of 4, a 16-wide feature layer."""
    data = write_dsprites_lists(workdir / "dsprites")
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_epochs=2",
        "--trainer.log_every_n_steps=1",
        "--model.init_args.net={backbone_weights: null, feat_dim: 16}",
        "--model.init_args.source_stage.epochs=1",
        "--model.init_args.source_stage.batch_size=4",
        f"--data.init_args.data_root={data}",
        f"--data.init_args.size={IMAGE_SIZE}",
        "--data.init_args.batch_size=4",
        "--data.init_args.num_workers=0",
    ]
