"""A card's claims, judged on per-seed numbers: the statistics, the falsifiability check, the status.

Three kinds of claim (``litlab.cards`` parses them):

- ``better``: the method improves on every compared run by more than ``margin``. ``d`` is the improvement
  (oriented by the method run's ``mode``: for ``min`` metrics, baseline mean minus method mean), with a Welch
  95 % interval over seeds; the claim holds only when the interval's low end exceeds the margin.
- ``parity``: the method is no worse than every compared run by more than ``margin``: the interval's low end
  exceeds ``-margin``. Any run passes a parity test against itself, so a parity claim names ``controls``:
  runs that must fail the same test, or the claim cannot tell the method from them.
- ``mechanism``: an invariant or a ledger count (``value op target``) on every seed of a run or on a number a
  report hook derived; not a comparison with a baseline.

Falsifiability (``refutations``): every comparative claim is re-evaluated with the method's per-seed values
replaced by each compared run's (and each control's); a claim that still holds cannot tell the method from
that run, and the card is refused.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from litlab.cards import Card, Claim

OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}
COMPARATIVE = ("better", "parity")


@dataclass(frozen=True)
class Comparison:
    """The method's improvement over one compared run, over seeds."""

    against: str
    method_mean: float
    method_std: float
    against_mean: float
    against_std: float
    n_method: int
    n_against: int
    diff: float  # improvement, > 0 when the method is better
    ci_low: float
    ci_high: float
    margin: float  # in metric units (a relative margin resolved against this run's mean)


@dataclass
class ClaimResult:
    id: str
    kind: str
    verdict: str  # "pass" | "fail" | "unrun" | "skipped"
    status: str  # "reproduced" | "not reproduced" | "mechanism" | "mechanism failed" | "unrun" | "skipped"
    paper: str = ""
    note: str = ""
    reason: str = ""
    comparisons: tuple[Comparison, ...] = ()
    value: float | list[float] | None = None  # mechanism claims

    @property
    def holds(self) -> bool | None:
        return {"pass": True, "fail": False}.get(self.verdict)

    def to_json(self) -> dict:
        out = asdict(self)
        out["comparisons"] = [asdict(c) for c in self.comparisons]
        return out


def welch_interval(method: Sequence[float], against: Sequence[float], sign: float, level: float = 0.95):
    """``sign * (mean(method) - mean(against))`` with its Welch interval; infinite with fewer than 2 seeds."""
    from scipy import stats

    diff = sign * (statistics.fmean(method) - statistics.fmean(against))
    if len(method) < 2 or len(against) < 2:
        return diff, -math.inf, math.inf
    vm, va = statistics.variance(method) / len(method), statistics.variance(against) / len(against)
    se = math.sqrt(vm + va)
    if se == 0.0:  # deterministic on both sides (a byte ledger): the difference is exact
        return diff, diff, diff
    dof = (vm + va) ** 2 / (vm**2 / (len(method) - 1) + va**2 / (len(against) - 1))
    half = float(stats.t.ppf(0.5 + level / 2, dof)) * se
    return diff, diff - half, diff + half


def compare(claim: Claim, method: Sequence[float], against_name: str, against: Sequence[float], mode: str):
    sign = 1.0 if mode == "max" else -1.0
    diff, low, high = welch_interval(method, against, sign)
    margin = claim.margin if claim.margin_rel is None else claim.margin_rel * abs(statistics.fmean(against))
    return Comparison(
        against=against_name,
        method_mean=statistics.fmean(method),
        method_std=statistics.stdev(method) if len(method) > 1 else 0.0,
        against_mean=statistics.fmean(against),
        against_std=statistics.stdev(against) if len(against) > 1 else 0.0,
        n_method=len(method),
        n_against=len(against),
        diff=diff,
        ci_low=low,
        ci_high=high,
        margin=margin,
    )


def _comparison_holds(kind: str, c: Comparison) -> bool:
    return c.ci_low > c.margin if kind == "better" else c.ci_low > -c.margin


