"""Checking a written contract: does an object provide every member a ``typing.Protocol`` declares?

Each family writes what it needs from the parts it does not own (its DataModule, a callback, an optimizer) as a
Protocol in ``lit_modules/<family>/contract.py``, and checks it once, at setup, with ``check_protocol``: a
mismatch then stops the run at once with the class and the member named, not with an AttributeError mid-run.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Protocol

from litlab.lit_modules.core.errors import ContractError


def protocol_members(protocol: type) -> list[str]:
    """The public attributes and methods ``protocol`` declares, its Protocol bases' first, in declaration order."""
    names: list[str] = []
    for cls in reversed(protocol.__mro__):
        if cls is Protocol or not getattr(cls, "_is_protocol", False):
            continue
        declared = [*vars(cls).get("__annotations__", {}), *vars(cls)]
        names += [n for n in declared if not n.startswith("_") and n not in names]
    return names


def _owner(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO that defines ``name``, looked up without evaluating it (properties stay lazy)."""
    return next((base for base in cls.__mro__ if name in vars(base)), None)


def check_protocol(obj: object, protocol: type, user: str, members: Iterable[str] | None = None) -> None:
    """Raise ``ContractError`` naming ``obj``'s class and the first member of ``protocol`` it lacks.

    A member counts as provided when the object's class defines it (a hook only Lightning's base class defines,
    which raises "not implemented", does not count) or the instance holds it. A member the protocol declares as a
    method must be callable. ``members`` restricts the check (a module that runs online-only needs fewer).
    """
    wanted = list(members) if members is not None else protocol_members(protocol)
    where = f"{protocol.__module__}.{protocol.__qualname__}"
    if obj is None:
        raise ContractError(f"{user} needs an object providing {where} ({', '.join(wanted)}), got None")
    cls = type(obj)
    name_of = f"{cls.__module__}.{cls.__qualname__}"
    for name in wanted:
        owner = _owner(cls, name)
        provided = (owner is not None and not owner.__module__.startswith("lightning.")) or name in getattr(
            obj, "__dict__", {}
        )
        if not provided:
            raise ContractError(f"{name_of} lacks {name!r}, which {user} needs ({where})")
        declared = inspect.getattr_static(protocol, name, None)
        if (
            inspect.isfunction(declared)
            and owner is not None
            and not callable(inspect.getattr_static(obj, name))
        ):
            raise ContractError(f"{name_of}.{name} must be a method ({where})")


def check_data(dm: object, protocol: type, user: str) -> None:
    """``check_protocol`` for a DataModule: the check a family runs once, when its module is set up.

    The error also says that a member the DataModule sets in its own ``setup()`` is missing until that ran (the
    Trainer runs it before the module's ``setup``; a DataModule checked by hand may not have run it yet)."""
    try:
        check_protocol(dm, protocol, user)
    except ContractError as err:
        raise ContractError(
            f"{err}; a member the DataModule sets in setup() is missing until setup() ran"
        ) from None
