"""Memory banks of target features and predictions, indexed by the sample's position in the target set.

``IndexedBank`` holds L2-normalised features ``feat`` (N, d) and predictions ``pred`` (N, T) as registered
buffers (so they travel in the checkpoint) and answers kNN queries by cosine similarity with the query's own
row excluded (NRC / UCon-SFDA / SHOT-style neighbourhoods).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class IndexedBank(nn.Module):
    def __init__(self, size: int, feat_dim: int, pred_dim: int):
        super().__init__()
        self.register_buffer("feat", torch.zeros(size, feat_dim))
        self.register_buffer("pred", torch.zeros(size, pred_dim))
        self.register_buffer("filled", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def update(self, idx: Tensor, feat: Tensor, pred: Tensor) -> None:
        """Rows ``idx`` ← (normalise(feat), pred) (detached)."""
        self.feat[idx] = F.normalize(feat.detach().float(), dim=1)
        self.pred[idx] = pred.detach().float()

    @torch.no_grad()
    def neighbours(self, feat: Tensor, k: int, self_idx: Tensor | None = None) -> Tensor:
        """(b, k) indices of the k most cosine-similar bank rows to ``feat``, never the query's own row
        ``self_idx`` (its similarity is set to −inf before the top-k: the spec's top-(k+1) minus self, robust to
        ties); without ``self_idx`` plain top-k."""
        sim = F.normalize(feat.detach().float(), dim=1) @ self.feat.T
        if self_idx is None:
            return sim.topk(k, dim=1).indices
        sim[torch.arange(len(sim)), self_idx] = -float("inf")  # self excluded outright, even on ties
        return sim.topk(k, dim=1).indices

    @torch.no_grad()
    def all_neighbours(self, k: int, chunk: int = 2048) -> Tensor:
        """(N, k) neighbours of every bank row among the other rows."""
        out = []
        for s in range(0, len(self.feat), chunk):
            idx = torch.arange(s, min(s + chunk, len(self.feat)), device=self.feat.device)
            out.append(self.neighbours(self.feat[idx], k, idx))
        return torch.cat(out)
