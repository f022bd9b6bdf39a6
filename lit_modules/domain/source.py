"""The source stage, trained once per (recipe, data, net, seed) and cached: every adaptation method of a card
seed starts from the same source checkpoint (source once, adapt many, as Transfer-Learning-Library users
expect).

``cached_source(name, key, seed, build, loss, dm, recipe)`` builds the net with ``build()`` under
``torch.manual_seed(seed)``, trains it on ``dm.source_train_loader`` with ``loss(net, x, y)`` (one torch thread:
the cached weights are then the same in every process), and stores it as ``<cache>/<name>-<hash>.safetensors``
through ``litlab.lit_modules.core.pretrain.train_and_cache``; the hash covers ``key`` (the net's arguments),
the recipe, the DataModule's ``data_key()`` and the seed. A second call in any process loads the file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.core.pretrain import train_and_cache


@config_part
class SourceRecipe:
    """Source training: optimiser (``adam`` or ``sgd`` with momentum 0.9, nesterov), learning rate, weight
    decay, epochs or iterations (``iters`` > 0 wins), batch size."""

    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: int = 8
    iters: int = 0
    batch_size: int = 64


def cached_source(
    name: str,
    key: dict,
    seed: int,
    build: Callable[[], nn.Module],
    loss: Callable[[nn.Module, Tensor, Tensor], Tensor],
    dm,
    recipe: SourceRecipe,
) -> nn.Module:
    args = {"net": key, "recipe": dataclasses.asdict(recipe), "data": dm.data_key(), "seed": seed}

    def train(net: nn.Module) -> None:
        params = [p for p in net.parameters() if p.requires_grad]
        if recipe.optimizer == "adam":
            opt = torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
        else:
            opt = torch.optim.SGD(
                params, lr=recipe.lr, momentum=0.9, nesterov=True, weight_decay=recipe.weight_decay
            )
        net.train()
        step, epoch = 0, 0
        while True:
            for x, y in dm.source_train_loader(recipe.batch_size, shuffle=True, seed=seed * 1000 + epoch):
                opt.zero_grad(set_to_none=True)
                loss(net, x, y).backward()
                opt.step()
                step += 1
                if recipe.iters and step >= recipe.iters:
                    return
            epoch += 1
            if not recipe.iters and epoch >= recipe.epochs:
                return

    return train_and_cache(name, args, seed, build, train, threads=1)
