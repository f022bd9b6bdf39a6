"""Typed groups of a method's arguments.

A method whose constructor would take a long flat list of arguments takes a few ``config_part`` objects instead
(``penalty: KruskalPenalty``, ``actor: ActorConfig``, ...). LightningCLI builds each from a YAML mapping and checks
its keys and types. ``save_hyperparameters()`` stores what the module received: the objects when the module is
built in Python, plain mappings when LightningCLI built it, so a module keeps its parts as attributes and never
reads them back through ``hparams``. ``config_part`` puts the class on torch's allow-list, so checkpoints holding
the objects still load with ``weights_only=True``.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

import torch

T = TypeVar("T")


def config_part(cls: type[T]) -> type[T]:
    """Make ``cls`` a frozen dataclass that may travel inside a ``weights_only`` checkpoint."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    torch.serialization.add_safe_globals([cls])
    return cls
