"""Feature extractors of the family: the quick scale's small conv nets, torchvision ResNets at full scale."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from litlab.lit_modules.core.errors import ModelUnavailableError


class ConvFeatures(nn.Module):
    """Conv blocks (3×3, BN, ReLU) with the given channels and strides, then either a flatten + Linear + BN + ReLU
    to ``feat_dim`` (``pool=0``) or an adaptive average pool to ``pool``×``pool`` and a flatten."""

    def __init__(
        self,
        in_channels: int = 3,
        channels: Sequence[int] = (16, 32, 32),
        strides: Sequence[int] = (2, 2, 2),
        input_size: int = 32,
        feat_dim: int = 128,
        pool: int = 0,
    ):
        super().__init__()
        layers, c, s = [], in_channels, input_size
        for ch, st in zip(channels, strides):
            layers += [nn.Conv2d(c, ch, 3, st, 1, bias=False), nn.BatchNorm2d(ch), nn.ReLU(inplace=True)]
            c, s = ch, (s + 2 - 3) // st + 1
        self.convs = nn.Sequential(*layers)
        if pool:
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(pool), nn.Flatten())
            self.out_dim = c * pool * pool
        else:
            self.head = nn.Sequential(
                nn.Flatten(), nn.Linear(c * s * s, feat_dim), nn.BatchNorm1d(feat_dim), nn.ReLU(inplace=True)
            )
            self.out_dim = feat_dim

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.convs(x))


# ImageNet statistics: a pretrained ResNet expects its [0, 1] input normalised with them
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def resnet_weights_file(arch: str, weights: str | None) -> Path | None:
    """The local file ``ResNetFeatures(arch, weights)`` will load, checked without building the net; raises
    ``ModelUnavailableError`` at once when torchvision or the weights are not on this machine (nothing is
    downloaded). ``weights``: a torchvision weights name of ``arch`` (``IMAGENET1K_V1``: looked for in the torch
    hub cache, ``<torch hub dir>/checkpoints/<file name of its URL>``), a local state-dict file, or ``None``
    (untrained, random init)."""
    try:
        import torchvision
    except (ImportError, RuntimeError) as err:  # RuntimeError: a wheel built for another torch
        raise ModelUnavailableError(
            f"the backbone {arch} needs torchvision, which does not import here ({type(err).__name__}: {err}); "
            f"install the torchvision build that matches your torch ({torch.__version__}), e.g. "
            f"pip install torchvision --index-url https://download.pytorch.org/whl/cpu for a CPU torch"
        ) from err
    if arch not in torchvision.models.list_models(module=torchvision.models):
        raise ValueError(f"unknown torchvision model {arch!r}; e.g. resnet18, resnet50, resnet101")
    if weights is None:
        return None
    if Path(weights).suffix in (".pth", ".pt", ".safetensors", ".bin") or "/" in weights:
        if not Path(weights).is_file():
            raise ModelUnavailableError(
                f"{arch} weights file {weights} does not exist; pass an existing state-dict file or a torchvision "
                f"weights name such as IMAGENET1K_V1"
            )
        return Path(weights)
    names = torchvision.models.get_model_weights(arch)
    if weights not in names.__members__:
        raise ValueError(
            f"{arch} has no torchvision weights {weights!r}; names: {', '.join(names.__members__)}"
        )
    url = names[weights].url
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name
    if not cached.is_file():
        raise ModelUnavailableError(
            f"{arch} weights {weights!r} are not on this machine: looked for {cached}; nothing is downloaded at "
            f"run time. Fetch them on a machine with internet access (wget {url}, or python -c "
            f"\"import torchvision; torchvision.models.{arch}(weights='{weights}')\" which fills the torch hub "
            f"cache) and copy the file to {cached}, or pass a local state-dict file as the weights"
        )
    return cached


class ResNetFeatures(nn.Module):
    """A torchvision ResNet without its fc (global-pool features) on [0, 1] images, normalised inside with the
    ImageNet statistics. Weights as ``resnet_weights_file`` finds them, never downloaded."""

    def __init__(self, arch: str = "resnet50", weights: str | None = "IMAGENET1K_V1", feat_dim: int = 256):
        super().__init__()
        path = resnet_weights_file(arch, weights)
        import torchvision

        net = getattr(torchvision.models, arch)(weights=None)
        if path is not None:
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                state = load_file(str(path))
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
            net.load_state_dict(state)
        self.out_dim = net.fc.in_features
        net.fc = nn.Identity()
        self.net = net
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.net((x - self.mean) / self.std)
