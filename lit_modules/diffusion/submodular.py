"""Facility-location coverage and the cost-aware (lazy) greedy for submodular cover under a knapsack cap.

Used by SCNS ("Submodular Concept Neuron Selection", ICML 2026, abstract: "a Facility Location-based coverage
objective ... and a cost-aware greedy rule"); the paper's body was not readable, so the exact rule is
**reconstructed** from the standard algorithms it names: facility location and (lazy) greedy (Nemhauser, Wolsey
and Fisher 1978; Minoux 1978), the cost-effective ratio greedy for submodular set cover (Wolsey 1982) and the
budgeted variant with the best-singleton safeguard (Khuller, Moss and Naor 1999; Leskovec et al. 2007, CELF).

Facility location on a ground set of n candidates with similarity ``sim`` (n × n, ``sim[u, v] ∈ [0, 1]``,
unit diagonal) and demand weights ``w`` (n, summing to 1):

    f(S) = Σ_u w_u · max_{v ∈ S} sim[u, v],     f(∅) = 0,  f(V) = 1,

monotone and submodular. With ``cur[u] = max_{v∈S} sim[u, v]`` the marginal gain of v is
``Σ_u w_u · relu(sim[u, v] − cur[u])`` (one column reduction for all v at once).

Pure functions on tensors; no model is involved.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch
from torch import Tensor


class FacilityLocation:
    """f(S) = Σ_u w_u max_{v∈S} sim[u, v] (see the module docstring); ``sim`` (n, n), ``weights`` (n,)."""

    def __init__(self, sim: Tensor, weights: Tensor):
        if sim.ndim != 2 or sim.shape[0] != sim.shape[1] or weights.shape != sim.shape[:1]:
            raise ValueError(
                f"sim must be (n, n) and weights (n,), got {tuple(sim.shape)}, {tuple(weights.shape)}"
            )
        self.sim = sim.double()
        self.weights = weights.double()
        self.n = sim.shape[0]

    def empty(self) -> Tensor:
        """``cur`` of the empty set."""
        return torch.zeros(self.n, dtype=torch.float64)

    def gains(self, cur: Tensor) -> Tensor:
        """Marginal gain of every candidate given ``cur`` (n,)."""
        return (self.weights[:, None] * (self.sim - cur[:, None]).clamp_min(0.0)).sum(0)

    def gain(self, cur: Tensor, v: int) -> float:
        return float((self.weights * (self.sim[:, v] - cur).clamp_min(0.0)).sum())

    def update(self, cur: Tensor, v: int) -> Tensor:
        return torch.maximum(cur, self.sim[:, v])

    def value_of(self, cur: Tensor) -> float:
        return float((self.weights * cur).sum())

    def value(self, S) -> float:
        """f(S) from scratch."""
        S = list(S)
        if not S:
            return 0.0
        return float((self.weights * self.sim[:, S].max(dim=1).values).sum())


@dataclass
class GreedyResult:
    selected: list[int]
    value: float  # f(selected)
    spent: float  # Σ parameter cost c_v of the selected
    stop: str  # "cover" | "budget" | "delta_min" | "exhausted"
    gains: list[float] = field(default_factory=list)  # marginal gain of each pick, in order
    singleton_swap: bool = False


def risk_costs(param_cost: Tensor, risk: Tensor, lam: float) -> Tensor:
    """cost(v) = (c_v / mean c) · (1 + λ r(v)): the multiplicative risk inflation (reconstructed, spec choice;
    the additive alternative is ``risk_mode="penalty"`` in ``cost_aware_greedy``)."""
    c = param_cost.double()
    return (c / c.mean()) * (1.0 + lam * risk.double())


def cost_aware_greedy(
    fl: FacilityLocation,
    param_cost: Tensor,
    risk: Tensor,
    lam: float = 10.0,
    tau_cov: float = 0.9,
    budget: float = float("inf"),
    delta_min: float = 1e-4,
    r_max: float = float("inf"),
    max_size: int | None = None,
    lazy: bool = True,
    singleton_safeguard: bool = False,
    risk_mode: str = "cost",
) -> GreedyResult:
    """Ratio greedy ``argmax gain(v|S) / cost(v)`` until ``f(S) ≥ tau_cov`` (cover), the spent parameter count
    reaches ``budget`` (checked before each pick, as in the spec's loop ``while f < tau and spent < B``), the best gain falls below ``delta_min``, or ``max_size`` picks.

    ``risk_mode="cost"``: cost(v) = (c_v / c̄)(1 + λ r(v)); ``"penalty"``: score = gain − λ r(v) with unit cost
    (non-monotone alternative). Neurons with ``r(v) > r_max`` are never selected. ``lazy``: a max-heap of stale
    ratios (exact, because gains only shrink and costs are fixed; ties go to the lowest index, so lazy and naive
    return the same sequence). ``singleton_safeguard``: return the best feasible singleton when it alone beats
    the greedy set (Khuller et al. 1999). All reconstructed (see the module docstring).
    """
    n = fl.n
    costs = risk_costs(param_cost, risk, lam) if risk_mode == "cost" else torch.ones(n, dtype=torch.float64)
    pen = (lam * risk.double()) if risk_mode == "penalty" else torch.zeros(n, dtype=torch.float64)
    pc = param_cost.double()
    allowed = (risk.double() <= r_max).tolist()
    cur = fl.empty()
    selected: list[int] = []
    gains: list[float] = []
    spent, stop = 0.0, "exhausted"

    def score(v: int, g: float) -> float:
        return (g - float(pen[v])) if risk_mode == "penalty" else g / float(costs[v])

    if lazy:
        g0 = fl.gains(cur)
        heap = [(-score(v, float(g0[v])) - 1e-12, v) for v in range(n) if allowed[v]]  # bounds, rounded up
        heapq.heapify(heap)
    else:
        heap = []
    chosen = set()
    while True:
        if fl.value_of(cur) >= tau_cov:
            stop = "cover"
            break
        if spent >= budget or (max_size is not None and len(selected) >= max_size):
            stop = "budget"
            break
        best, best_gain = None, 0.0
        if lazy:
            while heap:
                neg, v = heapq.heappop(heap)
                g = fl.gain(cur, v)
                s = score(v, g)
                # fresh when it still beats (or ties, with a lower index) the next stale upper bound
                if not heap or (s, -v) >= (-heap[0][0], -heap[0][1]):
                    best, best_gain = v, g
                    break
                heapq.heappush(heap, (-s, v))
        else:
            best_s = None
            for v in range(n):
                if v in chosen or not allowed[v]:
                    continue
                g = fl.gain(cur, v)
                s = score(v, g)
                if best_s is None or s > best_s:
                    best, best_s, best_gain = v, s, g
        if best is None:
            stop = "exhausted"
            break
        if best_gain < delta_min:
            stop = "delta_min"
            break
        selected.append(best)
        chosen.add(best)
        gains.append(best_gain)
        cur = fl.update(cur, best)
        spent += float(pc[best])
    result = GreedyResult(selected, fl.value_of(cur), spent, stop, gains)
    if singleton_safeguard:
        feasible = [v for v in range(n) if allowed[v] and float(pc[v]) <= budget]
        if feasible:
            single = fl.gains(fl.empty())
            v = max(feasible, key=lambda u: (float(single[u]), -u))
            if float(single[v]) > result.value:
                result = GreedyResult(
                    [v], float(single[v]), float(pc[v]), result.stop, [float(single[v])], True
                )
    return result


def plain_greedy(fl: FacilityLocation, k: int) -> list[int]:
    """Cardinality-k greedy on f (unit costs, no risk): the Nemhauser-Wolsey-Fisher (1 − 1/e) algorithm."""
    cur, out = fl.empty(), []
    for _ in range(k):
        g = [fl.gain(cur, v) if v not in out else -1.0 for v in range(fl.n)]
        v = max(range(fl.n), key=lambda u: (g[u], -u))  # ties: the lowest index
        out.append(v)
        cur = fl.update(cur, v)
    return out
