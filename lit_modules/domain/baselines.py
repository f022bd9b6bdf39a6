"""The standard domain-adaptation baselines' pieces, built once and reused by the family's methods.

* ``reset_bn_statistics`` + ``adabn_pass``  AdaBN (Li et al., "Revisiting Batch Normalization for Practical
  Domain Adaptation", arXiv 1603.04779): BN running statistics re-estimated on the target, as a cumulative
  average over one pass in train mode, weights untouched.
* ``ema_update``  mean teacher (Tarvainen & Valpola, arXiv 1703.01780): teacher ← α·teacher + (1 − α)·student
  for parameters, buffers (BN statistics) copied.
* ``knn_mean_target``  NRC-style neighbourhood pseudo-label for regression (Yang et al., "Exploiting the
  Intrinsic Neighborhood Structure for Source-free Domain Adaptation", arXiv 2110.04202, ported to regression):
  the plain mean of the members' predictions.
* ``shot_losses``  SHOT's information maximisation (Liang et al., arXiv 2002.08546, Eq. 2-3): mean entropy
  minus the entropy of the mean prediction.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def bn_layers(net: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    return [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def reset_bn_statistics(net: nn.Module) -> None:
    """Running mean 0, variance 1, and momentum None (cumulative average) until ``restore_bn_momentum``."""
    for bn in bn_layers(net):
        bn.reset_running_stats()
        bn._litlab_momentum = bn.momentum
        bn.momentum = None


def restore_bn_momentum(net: nn.Module) -> None:
    for bn in bn_layers(net):
        if hasattr(bn, "_litlab_momentum"):
            bn.momentum = bn._litlab_momentum
            del bn._litlab_momentum


@torch.no_grad()
def adabn_pass(net: nn.Module, forward, loader) -> None:
    """AdaBN: reset the BN statistics and re-estimate them over one pass of ``loader`` (``(x, ...)`` batches)
    with ``net`` in train mode; ``forward(x)`` runs the net. The net's mode is restored afterwards."""
    was = net.training
    reset_bn_statistics(net)
    net.train()
    for batch in loader:
        forward(batch[0])
    restore_bn_momentum(net)
    net.train(was)


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, decay: float) -> None:
    for pt, ps in zip(teacher.parameters(), student.parameters()):
        pt.mul_(decay).add_(ps.detach(), alpha=1.0 - decay)
    for bt, bs in zip(teacher.buffers(), student.buffers()):
        bt.copy_(bs)


def knn_mean_target(members: Tensor) -> Tensor:
    """(b, n, T) member predictions -> (b, T) plain mean (the kNN-mean pseudo-label)."""
    return members.mean(1)


def shot_losses(logits: Tensor, eps: float = 1e-5) -> tuple[Tensor, Tensor]:
    """SHOT's (mean per-sample entropy, entropy of the batch-mean prediction); the loss is ent − div."""
    p = logits.softmax(-1)
    ent = -(p * torch.log(p + eps)).sum(-1).mean()
    mean = p.mean(0)
    div = -(mean * torch.log(mean + eps)).sum()
    return ent, div
