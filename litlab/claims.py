"""A card's claims, judged on per-seed numbers: the statistics, the falsifiability check, the card's status.

Three kinds of claim (``litlab.cards`` parses them):

- ``better``: the method improves on every compared run by more than ``margin``. ``d`` is the improvement
  (oriented by the metric's mode: for ``min`` metrics, baseline mean minus method mean) with a 95 % interval
  over seeds; the claim holds only when the interval's low end exceeds the margin.
- ``parity``: the method is no worse than every compared run by more than ``margin``: the interval's low end
  exceeds ``-margin``.
- ``mechanism``: ``value op target`` on every seed of a run's metric (or on a number a report hook derived),
  where the value measures the paper's mechanism and a plausible wrong implementation (``fails_if``) fails it.
  Properties that hold by construction are tests in ``tests/``, not claims.

A comparative claim with ``censored: true`` reads a metric whose non-finite values mean "not reached" (say the
length of the shortest program that reaches a target, none of those tried did): such a value is never averaged.
Where every seed of both sides reached, the values are compared as above; otherwise the comparison is between the
fractions of seeds that reach (``Comparison.reach``: the interval is over the per-seed reach indicators, margin 0,
in fractions, so it has no minimal detectable effect in the metric's units).

Statistics are fixed by the card's design, not per claim: with ``pairing: seed`` (the runs of one card seed
share data, base model and initialisation) every interval is the paired t interval over the per-seed
differences; otherwise Welch's.

The card's status is its headline claims' verdict (``card_status``):

- ``reproduced``: every headline claim passes, and the experiment is sensitive;
- ``not reproduced``: a headline claim fails, and the experiment is sensitive;
- ``inconclusive``: a positive control fails (or none ran), or a headline's minimal detectable effect
  (the 95 % interval's half-width plus the margin; for a parity claim, whose margin is an equivalence bound,
  the half-width alone) is larger than the paper's effect, or its interval is wider than the paper's effect
  with fewer than 5 seeds - whatever the method did;
- ``not testable at this scale``: no headline claim is judged at this scale (``scales`` / ``requires``);
  ``not run`` when this invocation left out the runs a headline reads (``--only``).

Secondary claims are reported with their verdicts and never set the status.

Falsifiability (``refutations``): every passing comparative claim that is not a positive control is
re-evaluated with the method's per-seed values replaced by each ``baseline`` and ``floor`` run of the card that
has values of the same metric in the method's ``setting`` (besides the runs the claim compares with, except that in a parity claim with several references each
baseline or floor among them is compared with the others); a claim that still holds cannot tell
the method from that run, and the card is refused. ``null_table`` lists every substitution
(``litlab repro <slug> --null``).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from litlab.cards import MIN_SEEDS_WIDE, STAND_IN_ROLES, Card, Claim, Ref, load_card
from litlab.lit_modules.core.errors import CardError

OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}
RECORDED_DECIMALS = 6  # `--record` rounds every number to this many decimals
STATUSES = ("reproduced", "not reproduced", "inconclusive", "not testable at this scale")
# run -> metric -> seed -> value: what a reproduction measured, or what a card recorded
Values = Mapping[str, Mapping[str, Mapping[int, float]]]


# The effect of the paper's size in a censored claim's reach fractions: the method reaches the target on every seed
# where the other side reaches it on none (a paper effect in the metric's units cannot be read off fractions).
REACH_PAPER_EFFECT = 1.0


@dataclass(frozen=True)
class Comparison:
    """The method's improvement over one compared run, over seeds."""

    against: str  # "run:metric"
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
    paired: bool = False  # the interval is over per-seed differences (n = the seeds both sides have)
    n_pairs: int = 0
    parity: bool = False  # a parity comparison: the margin is the equivalence bound, not an effect to clear
    # a censored claim with a seed not reached: means, diff and interval are fractions of seeds that reach
    reach: bool = False

    @property
    def half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2

    @property
    def mde(self) -> float:
        """The minimal detectable effect at this n: the interval's half-width plus the margin a ``better``
        claim must clear; for ``parity``, the half-width alone (the smallest deficit the interval resolves,
        however loose the equivalence bound)."""
        return self.half_width + (0.0 if self.parity else self.margin)

    @property
    def n(self) -> int:
        return self.n_pairs if self.paired else min(self.n_method, self.n_against)


