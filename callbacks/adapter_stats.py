"""A probe for any adapted model: how many independent directions do its adapters use?"""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch

from litlab.lit_modules.core.adapters import AdapterLinear, find_adapters
from litlab.lit_modules.core.kruskal import effective_rank, sampled_logvol, sampled_sigma_min


@torch.no_grad()
def adapter_spectrum(
    adapted: Mapping[str, AdapterLinear], n_samples: int = 500, seed: int = 12345
) -> dict[str, float]:
    """Means over adapted layers of: the effective rank of ΔW, and for each branch's Kruskal factors
    (A and Bᵀ, or D and C) the sampled log-volume and median σ_min of random q-column subsets
    (the quantities LoKRA's penalty raises; the *minimum* σ_min over samples says little, even Gaussian
    factors give ~1e-4)."""
    gen = torch.Generator().manual_seed(seed)
    logvol, sigma, erank = [], [], []
    for layer in adapted.values():
        for branch in layer.branches.values():
            for M in branch.kruskal_factors():
                if M.abs().sum() == 0:  # B (or C) before its first update: no directions yet
                    continue
                logvol.append(sampled_logvol(M, None, n_samples, gen))
                sigma.append(sampled_sigma_min(M, None, n_samples, gen).median())
            erank.append(effective_rank(branch.delta_weight()))
    out = {"adapters/eff_rank": float(torch.stack(erank).mean())} if erank else {}
    if logvol:
        out["adapters/kruskal_logvol"] = float(torch.stack(logvol).mean())
        out["adapters/kruskal_sigma_min_median"] = float(torch.stack(sigma).mean())
    return out


class AdapterSpectrumCallback(L.Callback):
    """After each validation epoch, log ``adapter_spectrum`` of every ``AdapterLinear`` in the model."""

    def __init__(self, n_samples: int = 500, seed: int = 12345):
        self.n_samples, self.seed = n_samples, seed

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        adapted = find_adapters(pl_module)
        if adapted and not trainer.sanity_checking:
            pl_module.log_dict(adapter_spectrum(adapted, self.n_samples, self.seed))
