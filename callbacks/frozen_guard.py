"""``FrozenParamGuard``: the modules a method keeps frozen stay bit-identical through the fit and hold no gradient.

Adapter methods train a small side network on a frozen backbone (e.g. LiteVSR, arXiv 2606.09250: "every backbone
block stays frozen"; its Table 1 counts the trainable fraction against that frozen DiT). The guard makes "frozen"
a checked fact rather than a ``requires_grad`` flag:

* ``on_fit_start``: resolve each guarded module by its attribute path on the LightningModule (``"backbone"``,
  ``"unet.down_blocks"``, ...), refuse one that has a parameter with ``requires_grad``, and take a SHA-256 of every
  tensor of its state dict (parameters and buffers, by name, dtype and shape included);
* ``on_validation_epoch_end`` (during a fit): log ``{prefix}{path}_changed``, the number of tensors of the module
  that are no longer bit-identical (``.`` in the path becomes ``_``), so that a card can read it;
* ``on_train_batch_end``: raise naming the first frozen parameters that hold a ``.grad`` (or require one);
* ``on_fit_end``: raise naming the first tensors that changed, that hold a ``.grad`` (or require one), or that an
  optimizer of the fit holds.

The module paths are resolved at fit start, after ``setup``, so a module built in ``setup`` (a backbone
pre-trained there) can be guarded. ``exclude``: regular expressions (``re.search``) over the full tensor names
(``"<path>.<tensor name>"``) that the method trains inside a guarded module (SCNS: the cross-attention K/V rows it
selects and the new concept's token row); every other tensor of the module is guarded.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import lightning as L
from torch import nn

from litlab.lit_modules.core.frozen import resolve_module, tensor_digest


def _listed(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return f"{shown} ({len(names)} in all)" if len(names) > limit else shown


class FrozenParamGuard(L.Callback):
    """See the module docstring. ``modules``: attribute paths on the LightningModule of the frozen modules."""

    def __init__(
        self, modules: Sequence[str] = ("backbone",), log_prefix: str = "val/", exclude: Sequence[str] = ()
    ):
        if isinstance(modules, str):
            modules = [modules]
        if not modules or any(not isinstance(m, str) or not m for m in modules):
            raise ValueError(f"modules must be non-empty attribute paths, got {modules!r}")
        if isinstance(exclude, str):
            exclude = [exclude]
        try:
            self.exclude = [re.compile(e) for e in exclude]
        except re.error as err:
            raise ValueError(f"exclude must be regular expressions, got {list(exclude)!r}: {err}") from err
        self.paths = list(modules)
        self.log_prefix = log_prefix
        self.before: dict[str, dict[str, str]] | None = None

    def _modules(self, pl_module: nn.Module) -> dict[str, nn.Module]:
        return {p: resolve_module(pl_module, p) for p in self.paths}

    def _guarded(self, name: str) -> bool:
        return not any(e.search(name) for e in self.exclude)

    def _params(self, pl_module: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
        for path, m in self._modules(pl_module).items():
            for name, p in m.named_parameters():
                if self._guarded(f"{path}.{name}"):
                    yield f"{path}.{name}", p

    def _digests(self, path: str, module: nn.Module) -> dict[str, str]:
        named = ((f"{path}.{n}", t) for n, t in module.state_dict(keep_vars=True).items())
        return {n: tensor_digest(t) for n, t in named if self._guarded(n)}

    def changed(self, pl_module: nn.Module) -> dict[str, list[str]]:
        """Per guarded path: the names of its tensors that differ from the fit-start digests."""
        if self.before is None:
            raise RuntimeError("FrozenParamGuard.changed() before on_fit_start took the digests")
        out = {}
        for path, module in self._modules(pl_module).items():
            after = self._digests(path, module)
            before = self.before[path]
            out[path] = [k for k, v in before.items() if after.get(k) != v] + sorted(set(after) - set(before))
        return out

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        modules = self._modules(pl_module)
        trainable = [name for name, p in self._params(pl_module) if p.requires_grad]
        if trainable:
            raise ValueError(
                f"FrozenParamGuard guards {self.paths}, but these parameters require grad at fit start: "
                f"{_listed(trainable)}; freeze them (requires_grad_(False)) or do not guard that module"
            )
        self.before = {path: self._digests(path, m) for path, m in modules.items()}

    def _check_grads(self, pl_module: nn.Module, when: str) -> None:
        with_grad = [name for name, p in self._params(pl_module) if p.grad is not None or p.requires_grad]
        if with_grad:
            raise RuntimeError(f"frozen parameters hold a .grad or require one {when}: {_listed(with_grad)}")

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx
    ) -> None:
        # Lightning sets every .grad of the model to None before validation (on_validation_model_zero_grad), so a
        # gradient that reached a frozen tensor is looked for after every training batch, not only at the fit's end
        if self.before is not None:
            self._check_grads(pl_module, f"after training batch {batch_idx}")

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.before is None or trainer.sanity_checking:
            return
        for path, names in self.changed(pl_module).items():
            key = f"{self.log_prefix}{path.replace('.', '_')}_changed"
            pl_module.log(key, float(len(names)), on_step=False, on_epoch=True)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.before is None:
            return
        changed = [n for names in self.changed(pl_module).values() for n in names]
        if changed:
            raise RuntimeError(f"frozen tensors changed during the fit: {_listed(changed)}")
        self._check_grads(pl_module, "after the fit")
        names = {id(p): name for name, p in self._params(pl_module)}
        held = [
            names[id(p)]
            for opt in trainer.optimizers
            for g in opt.param_groups
            for p in g["params"]
            if id(p) in names
        ]
        if held:
            raise RuntimeError(f"the optimizer holds frozen parameters: {_listed(held)}")