@dataclass
class ClaimResult:
    id: str
    kind: str
    verdict: str  # "pass" | "fail" | "unrun" | "skipped"
    paper: str = ""
    note: str = ""
    reason: str = ""
    headline: bool = False
    control: bool = False
    comparisons: tuple[Comparison, ...] = ()
    value: float | list[float] | None = None  # mechanism claims
    paper_effect: float | None = None  # headline: in metric units (a relative one resolved)
    requires: str = ""
    fragile: bool = False  # the verdict flips within the card's determinism tolerance (``mark_fragile``)

    @property
    def holds(self) -> bool | None:
        return {"pass": True, "fail": False}.get(self.verdict)

    @property
    def judged(self) -> bool:
        return self.verdict in ("pass", "fail")

    @property
    def mde(self) -> float | None:
        """The largest comparison's MDE in the metric's units (None where every comparison is of reach fractions)."""
        return max((c.mde for c in self.comparisons if not c.reach), default=None)

    @property
    def n(self) -> int | None:
        return min((c.n for c in self.comparisons), default=None)

    @property
    def sensitivity(self) -> str:
        """Why a headline cannot decide (empty when it can): its MDE or its seeds against the paper's effect."""
        if not self.headline:
            return ""
        for c in self.comparisons:
            if c.reach and c.method_mean == 0 and c.against_mean == 0:
                return f"neither side reaches the target on any seed (vs {c.against}): nothing to compare"
            if c.reach and c.mde > REACH_PAPER_EFFECT:
                return (
                    f"the reach fractions' interval half-width {c.mde:.4g} > {REACH_PAPER_EFFECT:g} (vs "
                    f"{c.against}): it cannot tell every seed reaching from none"
                )
        mde = self.mde
        if mde is None or self.paper_effect is None:
            return ""
        if not math.isfinite(mde):
            return "fewer than 2 seeds: no interval"
        if mde > self.paper_effect:
            return f"minimal detectable effect {mde:.4g} > paper effect {self.paper_effect:.4g}"
        wide = [
            c
            for c in self.comparisons
            if not c.reach and c.ci_high - c.ci_low > self.paper_effect and c.n < MIN_SEEDS_WIDE
        ]
        if wide:
            return (
                f"interval {wide[0].ci_high - wide[0].ci_low:.4g} wide > paper effect {self.paper_effect:.4g} "
                f"at n = {wide[0].n} (< {MIN_SEEDS_WIDE} seeds)"
            )
        return ""

    def to_json(self) -> dict:
        out = asdict(self)
        out["comparisons"] = [{**asdict(c), "mde": c.mde} for c in self.comparisons]
        out["mde"], out["sensitivity"] = self.mde, self.sensitivity
        return out


def seed_std(xs: Iterable[float]) -> float:
    """The standard deviation over seeds: 0 for one seed, NaN where a value is non-finite (a censored seed)."""
    xs = list(xs)
    if len(xs) < 2:
        return 0.0
    return statistics.stdev(xs) if all(math.isfinite(x) for x in xs) else math.nan


