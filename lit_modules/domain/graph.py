"""D-CGCT's graph head over a batch (Roy et al., "Curriculum Graph Co-Teaching for Multi-Target Domain
Adaptation", CVPR 2021, arXiv 2104.00808, §3.1 and its public code's ``ClassifierGNN``): every image of the
batch is a node with its bottleneck feature h_i; an edge network scores every pair, a node network classifies
each node from its feature and its neighbours' similarity-weighted mean.

* ``EdgeNet``          A_ij = σ(φ(|h_i − h_j|)), φ = 1×1 convolutions d → 2E → E (each BN + LeakyReLU) → 1, over
                       the (n, n) pair grid; returns A and Ā = (A + I + 1e-6) / column sums.
* ``aggregate(Ā, H)``  the node network's message: Ā with its diagonal zeroed, rows L1-normalised, times H (each
                       node's similarity-weighted mean of the other nodes).
* ``NodeNet``          [H, aggregate(Ā, H)] (n, 2d) → 1×1 conv 2d → 2C, BN, LeakyReLU → C, BN: the logits (n, C).
* ``ClassifierGNN``    both: ``(logits (n, C), A (n, n))``.
* ``edge_loss``        BCE(A_ij, 1[y_i = y_j]) over the pairs whose labels are both known
                       (``prototypes.label2edge``'s mask).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litlab.lit_modules.domain.prototypes import label2edge


class EdgeNet(nn.Module):
    def __init__(self, in_features: int, edge_features: int):
        super().__init__()
        c = (2 * edge_features, edge_features)
        self.sim = nn.Sequential(
            nn.Conv2d(in_features, c[0], 1, bias=False),
            nn.BatchNorm2d(c[0]),
            nn.LeakyReLU(),
            nn.Conv2d(c[0], c[1], 1, bias=False),
            nn.BatchNorm2d(c[1]),
            nn.LeakyReLU(),
            nn.Conv2d(c[1], 1, 1),
        )

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """(Ā, A) for node features h (n, d)."""
        n = len(h)
        pairs = (h[:, None, :] - h[None, :, :]).abs()  # (n, n, d)
        sim = torch.sigmoid(self.sim(pairs.permute(2, 0, 1)[None]))[0, 0]  # (n, n)
        norm = sim + torch.eye(n, device=h.device, dtype=h.dtype) + 1e-6
        return norm / norm.sum(0, keepdim=True), sim


def aggregate(edge_norm: Tensor, h: Tensor) -> Tensor:
    """Each node's weighted mean of the other nodes' features: diag(Ā) ← 0, rows L1-normalised, times h."""
    n = len(h)
    w = edge_norm * (1 - torch.eye(n, device=h.device, dtype=h.dtype))
    return F.normalize(w, p=1, dim=-1) @ h


class NodeNet(nn.Module):
    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(2 * in_features, 2 * num_classes, 1, bias=False),
            nn.BatchNorm2d(2 * num_classes),
            nn.LeakyReLU(),
            nn.Conv2d(2 * num_classes, num_classes, 1, bias=False),
            nn.BatchNorm2d(num_classes),
        )

    def forward(self, h: Tensor, edge_norm: Tensor) -> Tensor:
        x = torch.cat([h, aggregate(edge_norm, h)], -1)  # (n, 2d)
        return self.net(x.T[None, :, :, None])[0, :, :, 0].T  # (n, C)


class ClassifierGNN(nn.Module):
    """D-CGCT's graph classifier: ``(logits (n, C), A (n, n))`` of a batch of n node features."""

    def __init__(self, in_features: int, edge_features: int, num_classes: int):
        super().__init__()
        self.edge_net = EdgeNet(in_features, edge_features)
        self.node_net = NodeNet(in_features, num_classes)

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        edge_norm, sim = self.edge_net(h)
        return self.node_net(h, edge_norm), sim


def edge_loss(sim: Tensor, labels: Tensor) -> Tensor:
    """BCE(A_ij, 1[y_i = y_j]) over the pairs with both labels ≠ −1; 0 when there is none."""
    edge, mask = label2edge(labels)
    if not mask.any():
        return sim.sum() * 0.0
    return F.binary_cross_entropy(sim[mask], edge[mask].to(sim.dtype))
