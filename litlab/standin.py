"""Stand-ins: a card's full-scale config run on the CPU, offline, on a tiny random model of the same Hugging Face /
diffusers classes and a few records of each data set in its real on-disk format, through the same code path.

``litlab fit --config configs/<slug>/full.yaml --stand-in`` and ``litlab repro <slug> --scale full --stand-in``
call :func:`stand_in_args`: the card's stand-in function writes the tiny model folder(s) and data records under a
work folder and returns the ``litlab fit`` overrides, appended after the config (and after a repro run's own
overrides), that point the config at them and shrink the run. They change paths and sizes only, never what the
full config means; a stand-in's numbers are not the card's, so ``litlab repro --record`` refuses ``--stand-in``.

Every stand-in function has the signature ``stand_in_<slug>(workdir: Path) -> list[str]``, works offline and
deterministically (it seeds its own torch generator), and takes a few seconds.

Where the files go: ``litlab fit --stand-in`` writes them to ``<runs_dir>/<experiment>/stand_in/``, once, and the
runs of that experiment share them. Not inside the run folder: its name hashes the resolved config, which holds the
stand-in's paths, so the paths must be known before the run folder is; a relaunch (``--ckpt_path last``) then gets
the same paths, the same config hash and so the same run folder. ``stand_in.json`` there records the arguments and
the hash of the stand-in's source and of the litlab modules it reaches; a folder written by another version of
them is written again.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import os
import shutil
import types
from collections.abc import Callable
from pathlib import Path
from typing import cast

from litlab.lit_modules.core.errors import ConfigError
from litlab.lit_modules.core.io import atomic_write_json, one_builder
from litlab.runs import check_run_name

# the flag of `litlab fit|validate|test|predict` (the underscore spelling as litlab's other run flags have it)
STAND_IN_FLAGS = ("--stand-in", "--stand_in")
RECORD_FILE = "stand_in.json"

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


def stand_in_source_sha256(function: StandIn) -> str:
    """The hash of the stand-in's module and of every litlab module it reaches through module-level names
    (transitively): a change in a helper the stand-in calls (a tiny-model writer in ``core``) writes the folder
    again, not only a change in the stand-in's own file."""
    start = inspect.getmodule(function)
    if start is None:
        return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()
    seen: dict[str, types.ModuleType] = {}
    todo = [start]
    while todo:
        module = todo.pop()
        if module.__name__ in seen:
            continue
        seen[module.__name__] = module
        for value in vars(module).values():
            found = value if isinstance(value, types.ModuleType) else inspect.getmodule(value)
            if found is not None and found.__name__.split(".")[0] == "litlab" and found.__name__ not in seen:
                todo.append(found)
    digest = hashlib.sha256()
    for name in sorted(seen):
        digest.update(name.encode() + b"\0" + inspect.getsource(seen[name]).encode() + b"\0")
    return digest.hexdigest()


def prepared_stand_in(slug: str, workdir: Path) -> list[str]:
    """:func:`stand_in_args` once per ``workdir``: a folder already written by this version of the stand-in (its
    ``stand_in.json``) is reused with its arguments; two processes that need it at once (``--jobs``, two fits)
    write it once. The Hugging Face hub is put offline first: a stand-in never downloads."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    function = stand_in_function(slug)
    record = {"slug": slug, "target": STAND_INS[slug], "source_sha256": stand_in_source_sha256(function)}
    workdir = Path(workdir).resolve()
    with one_builder(workdir):
        try:
            written = json.loads((workdir / RECORD_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            written = {}
        if written and all(written.get(k) == v for k, v in record.items()):
            return list(written["args"])
        if workdir.exists():
            shutil.rmtree(workdir)  # a half-written folder or another version's files
        args = stand_in_args(slug, workdir)
        atomic_write_json(workdir / RECORD_FILE, {**record, "args": args})  # last: the folder is complete
        return args


def _option(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The first value of an option given as ``--name value`` or ``--name=value``."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def expand_stand_in_flag(argv: list[str]) -> list[str]:
    """``litlab fit --config configs/<slug>/full.yaml --stand-in [overrides]``: the card is the config's folder;
    ``--stand-in`` is replaced, where it stands, by the card's stand-in arguments, so overrides after it win.
    Arguments without the flag come back unchanged."""
    at = [i for i, arg in enumerate(argv) if arg in STAND_IN_FLAGS]
    if not at:
        return list(argv)
    config = _option(argv, ("--config", "-c"))
    if config is None:
        raise ConfigError("--stand-in needs the card's full config: --config configs/<slug>/full.yaml")
    slug = Path(config).resolve().parent.name
    experiment = check_run_name("--experiment", _option(argv, ("--experiment",)) or slug)
    workdir = Path(_option(argv, ("--runs_dir",)) or "runs") / experiment / "stand_in"
    args = prepared_stand_in(slug, workdir)
    rest = [arg for i, arg in enumerate(argv) if i not in at[1:]]  # the flag once
    return [*rest[: at[0]], *args, *rest[at[0] + 1 :]]