def welch_interval(method: list[float], against: list[float], sign: float, level: float = 0.95):
    """``sign * (mean(method) - mean(against))`` with its Welch interval; infinite with fewer than 2 seeds."""
    from scipy.special import stdtrit  # deferred: scipy costs a second that `repro --list` never needs

    diff = sign * (statistics.fmean(method) - statistics.fmean(against))
    if len(method) < 2 or len(against) < 2:
        return diff, -math.inf, math.inf
    vm, va = statistics.variance(method) / len(method), statistics.variance(against) / len(against)
    se = math.sqrt(vm + va)
    if se == 0.0:  # deterministic on both sides (a byte ledger): the difference is exact
        return diff, diff, diff
    dof = (vm + va) ** 2 / (vm**2 / (len(method) - 1) + va**2 / (len(against) - 1))
    half = float(stdtrit(dof, 0.5 + level / 2)) * se
    return diff, diff - half, diff + half


def paired_interval(differences: list[float], level: float = 0.95):
    """The mean of per-seed differences with its t interval (n - 1 degrees of freedom)."""
    from scipy.special import stdtrit  # deferred: scipy costs a second that `repro --list` never needs

    diff = statistics.fmean(differences)
    if len(differences) < 2:
        return diff, -math.inf, math.inf
    se = statistics.stdev(differences) / math.sqrt(len(differences))
    if se == 0.0:
        return diff, diff, diff
    half = float(stdtrit(len(differences) - 1, 0.5 + level / 2)) * se
    return diff, diff - half, diff + half


def compare(
    card: Card, claim: Claim, method: Mapping[int, float], against_ref: Ref, against: Mapping[int, float]
) -> Comparison:
    assert claim.method is not None
    sign = 1.0 if card.mode(claim.method.metric) == "max" else -1.0
    reach = not all(math.isfinite(v) for v in (*method.values(), *against.values()))
    if reach:
        if not claim.censored:
            raise CardError(
                f"claim {claim.id!r}: {claim.method} or {against_ref} has a non-finite value "
                f"({list(method.values())} vs {list(against.values())}); a metric that is infinite when a target "
                "is not reached needs 'censored: true'"
            )
        if claim.kind == "parity":
            raise CardError(f"claim {claim.id!r}: a censored parity claim has a seed not reached")
        # a censored seed is never averaged: compare the fractions of seeds that reach (1 = finite), more is better
        method = {s: float(math.isfinite(v)) for s, v in method.items()}
        against = {s: float(math.isfinite(v)) for s, v in against.items()}
        sign = 1.0
    xs, ys = list(method.values()), list(against.values())
    paired = card.pairing == "seed"
    common = [s for s in method if s in against]
    if paired:
        diff, low, high = paired_interval([sign * (method[s] - against[s]) for s in common])
    else:
        diff, low, high = welch_interval(xs, ys, sign)
    if reach:
        margin = 0.0
    else:
        margin = claim.margin if claim.margin_rel is None else claim.margin_rel * abs(statistics.fmean(ys))
    return Comparison(
        against=str(against_ref),
        method_mean=statistics.fmean(xs),
        method_std=statistics.stdev(xs) if len(xs) > 1 else 0.0,
        against_mean=statistics.fmean(ys),
        against_std=statistics.stdev(ys) if len(ys) > 1 else 0.0,
        n_method=len(xs),
        n_against=len(ys),
        diff=diff,
        ci_low=low,
        ci_high=high,
        margin=margin,
        paired=paired,
        n_pairs=len(common),
        parity=claim.kind == "parity",
        reach=reach,
    )


def _comparison_holds(kind: str, c: Comparison) -> bool:
    return c.ci_low > c.margin if kind == "better" else c.ci_low > -c.margin


def _lookup(values: Values, ref: Ref) -> Mapping[int, float] | None:
    found = (values.get(ref.run) or {}).get(ref.metric)
    return found or None


