"""Class prototypes from a FIFO memory of labelled features, the prototype-contrastive loss, graph edge labels.

* ``class_means(F, Y, C)``            per-class mean μ_c of the rows of F with label c; zeros for empty classes;
                                      detached.
* ``FIFOMemory``                      features, labels and domains in arrival order (buffers, no grad); grows up
                                      to a limit, then drops the oldest rows first.
* ``prototype_contrastive_loss``      CE over cosine logits cos(h_i, μ_c)/τ against the pseudo-class ŷ_i
                                      (D-CGCT-style progressive prototype alignment, the "MO" term of FDUC).
* ``label2edge(y)``                   D-CGCT's edge targets 1[y_i = y_j] and the mask "both labels ≠ −1".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@torch.no_grad()
def class_means(feat: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """(C, d) per-class means of ``feat`` rows by ``labels``; a class with no row gives the zero vector."""
    onehot = F.one_hot(labels.long(), num_classes).to(feat.dtype)  # (N, C)
    sums = onehot.T @ feat.detach()
    counts = onehot.sum(0)[:, None]
    return torch.where(counts > 0, sums / counts.clamp_min(1), torch.zeros_like(sums))


class FIFOMemory(nn.Module):
    """Rows in arrival order (``[0, length)``, oldest first) in buffers of ``capacity`` rows."""

    def __init__(self, capacity: int, feat_dim: int):
        super().__init__()
        self.register_buffer("feat", torch.zeros(capacity, feat_dim))
        self.register_buffer("label", torch.full((capacity,), -1, dtype=torch.long))
        self.register_buffer("domain", torch.full((capacity,), -1, dtype=torch.long))
        self.register_buffer("length", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def append(self, feat: Tensor, label: Tensor, domain: Tensor, limit: int | None = None) -> None:
        """Append b rows; while ``length + b`` ≤ ``limit`` (default: capacity) the memory grows, otherwise the
        oldest b rows are dropped first so the length stays."""
        b, n = len(feat), int(self.length)
        limit = len(self.feat) if limit is None else min(limit, len(self.feat))
        if n + b > limit:
            keep = max(0, min(n, limit) - b)
            drop = n - keep
            self.feat[:keep] = self.feat[drop:n].clone()
            self.label[:keep] = self.label[drop:n].clone()
            self.domain[:keep] = self.domain[drop:n].clone()
            n = keep
        b = min(b, limit - n)
        self.feat[n : n + b] = feat[-b:].detach().to(self.feat.dtype)
        self.label[n : n + b] = label[-b:].long()
        self.domain[n : n + b] = domain[-b:].long()
        self.length.fill_(n + b)

    def rows(self) -> tuple[Tensor, Tensor, Tensor]:
        n = int(self.length)
        return self.feat[:n], self.label[:n], self.domain[:n]


def prototype_contrastive_loss(h: Tensor, protos: Tensor, pseudo: Tensor, tau: float = 1.0) -> Tensor:
    """L_proto = CE(s_i·, ŷ_i), s_ic = cos(h_i, μ_c)/τ; the prototypes are constants (detached)."""
    logits = F.normalize(h, dim=1) @ F.normalize(protos.detach(), dim=1).T / tau
    return F.cross_entropy(logits, pseudo.detach())


def label2edge(labels: Tensor) -> tuple[Tensor, Tensor]:
    """(edge, mask): edge_ij = 1[y_i = y_j] (float), mask_ij = y_i ≠ −1 and y_j ≠ −1."""
    edge = (labels[:, None] == labels[None, :]).float()
    known = labels != -1
    return edge, known[:, None] & known[None, :]
