"""One seed per run; every random component takes its own stream from it, by name.

A run has exactly one seed: Lightning's ``seed_everything`` (``--seed_everything``, a card's seed), which
Lightning also exports as ``PL_GLOBAL_SEED``. Nothing else in a config is a seed. A component that draws random
numbers of its own (the data set a generator draws, a tiny pretrained backbone, the prompt set, an environment,
an adapter's initialisation) asks for its stream::

    gen = torch.Generator().manual_seed(derive_seed("data"))

``derive_seed(component)`` hashes ``(run seed, component)``, so two runs with the same seed draw the same data
and backbone (a card's runs of one seed are paired) and two seeds never share a stream by accident. Every
derivation is written into the run's *seed ledger*, which ``summary.json`` stores (``seed_ledger``) with a
fingerprint of every cached artefact the run used (``record_artefact``: a pre-trained base, a generated data
set, a prompt set). ``litlab repro`` refuses a card whose seeds share a component's seed or fingerprint unless
the card lists the component under ``shared:`` (a real pre-trained model is the same for every seed).

A component may be pinned on purpose (``derive_seed("target", fixed=1)``: the same target matrix for every
run seed); the ledger records the pinned value, so the card must then declare the component shared.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

# component -> derived seed, and artefact -> fingerprint, of the run being built in this process
# (litlab.cli.LitlabCLI resets it per run; in-process runs are sequential)
_LEDGER: dict[str, Any] = {"run_seed": None, "components": {}, "artefacts": {}}


def run_seed() -> int:
    """The run's seed: Lightning's ``seed_everything`` value (``PL_GLOBAL_SEED``), 0 outside a seeded run."""
    value = os.environ.get("PL_GLOBAL_SEED")
    try:
        return int(value) if value not in (None, "") else 0
    except ValueError:
        raise ValueError(f"PL_GLOBAL_SEED={value!r} is not an integer seed") from None


def derive_seed(component: str, *, fixed: int | None = None) -> int:
    """The seed of ``component``'s random stream in this run (a 31-bit int, usable by every generator).

    ``fixed`` pins the stream to that value whatever the run seed (recorded as pinned in the ledger).
    """
    if not component or not isinstance(component, str):
        raise ValueError(f"a seed component needs a name, got {component!r}")
    if fixed is not None:
        derived = int(fixed)
    else:
        digest = hashlib.sha256(f"litlab-seed/{run_seed()}/{component}".encode()).digest()
        derived = int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
    _LEDGER["components"][component] = derived
    if _LEDGER["run_seed"] is None:
        _LEDGER["run_seed"] = run_seed()
    return derived


def record_artefact(component: str, fingerprint: str) -> None:
    """Note that this run used a cached artefact (``fingerprint``: a content or cache-key hash)."""
    _LEDGER["artefacts"][component] = str(fingerprint)


def fingerprint(*parts: Any) -> str:
    """A short stable hash of ``parts`` (tensors hash their bytes; anything else its ``repr``)."""
    h = hashlib.sha256()
    for part in parts:
        _update(h, part)
    return h.hexdigest()[:16]


def _update(h: hashlib._Hash, part: Any) -> None:
    if hasattr(part, "detach") and hasattr(part, "numpy"):  # a torch tensor, without importing torch here
        t = part.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.view(-1).view(dtype=_byte_dtype()).numpy().tobytes() if t.numel() else b"")
    elif isinstance(part, dict):
        for key in sorted(part, key=str):
            h.update(str(key).encode())
            _update(h, part[key])
    elif isinstance(part, (list, tuple)):
        for item in part:
            _update(h, item)
    else:
        h.update(repr(part).encode())


def _byte_dtype() -> Any:
    import torch  # deferred: this module is read by commands that never import torch

    return torch.uint8


def reset_ledger(seed: int | None) -> None:
    """Start the ledger of a new run (called by ``LitlabCLI`` once its seed is set)."""
    _LEDGER.update(run_seed=seed, components={}, artefacts={})


def seed_ledger() -> dict[str, Any]:
    """The current run's ledger: ``{"run_seed", "components": {name: seed}, "artefacts": {name: fingerprint}}``."""
    return {
        "run_seed": _LEDGER["run_seed"],
        "components": dict(sorted(_LEDGER["components"].items())),
        "artefacts": dict(sorted(_LEDGER["artefacts"].items())),
    }