def evaluate_claim(
    card: Card,
    claim: Claim,
    values: Values,
    derived: Mapping[str, float],
    has_cuda: bool = False,
    method_values: Mapping[int, float] | None = None,
) -> ClaimResult:
    """Judge one claim on per-seed ``values`` and report-hook ``derived`` numbers (``method_values`` stands in
    for the method's own, for the falsifiability check)."""
    base = ClaimResult(
        claim.id,
        claim.kind,
        "skipped",
        paper=claim.paper,
        note=claim.note,
        headline=claim.headline,
        control=claim.control,
        requires=claim.requires,
    )
    if claim.requires == "cuda" and not has_cuda:
        base.verdict, base.reason = "unrun", "needs a GPU (requires: cuda)"
        return base
    missing = [str(r) for r in claim.refs() if _lookup(values, r) is None]
    if claim.kind == "mechanism" and claim.value.startswith("derived."):
        missing = [] if claim.value.removeprefix("derived.") in derived else [claim.value]
    if claim.comparative and method_values is not None:
        missing = [m for m in missing if m != str(claim.method)]
    if missing:
        base.reason = f"not measured in this invocation: {', '.join(missing)}"
        return base
    if claim.kind == "mechanism":
        # judged at the precision the card records (6 decimals), so that a fresh run and its recording agree
        # on a value at the target (a Spearman of exactly 0.8 computed as 0.79999999)
        if claim.value.startswith("derived."):
            observed: float | list[float] = round(
                float(derived[claim.value.removeprefix("derived.")]), RECORDED_DECIMALS
            )
            ok = OPS[claim.op](observed, claim.target)
        else:
            assert claim.value_ref is not None
            found = _lookup(values, claim.value_ref)
            assert found is not None  # `missing` above returned otherwise
            observed = [round(float(v), RECORDED_DECIMALS) for v in found.values()]
            ok = all(OPS[claim.op](v, claim.target) for v in observed)
        base.value = observed
        base.verdict = "pass" if ok else "fail"
        if not ok:
            base.reason = f"{claim.value} {claim.op} {claim.target:g} does not hold"
        return base
    assert claim.method is not None
    method = method_values if method_values is not None else _lookup(values, claim.method)
    assert method is not None  # `missing` above returned otherwise
    comps = tuple(compare(card, claim, method, a, _lookup(values, a) or {}) for a in claim.against)
    ok = all(_comparison_holds(claim.kind, c) for c in comps)
    base.comparisons = comps
    base.verdict = "pass" if ok else "fail"
    if claim.headline:
        effects = [
            claim.paper_effect
            if claim.paper_effect is not None
            else (claim.paper_effect_rel or 0.0) * abs(c.against_mean)
            for c in comps
        ]
        base.paper_effect = min(effects, default=None)
    if not ok:
        weak = [c for c in comps if not _comparison_holds(claim.kind, c)]
        base.reason = "; ".join(
            f"vs {c.against}: "
            + (f"reached on {c.method_mean:.0%} vs {c.against_mean:.0%} of seeds, " if c.reach else "")
            + f"d = {c.diff:.4g}, 95% CI [{c.ci_low:.4g}, {c.ci_high:.4g}] does not clear "
            f"{'margin' if claim.kind == 'better' else '-margin'} {c.margin if claim.kind == 'better' else -c.margin:.4g}"
            for c in weak
        )
    return base


def stand_ins(card: Card, claim: Claim, values: Values) -> list[Ref]:
    """The runs whose numbers replace the method's in the falsifiability check: every baseline and floor run
    of the method's setting with values of the method's metric, and for ``same_units`` claims the compared
    sides too."""
    assert claim.method is not None
    compared = {a.run for a in claim.against}
    setting = card.runs[claim.method.run].setting
    out = [
        Ref(name, claim.method.metric)
        for name, spec in card.runs.items()
        if spec.role in STAND_IN_ROLES
        and spec.setting == setting
        and name != claim.method.run
        and name not in compared
        and _lookup(values, Ref(name, claim.method.metric)) is not None
    ]
    if claim.same_units:
        out += [a for a in claim.against if a.metric != claim.method.metric]
    if claim.kind == "parity" and len(claim.against) > 1:
        # being at parity with a baseline says nothing of the method when that baseline is at parity with the
        # other references too: listing it among them must not hide it
        out += [a for a in claim.against if card.runs[a.run].role in STAND_IN_ROLES]
    return out


