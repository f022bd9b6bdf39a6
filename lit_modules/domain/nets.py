"""Feature extractors of the family: the quick scale's small conv nets, torchvision ResNets at full scale."""

from __future__ import annotations

from collections.abc import Sequence

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


class ResNetFeatures(nn.Module):
    """A torchvision ResNet without its fc (global-pool features); ImageNet weights by name, never downloaded
    here: ``weights`` must be a local file (a state dict) or the torch hub cache must already hold it."""

    def __init__(self, arch: str = "resnet50", weights: str | None = "IMAGENET1K_V1", feat_dim: int = 256):
        super().__init__()
        try:
            import torchvision
        except ImportError as err:
            raise ModelUnavailableError(
                f"the full-scale backbone {arch} needs torchvision (pip install torchvision, the build that "
                f"matches your torch); it is not installed here"
            ) from err

        net = getattr(torchvision.models, arch)(weights=None)
        if weights:
            self._load(net, arch, weights)
        self.out_dim = net.fc.in_features
        net.fc = nn.Identity()
        self.net = net

    @staticmethod
    def _load(net: nn.Module, arch: str, weights: str) -> None:
        from pathlib import Path

        import torchvision

        if Path(weights).is_file():
            net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
            return
        enum = torchvision.models.get_model_weights(arch)[weights]
        cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(enum.url).name
        if not cached.is_file():
            raise ModelUnavailableError(
                f"{arch} weights {weights!r} are not on this machine (looked for {cached}); nothing is "
                f"downloaded at run time: fetch {enum.url} into that folder, or pass a local state-dict file "
                f"as model.init_args.backbone_weights"
            )
        net.load_state_dict(torch.load(cached, map_location="cpu", weights_only=True))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)
