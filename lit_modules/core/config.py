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
import sys
from typing import TypeVar

import torch

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:
    from typing_extensions import dataclass_transform

T = TypeVar("T")
# a field's annotation ``str | None``: as written under ``from __future__ import annotations``, or evaluated
OPTIONAL_STR = ("str | None", "None | str", "Optional[str]", str | None)


@dataclass_transform(frozen_default=True)  # type checkers see the fields as constructor arguments
def config_part(cls: type[T]) -> type[T]:
    """Make ``cls`` a frozen dataclass that may travel inside a ``weights_only`` checkpoint."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    torch.serialization.add_safe_globals([cls])
    return cls


def as_config(cls: type[T], value: T | dict | None, where: str = "") -> T:
    """``value`` as a ``cls`` object: a mapping (what LightningCLI or ``hparams`` hold) is built into one, an
    object is returned as is, ``None`` gives the defaults. The one place a module turns its config parts into
    dataclasses (a bad key names the class and the key, not a TypeError from ``__init__``)."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return _nulls_restored(cls, value)
    if isinstance(value, dict):
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(value) - names)
        if unknown:
            raise ValueError(
                f"{where or cls.__name__}: unknown keys {unknown}; {cls.__name__} has {sorted(names)}"
            )
        return _nulls_restored(cls, cls(**value))
    raise TypeError(
        f"{where or cls.__name__}: expected a {cls.__name__} or a mapping, got {type(value).__name__}"
    )


def _nulls_restored(cls: type[T], part: T) -> T:
    """jsonargparse (4.53) hands a dotted override ``--model.init_args.<part>.<field>=null`` of a ``str | None``
    field, inside a subclass's ``init_args``, over as the string ``'None'`` (the mapping form ``<part>={<field>:
    null}`` gives None): no such field means that string, so it is None again (``net.backbone_weights=null``, the
    full configs' random-init switch; ``offline.level=null``, an online-only run)."""
    optional_str = [f.name for f in dataclasses.fields(cls) if f.type in OPTIONAL_STR]  # type: ignore[arg-type]
    nulls = {n: None for n in optional_str if getattr(part, n) == "None"}
    return dataclasses.replace(part, **nulls) if nulls else part  # type: ignore[type-var]
