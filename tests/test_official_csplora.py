"""CSPLoRA against the authors' code: golden numbers from github.com/Ming-to/CSPLoRA at commit
c0fd7fb53dd5aa94a2dc452c672e94e0c7eb1e3b, ``csplora.py`` (``CSpLoRAPlanner.plan``: the probe
``_run_adaptive_probe`` with ``_compute_probe_loss`` / ``_compute_batch_weights``, ``_normalize_scores``,
``_compute_rho_coverage`` and ``_allocate_ranks``), imported unchanged and run once on CPU (γ = 2 fixed, 6 probe
batches of 12, r_base 4, r_min 1, its default adaptive ρ) on the tiny residual MLP below, whose weights, batches
and outputs are stored in ``tests/fixtures/official/csplora/golden.pt`` (its ``-1`` ranks: modules the planner
left out, which PEFT gives its default rank r = r_base).

The released planner keeps the confidence weights in the graph, counts each module's bias in its score and plans
with the coverage rule: ``PlannerConfig(detach_confidence=False, count_bias=True, adaptive_rho=True)``; the
defaults are the paper's (constant weights, base weight only, ρ = 1), and the tests below show each switch moves
the output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from litlab.lit_modules.core.rank_plan import (
    ProbeSettings,
    RankPlan,
    classification_loss_and_confidence,
    coverage_rho,
    family_of,
    probe_saliency,
)
from litlab.lit_modules.peft.csplora import PlannerConfig

FIXTURE = Path(__file__).parent / "fixtures" / "official" / "csplora"
GOLDEN = torch.load(FIXTURE / "golden.pt")
TOL = json.loads((FIXTURE / "SOURCE.json").read_text())["tolerance"]
WIDTH, CLASSES, BLOCKS = 10, 5, 6


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.fc2(torch.tanh(self.fc1(h)))


class _Net(nn.Module):
    """The probed model: 6 residual tanh blocks (targets fc1, fc2: 12 modules in 2 families) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _raw_scores(detach_confidence: bool, count_bias: bool) -> dict[str, float]:
    net = _Net()
    net.load_state_dict(GOLDEN["state_dict"])
    batches = list(zip(GOLDEN["x"], GOLDEN["y"]))
    settings = ProbeSettings(
        gamma=float(GOLDEN["gamma"]),
        min_steps=len(batches),
        max_steps=len(batches),
        detach_confidence=detach_confidence,
        count_bias=count_bias,
    )
    modules = {n: net.get_submodule(n) for n in GOLDEN["names"]}
    scores, _ = probe_saliency(
        net, modules, batches, lambda m, b: classification_loss_and_confidence(m(b[0]), b[1]), settings
    )
    return scores


def _relative_gap(scores: dict[str, float]) -> float:
    ours = torch.tensor([scores[n] for n in GOLDEN["names"]], dtype=torch.float64)
    return float(((ours - GOLDEN["raw_scores"]).abs() / GOLDEN["raw_scores"]).max())


@pytest.fixture(scope="module")
def released_scores() -> dict[str, float]:
    return _raw_scores(detach_confidence=False, count_bias=True)


def test_probe_scores_structure_rho_and_ranks_match_the_released_planner(released_scores):
    assert _relative_gap(released_scores) < TOL
    names = GOLDEN["names"]
    plan = RankPlan(scores=released_scores, families={n: family_of(n) for n in names}, base_model="tiny")
    structure = plan.structure()
    assert max(abs(structure[n] - float(v)) for n, v in zip(names, GOLDEN["structure"])) < TOL
    assert abs(coverage_rho(structure) - float(GOLDEN["rho"])) < TOL
    r_base, r_min = int(GOLDEN["r_base"]), int(GOLDEN["r_min"])
    ranks = plan.ranks(r_base, r_min, 4 * r_base, adaptive_rho=True)
    expected = [r_base if r < 0 else r for r in GOLDEN["ranks"].tolist()]
    assert [ranks[n] for n in names] == expected
    planned = [r for r in GOLDEN["ranks"].tolist() if r > 0]
    assert sum(planned) == len(names) * r_base  # the planned modules alone spend R_tot


def test_detaching_the_confidence_weights_moves_the_scores(released_scores):
    """The paper's constant weights (our default) against the released graph through softmax(γ d): > 1 %."""
    assert _relative_gap(_raw_scores(detach_confidence=True, count_bias=True)) > 1e-2


def test_leaving_out_the_bias_moves_the_scores():
    """Scoring the base weight only (our default) against the released weight + bias score: lower everywhere."""
    weight_only = _raw_scores(detach_confidence=False, count_bias=False)
    assert all(weight_only[n] < float(v) for n, v in zip(GOLDEN["names"], GOLDEN["raw_scores"]))


def test_fixed_rho_spends_the_budget_and_the_defaults_are_the_papers(released_scores):
    """ρ = 1 plans every module within R_tot; adaptive ρ leaves modules out at r_base and spends more."""
    names = GOLDEN["names"]
    plan = RankPlan(scores=released_scores, families={n: family_of(n) for n in names}, base_model="tiny")
    r_base = int(GOLDEN["r_base"])
    fixed = plan.ranks(r_base, 1, 4 * r_base)
    adaptive = plan.ranks(r_base, 1, 4 * r_base, adaptive_rho=True)
    assert sum(fixed.values()) == len(names) * r_base < sum(adaptive.values())
    assert 0.6 <= coverage_rho(plan.structure()) < 1.0
    assert coverage_rho({n: 1.0 for n in names}) == pytest.approx(1.0)
    defaults = PlannerConfig()
    assert (defaults.detach_confidence, defaults.count_bias, defaults.adaptive_rho) == (True, False, False)
