"""Stand-ins: a card's full-scale config run on the CPU, offline, on a tiny random model of the same Hugging Face /
diffusers classes and a few records of each data set in its real on-disk format, through the same code path.

``litlab fit --config configs/<slug>/full.yaml --stand-in`` and ``litlab repro <slug> --scale full --stand-in``
call :func:`stand_in_args`: the card's stand-in function writes the tiny model folder(s) and data records under a
work folder and returns the ``litlab fit`` overrides, appended after the config (and after a repro run's own
overrides), that point the config at them and shrink the run. They change paths and sizes only, never what the
full config means; a stand-in's numbers are not the card's, so ``litlab repro --record`` refuses ``--stand-in``.

Every stand-in function has the signature ``stand_in_<slug>(workdir: Path) -> list[str]``, works offline and
deterministically (it seeds its own torch generator), and takes a few seconds.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import cast

from litlab.lit_modules.core.errors import ConfigError

# slug -> "module:function", imported on use (so a family's heavy imports are paid only by its own cards)
STAND_INS: dict[str, str] = {
    "csplora": "litlab.lit_modules.peft.standin:stand_in_csplora",
    "lokra": "litlab.lit_modules.peft.standin:stand_in_lokra",
    "spr_raft": "litlab.lit_modules.peft.spr_raft_full:stand_in_spr_raft",
    "gap_init": "litlab.lit_modules.peft.gap_init_full:stand_in_gap_init",
    "janus_lora": "litlab.lit_modules.continual.standin:stand_in_janus_lora",
    "loda": "litlab.lit_modules.continual.standin:stand_in_loda",
    "dare": "litlab.lit_modules.rl.standin:stand_in_dare",
    "ngt": "litlab.lit_modules.rl.standin:stand_in_ngt",
    "u3cf": "litlab.lit_modules.domain.standin:stand_in_u3cf",
    "sfda_regression": "litlab.lit_modules.domain.standin:stand_in_sfda_regression",
    "diffract": "litlab.lit_modules.analysis.standin:stand_in_diffract",
    "lock_in": "litlab.lit_modules.analysis.standin:stand_in_lock_in",
    "task_complexity": "litlab.lit_modules.analysis.standin:stand_in_task_complexity",
    "litevsr": "litlab.lit_modules.diffusion.standin:stand_in_litevsr",
    "scns": "litlab.lit_modules.diffusion.standin:stand_in_scns",
    "xkv": "litlab.lit_modules.longctx.standin:stand_in_xkv",
    "sale": "litlab.lit_modules.longctx.standin:stand_in_sale",
    "salaad": "litlab.lit_modules.structured.standin:stand_in_salaad",
    "lordo": "litlab.lit_modules.lowcomm.standin:stand_in_lordo",
}

StandIn = Callable[[Path], list[str]]


def stand_in_function(slug: str) -> StandIn:
    """The card's stand-in function, imported now; ``ConfigError`` naming the slug and the target when there is
    none (an unknown slug, a module or function not there)."""
    target = STAND_INS.get(slug)
    if target is None:
        raise ConfigError(
            f"no stand-in for card {slug!r}: the cards with one are {', '.join(sorted(STAND_INS))}"
        )
    module_name, _, function_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not module_name.startswith(err.name):
            raise  # the stand-in's module exists; something it imports is missing
        raise ConfigError(
            f"the stand-in of card {slug!r} is {target}, but module {module_name} does not exist"
        ) from err
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(
            f"the stand-in of card {slug!r} is {target}, but {module_name} has no function {function_name}"
        )
    return cast(StandIn, function)


def stand_in_args(slug: str, workdir: Path) -> list[str]:
    """Write card ``slug``'s tiny models and data records under ``workdir`` and return the ``litlab fit``
    overrides that point its full config at them (appended after ``--config configs/<slug>/full.yaml``)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    args = stand_in_function(slug)(workdir)
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise TypeError(
            f"the stand-in of card {slug!r} ({STAND_INS[slug]}) returned {args!r}, not a list of str"
        )
    return args