def _without(claim: Claim, ref: Ref) -> Claim:
    """The claim with a stand-in taken out of its compared runs (a run compared with itself proves nothing)."""
    return dataclasses.replace(claim, against=tuple(a for a in claim.against if a != ref))


def null_table(card: Card, values: Values) -> list[tuple[Claim, ClaimResult, Ref, bool]]:
    """Every comparative claim (controls aside) with each stand-in: (claim, its verdict, stand-in, still holds)."""
    rows = []
    for claim in card.claims:
        if not claim.comparative or claim.control:
            continue
        actual = evaluate_claim(card, claim, values, {}, has_cuda=True)
        if not actual.judged:
            continue
        for ref in stand_ins(card, claim, values):
            checked = _without(claim, ref) if claim.kind == "parity" and ref in claim.against else claim
            swapped = evaluate_claim(
                card, checked, values, {}, has_cuda=True, method_values=_lookup(values, ref)
            )
            rows.append((claim, actual, ref, bool(swapped.holds)))
    return rows


def refutations(card: Card, values: Values) -> list[str]:
    """Passing claims that still hold with a baseline's or floor's numbers in the method's place."""
    problems = []
    for claim, actual, ref, holds in null_table(card, values):
        assert claim.method is not None  # null_table lists comparative claims only
        if actual.holds and holds:
            problems.append(
                f"claim {claim.id!r} cannot tell {claim.method} from {ref}: it still holds with {ref.run}'s "
                f"per-seed values in {claim.method.run}'s place (add {ref.run} to its 'against', with an amendment)"
            )
    for claim in card.claims:
        if claim.kind == "parity" and not claim.control and claim.method is not None:
            actual = evaluate_claim(card, claim, values, {}, has_cuda=True)
            if actual.holds and not stand_ins(card, claim, values):
                problems.append(
                    f"parity claim {claim.id!r} passes and no baseline or floor run with values of "
                    f"{claim.method.metric} could fail it: parity with a compared run says nothing alone"
                )
    return problems


def card_status(results: Iterable[ClaimResult]) -> tuple[str, str]:
    """(status, reason) from the claims' results: the headline decides, controls show the experiment can see."""
    results = list(results)
    headlines = [r for r in results if r.headline and r.judged]
    controls = [r for r in results if r.control]
    if not headlines:
        listed = [r for r in results if r.headline]
        if any(r.verdict == "skipped" for r in listed):  # a partial invocation (--only) did not run them
            return "not run", "; ".join(f"{r.id}: {r.reason}" for r in listed if r.verdict == "skipped")
        why = "; ".join(f"{r.id}: {r.reason or r.requires}" for r in listed)
        return "not testable at this scale", why or "no headline claim at this scale"
    failed_controls = [r for r in controls if r.verdict != "pass"]
    if not controls:
        return "inconclusive", "no positive control at this scale"
    if failed_controls:
        return "inconclusive", "positive control " + "; ".join(
            f"{r.id} {r.verdict}" + (f" ({r.reason})" if r.reason else "") for r in failed_controls
        )
    blind = [r for r in headlines if r.sensitivity]
    failed = [r for r in headlines if r.verdict == "fail" and not r.sensitivity]
    if failed:
        return "not reproduced", "; ".join(f"{r.id}: {r.reason}" for r in failed)
    if blind:
        return "inconclusive", "; ".join(f"{r.id} ({r.verdict}): {r.sensitivity}" for r in blind)
    return "reproduced", "every headline claim passes; controls pass; " + "; ".join(
        f"{r.id}: MDE {r.mde:.4g} <= paper effect {r.paper_effect:.4g}"
        if r.mde is not None
        else f"{r.id}: reached on more seeds (censored)"
        for r in headlines
    )


