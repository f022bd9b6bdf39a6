"""Correlated token classes made locally (no files): the ``synth_cil`` generator of the platform's LoRA toys,
and the CSPLoRA planning task built on it (a pre-training set of base classes, and a downstream set of novel
classes behind an input-side domain shift).

Generator: a bank of ``n_motifs`` random motif matrices m_j ∈ R^{tokens×dim} with unit Frobenius norm. Class c
picks 3 distinct motifs and coefficients U[0.5, 1.5]: prototype P_c = Σ coeff·m_j. A sample is P_c + σε,
ε ~ N(0, I), σ = noise·3·RMS(P) (RMS over all prototype entries), then a cyclic shift of 0 or 1 token. Classes
that share motifs are correlated.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from litlab.lit_modules.core.seeding import derive_seed


def motif_prototypes(
    n_classes: int, n_motifs: int, tokens: int, dim: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """(prototypes [n_classes, tokens, dim], motif bank [n_motifs, tokens, dim])."""
    bank = torch.randn(n_motifs, tokens, dim, generator=generator)
    bank = bank / bank.flatten(1).norm(dim=1).view(-1, 1, 1)
    picks = torch.stack([torch.randperm(n_motifs, generator=generator)[:3] for _ in range(n_classes)])
    coeff = 0.5 + torch.rand(n_classes, 3, generator=generator)
    return (coeff.view(n_classes, 3, 1, 1) * bank[picks]).sum(1), bank


def sample_classes(
    prototypes: Tensor, per_class: int, noise: float, rms: float, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """``per_class`` noisy, randomly shifted samples of every prototype (vectorised), and their labels."""
    n, tokens, dim = prototypes.shape
    labels = torch.arange(n).repeat_interleave(per_class)
    x = prototypes[labels] + noise * 3.0 * rms * torch.randn(len(labels), tokens, dim, generator=generator)
    shift = torch.randint(0, 2, (len(labels),), generator=generator).bool()
    x[shift] = torch.roll(x[shift], shifts=1, dims=1)
    return x, labels


class PlanningTaskData(L.LightningDataModule):
    """CSPLoRA's CPU task (its spec §6): ``base_classes`` × ``base_per_class`` samples pre-train the backbone
    (``pretrain_set``); ``novel_classes`` classes with ``train_per_class`` / ``test_per_class`` samples form the
    downstream task, every input multiplied on its feature side by one fixed random orthogonal matrix (a shift
    at the input, so the early modules matter most). The run seed's ``"data"`` stream
    (``litlab.lit_modules.core.seeding.derive_seed``) draws everything: motifs, classes, samples, the shift."""

    def __init__(
        self,
        tokens: int = 16,
        dim: int = 32,
        n_motifs: int = 40,
        base_classes: int = 40,
        base_per_class: int = 300,
        novel_classes: int = 20,
        train_per_class: int = 200,
        test_per_class: int = 100,
        noise: float = 1.0,
        batch_size: int = 32,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.num_classes = novel_classes
        self._built = False

    def _build(self) -> None:
        if self._built:
            return
        hp = self.hparams
        g = torch.Generator().manual_seed(derive_seed("data"))
        protos, _ = motif_prototypes(hp.base_classes + hp.novel_classes, hp.n_motifs, hp.tokens, hp.dim, g)
        rms = float(protos.pow(2).mean().sqrt())
        base, novel = protos[: hp.base_classes], protos[hp.base_classes :]
        self.base_x, self.base_y = sample_classes(base, hp.base_per_class, hp.noise, rms, g)
        x, y = sample_classes(novel, hp.train_per_class + hp.test_per_class, hp.noise, rms, g)
        shift, _ = torch.linalg.qr(torch.randn(hp.dim, hp.dim, generator=g))
        x = x @ shift
        per = hp.train_per_class + hp.test_per_class
        is_train = (torch.arange(len(y)) % per) < hp.train_per_class
        self.train_x, self.train_y = x[is_train], y[is_train]
        self.test_x, self.test_y = x[~is_train], y[~is_train]
        self._built = True

    def setup(self, stage: str) -> None:
        self._build()

    def pretrain_set(self) -> tuple[Tensor, Tensor]:
        self._build()
        return self.base_x, self.base_y

    def train_dataloader(self) -> DataLoader:
        # shuffled from torch's global generator (seeded by the run's seed_everything): a checkpoint holds its
        # state, so a run resumed at an epoch end draws the next epoch's order an uninterrupted run draws
        return DataLoader(
            TensorDataset(self.train_x, self.train_y), batch_size=self.hparams.batch_size, shuffle=True
        )

    def probe_batches(self, n_batches: int, batch_size: int, seed: int) -> list[tuple[Tensor, Tensor]]:
        """Random training batches for the planner's probe, drawn from ``seed`` (the caller's stream: probing
        draws nothing from the training loader's order)."""
        self._build()
        g = torch.Generator().manual_seed(seed)
        return [
            (self.train_x[idx], self.train_y[idx])
            for idx in (torch.randperm(len(self.train_y), generator=g)[:batch_size] for _ in range(n_batches))
        ]

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.test_x, self.test_y), batch_size=512)
