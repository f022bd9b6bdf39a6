"""Per-block hints added to a frozen transformer's residual stream by forward hooks (the ControlNet-Transformer of
PixArt-δ, arXiv 2401.05252; the per-block "hints" of Wan-VACE; ControlNet's zero-initialised outputs, arXiv 2302.05543).

``BlockHintInjector(blocks, layers)`` registers one forward hook on ``blocks[l]`` for each ``l`` in ``layers``;
while hints are set (``with injector.inject(hints):``, ``hints[j]`` of shape (B, N, D) for ``layers[j]``), the
hook returns ``Block_l(h) + H_j`` instead of the block's output. No backbone weight is edited, nothing is
wrapped: outside ``inject`` (or with every hint ``None``) the backbone computes exactly what it computed before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from torch import Tensor, nn


class BlockHintInjector:
    """Forward hooks adding ``hints[j]`` to the output of ``blocks[layers[j]]`` (see the module docstring)."""

    def __init__(self, blocks: Sequence[nn.Module], layers: Sequence[int]):
        layers = [int(i) for i in layers]
        if not layers:
            raise ValueError("inject_layers is empty: no block would receive a hint")
        bad = [i for i in layers if not 0 <= i < len(blocks)]
        if bad or len(set(layers)) != len(layers):
            raise ValueError(f"inject_layers {layers} must be distinct block indices in 0..{len(blocks) - 1}")
        self.layers = layers
        self._hints: list[Tensor | None] = [None] * len(layers)
        self._handles = [blocks[layer].register_forward_hook(self._hook(j)) for j, layer in enumerate(layers)]

    def _hook(self, j: int):
        def hook(module: nn.Module, args, output: Tensor) -> Tensor | None:
            hint = self._hints[j]
            if hint is None:
                return None
            if hint.shape != output.shape:
                raise ValueError(
                    f"hint {j} for block {self.layers[j]} has shape {tuple(hint.shape)}, the block's output "
                    f"{tuple(output.shape)}"
                )
            return output + hint.to(output.dtype)

        return hook

    @contextlib.contextmanager
    def inject(self, hints: Sequence[Tensor | None]):
        if len(hints) != len(self.layers):
            raise ValueError(f"{len(hints)} hints for {len(self.layers)} hooked blocks {self.layers}")
        self._hints = list(hints)
        try:
            yield
        finally:
            self._hints = [None] * len(self.layers)

    def set_hints(self, hints: Sequence[Tensor | None]) -> None:
        """Replace the hints inside an ``inject`` block (a hook that computes them during the forward pass)."""
        if len(hints) != len(self.layers):
            raise ValueError(f"{len(hints)} hints for {len(self.layers)} hooked blocks {self.layers}")
        self._hints = list(hints)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