def regressions(card: Card, scale: str, results: list[ClaimResult]) -> list[str]:
    """Claims the card recorded as passing at this scale that fail now: what fails CI."""
    recorded = card.recorded if card.recorded.get("scale") == scale else {}
    before = recorded.get("claims") or {}
    return [
        f"claim {r.id!r} was recorded as passing and fails now ({r.reason or r.verdict})"
        for r in results
        if r.verdict == "fail" and (before.get(r.id) or {}).get("verdict") == "pass"
    ]


def recorded_values(card: Card, scale: str) -> dict[str, dict[str, dict[int, float]]]:
    """Run -> metric -> {seed: value} from the card's ``recorded:`` block at ``scale``."""
    rec = card.recorded
    if rec.get("scale") != scale:
        return {}
    out: dict[str, dict[str, dict[int, float]]] = {}
    for name, entry in (rec.get("results") or {}).items():
        if "metrics" not in entry:
            raise CardError(
                f"{card.path}: recorded.results.{name} has no 'metrics:' (a recording older than roles and "
                "headline claims): record the card again with `litlab repro <slug> --record`"
            )
        seeds = entry.get("seeds") or rec.get("seeds") or []
        out[name] = {
            metric: {int(s): float(v) for s, v in zip(seeds, m.get("values") or [])}
            for metric, m in entry["metrics"].items()
        }
    return out


def judge_recorded(card: Card, scale: str | None = None, has_cuda: bool = False) -> list[ClaimResult]:
    """Every claim at the recorded scale, judged on the card's recorded numbers (no run)."""
    scale = scale or str(card.recorded.get("scale", "quick"))
    values = recorded_values(card, scale)
    derived = {k: float(v) for k, v in (card.recorded.get("derived") or {}).items()}
    results = [evaluate_claim(card, c, values, derived, has_cuda=has_cuda) for c in card.claims_for(scale)]
    mark_fragile(card, results, values, derived)
    return results


def mismatches(card: Card, scale: str, measured: Values) -> list[str]:
    """Per-seed differences from the recorded numbers beyond the card's determinism tolerance."""
    tol = card.determinism
    out = []
    for name, by_metric in recorded_values(card, scale).items():
        for metric, per_seed in by_metric.items():
            if metric in tol.wall_clock:
                continue
            for seed, value in ((measured.get(name) or {}).get(metric) or {}).items():
                if seed in per_seed and not tol.matches(metric, value, per_seed[seed]):
                    out.append(
                        f"{name} {metric} seed {seed}: measured {value:.6g}, recorded {per_seed[seed]:.6g}"
                    )
    return out


@dataclass(frozen=True)
class Drift:
    """How far one run's re-measured numbers landed from its recorded ones (every metric and seed compared)."""

    run: str
    compared: int  # values compared (metrics x seeds)
    max_abs: float  # the largest |measured - recorded|
    beyond: int  # values outside the card's determinism tolerance

    @property
    def within(self) -> bool:
        return self.beyond == 0


def drift(card: Card, scale: str, measured: Values) -> list[Drift]:
    """Per run, the re-measured numbers against the recorded ones, under the card's determinism tolerance
    (``--check-recorded`` prints it: a user tells machine drift from a regression)."""
    tol = card.determinism
    out = []
    for name, by_metric in recorded_values(card, scale).items():
        pairs = [
            (metric, value, per_seed[seed])
            for metric, per_seed in by_metric.items()
            if metric not in tol.wall_clock
            for seed, value in ((measured.get(name) or {}).get(metric) or {}).items()
            if seed in per_seed
        ]
        if pairs:
            out.append(
                Drift(
                    run=name,
                    compared=len(pairs),
                    max_abs=max(0.0 if a == b else abs(a - b) for _, a, b in pairs),  # inf == inf: 0
                    beyond=sum(not tol.matches(m, a, b) for m, a, b in pairs),
                )
            )
    return out


