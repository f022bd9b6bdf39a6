"""LoRDO card (seeds/lordo.yaml, issue 28): what left the card as an invariant, and the mutation behind its one
remaining mechanism claim.

- The byte ledger is a count that follows from the sync rule, not a measurement of a learning effect: the quick
  config's bytes per step (LoRDO at K = 8 and K = 32 against low-rank DDP, which sends b·P every step) come out of
  the formula of spec §3.7, which ``tests/test_lordo_dist.py::test_byte_ledger_matches_the_formula`` checks
  against the measured ledger on 2 gloo ranks. The card's old ``bytes_k8`` / ``bytes_k32`` claims.
- ``qh_moves_subspace`` (the refreshed projector leaves the old subspace: similarity < 0.99 at some refresh after
  the first) stays in the card; here a LoRDO optimizer whose full-rank quasi-hyperbolic term is dropped (ω forced
  to 1 inside the step while the setting says 0.97) keeps the similarity at 1, while the real one moves it.
"""

from pathlib import Path

import pytest
import torch
import yaml

from litlab.lit_modules.lowcomm.lordo import LoRDOLMModule, LowRankSetup, TinyDecoder
from litlab.lit_modules.lowcomm.optim import LowRankQHAdamW, is_left

ROOT = Path(__file__).resolve().parent.parent
BYTES = 4  # fp32 payload


def quick_model() -> LoRDOLMModule:
    init = yaml.safe_load((ROOT / "configs" / "lordo" / "quick.yaml").read_text())["model"]["init_args"]
    return LoRDOLMModule(net=TinyDecoder(**init["net"]), low_rank=LowRankSetup(**init["low_rank"]))


def lordo_bytes_per_step(model: LoRDOLMModule, K: int, steps: int, rank: int) -> float:
    """Spec §3.7: a sync sends b[P + P_lr + 2 Σ r·d_i + 2 P_fr] (parameters, the low-rank Adam moments, the error
    feedback and the full-rank moments); once at start-up the projector all-reduce b·P_lr."""
    P = sum(p.numel() for p in model.parameters())
    low = [tuple(p.shape) for n, p in model.model.named_parameters() if n in model.low_rank_names]
    P_lr = sum(p * q for p, q in low)
    r_d = sum(rank * (q if is_left(torch.Size((p, q))) else p) for p, q in low)
    B_sync = BYTES * (P + P_lr + 2 * r_d + 2 * (P - P_lr))
    return (steps // K * B_sync + BYTES * P_lr) / steps


def test_quick_config_bytes_per_step_follow_the_sync_rule():
    """The card's recorded comm/bytes_per_step (466432 low-rank DDP, 139584 LoRDO K = 8, 36048 K = 32, every seed)
    are this formula: 0.299x and 0.077x, the card's former bytes_k8 <= 0.35 and bytes_k32 <= 0.1."""
    model = quick_model()
    P = sum(p.numel() for p in model.parameters())
    ddp = BYTES * P  # low-rank DDP all-reduces the full gradient every step
    k8, k32 = (lordo_bytes_per_step(model, K, steps=256, rank=8) for K in (8, 32))
    assert (ddp, k8, k32) == (466432, 139584.0, 36048.0)
    assert k8 / ddp == pytest.approx(0.299259, abs=1e-6) and k8 / ddp <= 0.35
    assert k32 / ddp == pytest.approx(0.077285, abs=1e-6) and k32 / ddp <= 0.1


class DroppedQH(LowRankQHAdamW):
    """The broken variant: the full-rank quasi-hyperbolic term is never applied (ω = 1 inside the step)."""

    def _low_rank_step(self, p, grad, group):
        super()._low_rank_step(p, grad, {**group, "qh_omega": 1.0})


def refresh_similarities(optimizer_class, omega: float = 0.97, K: int = 8, syncs: int = 6) -> list[float]:
    """One worker's LoRDO loop on a linear regression: K local steps, then the projector refreshed from the
    pseudo-gradient (as ``LoRDOStrategy`` does with the averaged one); the similarity of each refresh."""
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(24, 40, generator=g)
    W = torch.nn.Parameter(torch.zeros(24, 40))
    opt = optimizer_class(
        [{"params": [W], "low_rank": True}], lr=1e-2, rank=4, qh_omega=omega, weight_decay=0.0
    )

    def grad() -> torch.Tensor:
        x = torch.randn(16, 40, generator=g)
        return ((x @ W.T - x @ teacher.T).T @ x / 16).detach()

    opt.init_projectors({W: grad()})
    sims = []
    for _ in range(syncs):
        start = W.detach().clone()
        for _ in range(K):
            W.grad = grad()
            opt.step()
        sims += opt.refresh_projectors({W: start - W.detach()}, rotate=True)
    return sims


def test_dropped_qh_term_stops_subspace_exploration():
    """The card's claim reads the smallest similarity over the refreshes after the first (< 0.99 passes)."""
    real = refresh_similarities(LowRankQHAdamW)
    broken = refresh_similarities(DroppedQH)
    assert min(real[1:]) < 0.99, real
    assert min(broken[1:]) >= 0.99, broken  # the claim fails on the broken optimizer
    assert all(abs(s - 1.0) < 1e-5 for s in broken[1:])