def evaluate_claim(
    card: Card,
    claim: Claim,
    values: Mapping[str, Sequence[float]],
    derived: Mapping[str, float],
    has_cuda: bool = False,
) -> ClaimResult:
    """Judge one claim on per-seed ``values`` (run name -> values) and report-hook ``derived`` numbers."""
    base = ClaimResult(claim.id, claim.kind, "skipped", "skipped", paper=claim.paper, note=claim.note)
    if claim.requires == "cuda" and not has_cuda:
        base.verdict, base.status, base.reason = "unrun", "unrun", "needs a GPU (requires: cuda)"
        return base
    missing = [r for r in claim.runs() if r not in values]
    if claim.kind == "mechanism" and claim.value.startswith("derived."):
        missing = [] if claim.value.removeprefix("derived.") in derived else [claim.value]
    if missing:
        base.reason = f"not measured in this invocation: {', '.join(missing)}"
        return base
    if claim.kind == "mechanism":
        if claim.value.startswith("derived."):
            observed: float | list[float] = float(derived[claim.value.removeprefix("derived.")])
            ok = OPS[claim.op](observed, claim.target)
        else:
            observed = [float(v) for v in values[claim.value]]
            ok = all(OPS[claim.op](v, claim.target) for v in observed)
        base.value = observed
        base.verdict = "pass" if ok else "fail"
        base.status = "mechanism" if ok else "mechanism failed"
        return base
    mode = card.runs[claim.method].mode or card.metric.mode
    comps = tuple(compare(claim, values[claim.method], a, values[a], mode) for a in claim.against)
    ok = all(_comparison_holds(claim.kind, c) for c in comps)
    base.comparisons = comps
    base.verdict = "pass" if ok else "fail"
    base.status = "reproduced" if ok else "not reproduced"
    if not ok:
        weak = [c for c in comps if not _comparison_holds(claim.kind, c)]
        base.reason = "; ".join(
            f"vs {c.against}: d = {c.diff:.4g}, 95% CI [{c.ci_low:.4g}, {c.ci_high:.4g}] does not clear "
            f"{'margin' if claim.kind == 'better' else '-margin'} {c.margin if claim.kind == 'better' else -c.margin:.4g}"
            for c in weak
        )
    return base


def refutations(card: Card, values: Mapping[str, Sequence[float]]) -> list[str]:
    """Comparative claims that still hold when the method's numbers are replaced by a compared run's."""
    problems = []
    for claim in card.claims:
        if claim.kind not in COMPARATIVE or any(r not in values for r in claim.runs()):
            continue
        stand_ins = claim.against if claim.kind == "better" else claim.controls
        for stand_in in stand_ins:
            swapped = {**values, claim.method: values[stand_in]}
            if evaluate_claim(card, claim, swapped, {}, has_cuda=True).holds:
                problems.append(
                    f"claim {claim.id!r} cannot tell {claim.method} from {stand_in}: it still holds with "
                    f"{stand_in}'s per-seed values in {claim.method}'s place"
                )
    return problems


def card_status(verdicts: Iterable[tuple[str, str]]) -> str:
    """reproduced | partial | not reproduced | mechanism only | not run, from each claim's (kind, verdict): of
    fresh results or of a card's recorded block alike."""
    verdicts = [(kind, verdict) for kind, verdict in verdicts if verdict in ("pass", "fail")]
    judged = [verdict == "pass" for kind, verdict in verdicts if kind in COMPARATIVE]
    mechanisms = [verdict == "pass" for kind, verdict in verdicts if kind == "mechanism"]
    if not judged:
        if mechanisms:
            return "mechanism only" if all(mechanisms) else "not reproduced"
        return "not run"
    passed = sum(judged)
    if passed == len(judged) and all(mechanisms):
        return "reproduced"
    return "not reproduced" if passed == 0 else "partial"


def regressions(card: Card, scale: str, results: Sequence[ClaimResult]) -> list[str]:
    """Claims the card recorded as passing at this scale that fail now: what fails CI."""
    recorded = card.recorded if card.recorded.get("scale") == scale else {}
    before = recorded.get("claims") or {}
    return [
        f"claim {r.id!r} was recorded as passing and fails now ({r.reason or r.status})"
        for r in results
        if r.verdict == "fail" and (before.get(r.id) or {}).get("verdict") == "pass"
    ]


def recorded_values(card: Card, scale: str) -> dict[str, dict[int, float]]:
    """Run name -> {seed: value} from the card's ``recorded:`` block at ``scale``."""
    rec = card.recorded
    if rec.get("scale") != scale:
        return {}
    out = {}
    for name, entry in (rec.get("results") or {}).items():
        seeds = entry.get("seeds") or rec.get("seeds") or []
        out[name] = {int(s): float(v) for s, v in zip(seeds, entry.get("values") or [])}
    return out


def mismatches(card: Card, scale: str, measured: Mapping[str, Mapping[int, float]]) -> list[str]:
    """Per-seed differences from the recorded numbers beyond the card's determinism tolerance."""
    atol, rtol = card.determinism.atol, card.determinism.rtol
    out = []
    for name, per_seed in recorded_values(card, scale).items():
        for seed, value in measured.get(name, {}).items():
            if seed in per_seed and not math.isclose(value, per_seed[seed], abs_tol=atol, rel_tol=rtol):
                out.append(f"{name} seed {seed}: measured {value:.6g}, recorded {per_seed[seed]:.6g}")
    return out