def _shifted(values: Values, shifts: Mapping[Ref, float], rtol: float) -> dict:
    """``values`` with every seed's value of each ``Ref`` moved by its shift (plus ``rtol`` of its size)."""
    out = {run: {m: dict(per_seed) for m, per_seed in by_metric.items()} for run, by_metric in values.items()}
    for ref, shift in shifts.items():
        per_seed = out.get(ref.run, {}).get(ref.metric)
        if per_seed:
            for seed, v in per_seed.items():
                per_seed[seed] = v + shift + math.copysign(rtol * abs(v), shift)
    return out


def fragile(
    card: Card, claim: Claim, values: Values, derived: Mapping[str, float], result: ClaimResult
) -> bool:
    """Whether ``claim``'s verdict flips when every number moves within the card's determinism tolerance in
    the direction that hurts it (the method's values by the tolerance one way, the compared runs' the other;
    a mechanism value towards or away from its target). Such a verdict depends on the machine."""
    if not result.judged:
        return False
    tol = card.determinism
    rtol = tol.rtol
    for sign in (1.0, -1.0):
        if claim.kind == "mechanism":
            if claim.value.startswith("derived."):
                key = claim.value.removeprefix("derived.")
                # a derived number is no metric: metric_atol cannot name it, the card-wide atol applies
                moved_derived = {**derived, key: derived[key] + sign * (tol.atol + rtol * abs(derived[key]))}
                moved = evaluate_claim(card, claim, values, moved_derived)
            else:
                assert claim.value_ref is not None
                shift = sign * tol.atol_for(claim.value_ref.metric)
                moved = evaluate_claim(card, claim, _shifted(values, {claim.value_ref: shift}, rtol), derived)
        else:
            assert claim.method is not None
            up = 1.0 if card.mode(claim.method.metric) == "max" else -1.0
            shifts = {claim.method: sign * up * tol.atol_for(claim.method.metric)}
            for ref in claim.against:
                down = 1.0 if card.mode(ref.metric) == "max" else -1.0
                shifts[ref] = -sign * down * tol.atol_for(ref.metric)
            moved = evaluate_claim(card, claim, _shifted(values, shifts, rtol), derived)
        if moved.verdict != result.verdict:
            return True
    return False


def mark_fragile(
    card: Card, results: list[ClaimResult], values: Values, derived: Mapping[str, float]
) -> None:
    """Set ``fragile`` on every judged claim whose verdict a drift within the tolerance would flip."""
    claims = {c.id: c for c in card.claims}
    for r in results:
        r.fragile = fragile(card, claims[r.id], values, derived, r)


def card_verdict(card: Card, results: list[ClaimResult], scale: str) -> tuple[str, str]:
    """``card_status``, with the reason naming the headline claims another scale or a GPU would judge."""
    status, reason = card_status(results)
    shaky = [r.id for r in results if r.headline and r.fragile]
    if shaky:
        reason += (
            f"; fragile: {', '.join(shaky)} flips within the card's determinism tolerance "
            f"({card.determinism.describe()}), so another machine may judge it otherwise"
        )
    if status == "not testable at this scale":
        elsewhere = [c for c in card.headlines if scale not in c.scales]
        reason = "; ".join(
            [reason] * any(r.headline for r in results)
            + [
                f"{c.id} is judged at scale {'/'.join(c.scales)}"
                + (f" (requires {c.requires})" if c.requires else "")
                for c in elsewhere
            ]
        )
    return status, reason


def load_checked_card(
    path: str | Path, check_falsifiable: bool = True, check_preregistration: bool = True
) -> Card:
    """``litlab.cards.load_card``, and with ``check_falsifiable`` no passing claim of the card's recorded
    numbers may survive the substitution of a baseline or floor run (``refutations``)."""
    card = load_card(path, check_preregistration=check_preregistration)
    if check_falsifiable:
        problems = refutations(card, recorded_values(card, str(card.recorded.get("scale", ""))))
        if problems:
            raise CardError(f"{card.path}: refused, on its recorded numbers: " + "; ".join(problems))
    return card
