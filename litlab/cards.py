"""Reproduction cards (``seeds/<slug>.yaml``): the schema and its validation.

A card answers one question: does the paper's headline claim hold here? It says what the paper claims, which
runs test it (each a LightningCLI config plus overrides, with a ``role``), the claims between the runs, and
what the maintainers measured (``recorded:``). Example::

    title: "LoKRA: Low Kruskal-Rank Adaptation"
    venue: ICML 2026
    claim: Raising the Kruskal rank of the update beats LoRA at equal budget.
    metric: {name: val/rel_err, mode: min}
    metrics: {val/logvol: max}       # every other metric a claim reads, with its better direction
    pairing: seed                    # runs of one card seed share data, base model and init: paired intervals
    scales:
      quick: {seeds: [0, 1, 2, 3, 4]}
    runs:
      zero:  {role: floor, config: configs/lokra/quick.yaml, overrides: {model.init_args.lr: 0.0}}
      full:  {role: ceiling, config: configs/lokra/quick.yaml, overrides: {model.init_args.mode: full}}
      lora:  {role: baseline, config: configs/lokra/quick.yaml, overrides: {model.init_args.mode: lora}}
      lokra: {role: method, config: configs/lokra/quick.yaml}
    claims:
      - id: beats_lora
        kind: better                 # better | parity | mechanism (see litlab.claims)
        headline: true               # the card's status is its headline claims' verdict
        paper_effect: 0.05           # the size the paper reports, in this metric's units
        method: lokra
        against: [lora]
        margin: 0.0                  # metric units (or margin_rel: fraction of the compared run's mean)
        paper: "the abstract's sentence and number (Sec. 4, Table 2)"
      - id: full_beats_zero
        kind: better
        control: true                # a positive control: the experiment can see an effect of the paper's size
        method: full
        against: [zero]
        margin: 0.05
      - id: logvol_rises
        kind: better
        method: lokra:val/logvol     # "run:metric" reads another metric of the same fit (no twin runs)
        against: [lora:val/logvol]
    amendments:                      # every change to a claim or a role after a recording, with the old value
      - {date: '2026-12-06', changed: ..., why: ..., old: ..., claims_sha256: ...}
    recorded: {...}                  # written by `litlab repro --record`

Roles: ``method`` (the paper's method), ``ablation`` (a variant of it), ``baseline`` (a method the paper
compares against), ``floor`` (no or trivial adaptation) and ``ceiling`` (an upper bound). Falsifiability and
positive controls are defined over them (``litlab.claims``). A card that measures several tasks (two targets,
two domain pairs, two budgets) gives each run its ``setting:``; a run stands in for a method only within the
method's setting.

Pre-registration: ``--record`` stores ``claims_sha256``, a hash of everything that decides a verdict (claims
without their wording, roles, metrics, pairing). A card whose hash no longer matches is refused unless an
``amendments:`` entry carries the new hash (and says what changed, why, and the old value).

Seeds: a card seed is the run's one seed (``seed_everything``); nothing in ``overrides`` is a seed. Each random
component of a run (data, backbone, prompts, environment, init) derives its own stream from it by name
(``litlab.lit_modules.core.seeding.derive_seed``) and the run's ``summary.json`` keeps the ledger. A component
that is the same for every seed on purpose (a real pre-trained model, a fixed target) is listed, with the
reason, under ``shared: {component: why}``; any other component whose seed or fingerprint repeats across the
card's seeds refuses the card (``check_seed_ledgers``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import yaml

from litlab.lit_modules.core.errors import CardError

# libyaml's safe loader where PyYAML was built with it: `repro --list` reads every card
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def project_path(relative: str | Path) -> Path:
    """A card's or a config's file: the user's project (the working directory) first, then litlab's own tree,
    so users keep their own cards and configs in their own repository."""
    local = Path.cwd() / relative
    return local if local.exists() else PROJECT_ROOT / relative


Scale = Literal["quick", "medium", "full"]
SCALES: tuple[str, ...] = ("quick", "medium", "full")
# a run (or a claim) is at quick and full unless it names its scales: ``medium`` (<= 30 min on 2 cores, real
# pretrained models from the package index or cached artefacts) is opt-in, for the cards whose quick scale cannot
# see the paper's effect
DEFAULT_SCALES: tuple[str, ...] = ("quick", "full")
CLAIM_KINDS = ("better", "parity", "mechanism")
COMPARATIVE = ("better", "parity")
MECHANISM_OPS = ("<", "<=", ">", ">=", "==")
ROLES = ("method", "ablation", "baseline", "floor", "ceiling")
STAND_IN_ROLES = ("baseline", "floor")  # what a method's numbers are replaced by in the falsifiability check
CONTROL_HIGH_ROLES = ("ceiling", "baseline")  # a positive control: a ceiling (or strong baseline) ...
CONTROL_LOW_ROLES = ("floor", "baseline")  # ... beats a floor (or weak baseline)
PAIRINGS = ("seed", "none")
MIN_QUICK_SEEDS = 3
MIN_SEEDS_WIDE = 5  # seeds a card needs where a headline interval is wider than the paper's effect


@dataclass(frozen=True)
class Metric:
    name: str
    mode: Literal["min", "max"] = "min"


class Ref(NamedTuple):
    """One side of a comparison: a run and the metric of it that is read."""

    run: str
    metric: str

    def __str__(self) -> str:
        return f"{self.run}:{self.metric}"


@dataclass(frozen=True)
class RunSpec:
    name: str
    config: str  # may contain "{scale}"
    role: str = "method"
    overrides: dict[str, Any] = field(default_factory=dict)
    scale_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    metric: str | None = None  # this run's primary metric, where it does not log the card's
    # the task a run measures, where a card holds several (a target, a domain pair, a budget): a run stands in
    # for a method in the falsifiability check only within the method's setting
    setting: str = ""
    scales: tuple[str, ...] = DEFAULT_SCALES
    description: str = ""
    optional: bool = False  # a long run (e.g. a real model on CPU): only with --all or when named by --only

    def config_path(self, scale: str) -> str:
        return self.config.format(scale=scale)

    def all_overrides(self, scale: str) -> dict[str, Any]:
        return {**self.overrides, **self.scale_overrides.get(scale, {})}


def _templated_seed(value: Any) -> bool:
    if isinstance(value, str):
        return "{seed}" in value
    if isinstance(value, dict):
        return any(_templated_seed(v) for v in value.values())
    if isinstance(value, list):
        return any(_templated_seed(v) for v in value)
    return False


@dataclass(frozen=True)
class Claim:
    id: str
    kind: Literal["better", "parity", "mechanism"]
    paper: str = ""  # the paper's wording, with its section / table (a headline: the abstract's sentence)
    method: Ref | None = None  # better / parity: the method's run and metric
    against: tuple[Ref, ...] = ()  # better / parity: the compared runs and metrics
    margin: float = 0.0  # metric units
    margin_rel: float | None = None  # or a fraction of each compared run's mean
    headline: bool = False  # the paper's headline claim: the card's status is its verdict
    control: bool = False  # a positive control (ceiling beats floor): the experiment can see an effect
    paper_effect: float | None = None  # headline: the effect the paper reports, in the claim metric's units
    paper_effect_rel: float | None = None  # or a fraction of the compared run's mean
    value: str = ""  # mechanism: a run name, "run:metric" or "derived.<name>"
    op: str = ""  # mechanism: < <= > >= ==
    target: float = 0.0  # mechanism
    fails_if: str = ""  # mechanism: the plausible wrong implementation that fails it
    scales: tuple[str, ...] = DEFAULT_SCALES
    requires: str = ""  # "cuda": listed but unrun without a GPU; other text: what a scale without it lacks
    note: str = ""
    # better / parity: the compared sides may read different scalars of one kind (say two orderings' AUCs that
    # one analysis fit logs side by side); without it every side must read the same metric
    same_units: bool = False
    # better / parity: a non-finite value is censored (a target not reached at any length tried), never a number;
    # where a seed of either side is censored, the sides are compared by the fraction of seeds that reach it
    censored: bool = False

    @property
    def comparative(self) -> bool:
        return self.kind in COMPARATIVE

    @property
    def value_ref(self) -> Ref | None:
        """A mechanism claim's run and metric (None for a derived number)."""
        if self.kind != "mechanism" or self.value.startswith("derived."):
            return None
        run, _, metric = self.value.partition(":")
        return Ref(run, metric)

    def refs(self) -> tuple[Ref, ...]:
        """Every (run, metric) this claim reads."""
        if self.kind == "mechanism":
            ref = self.value_ref
            return () if ref is None else (ref,)
        assert self.method is not None
        return (self.method, *self.against)

    def runs(self) -> tuple[str, ...]:
        """The card runs this claim reads."""
        return tuple(dict.fromkeys(r.run for r in self.refs()))


@dataclass(frozen=True)
class Amendment:
    date: str
    changed: str
    why: str
    old: str
    claims_sha256: str = ""


@dataclass(frozen=True)
class Determinism:
    """How far a re-run may land from a recorded per-seed value and still "match" (math.isclose)."""

    atol: float = 1e-6  # the recorded numbers are rounded to 6 decimals
    rtol: float = 0.0
    # metrics that time the machine (a prefill latency): recorded and reported, never compared for drift, since
    # no tolerance covers another machine's load or clock
    wall_clock: tuple[str, ...] = ()
    # metric -> its own absolute tolerance, where one metric's measured drift is of another size than the rest
    # (a x100 score beside a 0-1 return): one card-wide atol set by the largest would mark every verdict on the
    # small ones fragile
    metric_atol: Mapping[str, float] = field(default_factory=dict)

    def atol_for(self, metric: str) -> float:
        return self.metric_atol.get(metric, self.atol)

    def matches(self, metric: str, measured: float, recorded: float) -> bool:
        """Whether a re-measured value of ``metric`` lands within the tolerance of its recorded one."""
        return math.isclose(measured, recorded, abs_tol=self.atol_for(metric), rel_tol=self.rtol)

    def describe(self) -> str:
        own = "".join(f", {m} {a:g}" for m, a in sorted(self.metric_atol.items()))
        return f"atol {self.atol:g}{own}, rtol {self.rtol:g}"


@dataclass(frozen=True)
class Card:
    slug: str
    title: str
    venue: str
    claim: str
    metric: Metric
    runs: dict[str, RunSpec]
    claims: tuple[Claim, ...]
    seeds: dict[str, tuple[int, ...]]  # scale -> default seeds
    metrics: dict[str, str] = field(default_factory=dict)  # every metric a claim reads -> "min" | "max"
    pairing: str = "none"
    amendments: tuple[Amendment, ...] = ()
    determinism: Determinism = Determinism()
    recorded: dict[str, Any] = field(default_factory=dict)
    paper_numbers: str = ""
    status_note: str = ""
    report_hook: str = ""  # "module:function", see litlab.repro.call_report_hook
    # seed components that are the same for every card seed on purpose -> why (see check_seed_ledgers); the card's
    # ``shared:`` holds for every scale, ``scales.<scale>.shared`` for that scale only (a full scale's one data file)
    shared: dict[str, str] = field(default_factory=dict)
    scale_shared: dict[str, dict[str, str]] = field(default_factory=dict)
    path: Path | None = None

    def shared_for(self, scale: str) -> dict[str, str]:
        return {**self.shared, **self.scale_shared.get(scale, {})}

    def runs_for(self, scale: str) -> dict[str, RunSpec]:
        return {n: r for n, r in self.runs.items() if scale in r.scales}

    def claims_for(self, scale: str) -> tuple[Claim, ...]:
        return tuple(c for c in self.claims if scale in c.scales)

    def run_metric(self, run: str) -> str:
        """A run's primary metric: its own ``metric:`` or the card's."""
        return self.runs[run].metric or self.metric.name

    def mode(self, metric: str) -> str:
        return self.metrics[metric]

    def metrics_of(self, run: str) -> list[str]:
        """What a repro reads from this run's summary: its primary metric, then every metric a claim reads
        from it; the other card metrics are read too where the run logged them (stand-ins for
        falsifiability)."""
        names = [self.run_metric(run)]
        for claim in self.claims:
            names += [ref.metric for ref in claim.refs() if ref.run == run]
        return list(dict.fromkeys(names))

    @property
    def headlines(self) -> tuple[Claim, ...]:
        return tuple(c for c in self.claims if c.headline)

    @property
    def controls(self) -> tuple[Claim, ...]:
        return tuple(c for c in self.claims if c.control)

    def claims_sha256(self) -> str:
        return claims_sha256(self)


def claims_sha256(card: Card) -> str:
    """A hash of everything that decides a verdict: the claims (not their wording), roles, metrics, pairing."""
    decisive = {
        "pairing": card.pairing,
        "metrics": dict(sorted(card.metrics.items())),
        "roles": {name: spec.role for name, spec in sorted(card.runs.items())},
        "claims": [
            {
                "id": c.id,
                "kind": c.kind,
                "headline": c.headline,
                "control": c.control,
                "method": None if c.method is None else str(c.method),
                "against": [str(r) for r in c.against],
                "margin": c.margin,
                "margin_rel": c.margin_rel,
                "paper_effect": c.paper_effect,
                "paper_effect_rel": c.paper_effect_rel,
                "value": c.value,
                "op": c.op,
                "target": c.target,
                "scales": list(c.scales),
                "requires": c.requires,
                "same_units": c.same_units,
                **({"censored": True} if c.censored else {}),  # absent when off: older hashes unchanged
            }
            for c in card.claims
        ],
    }
    settings = {name: spec.setting for name, spec in sorted(card.runs.items()) if spec.setting}
    if settings:  # (absent, not empty, in a card without settings: its hash is the one recorded before them)
        decisive["settings"] = settings
    return hashlib.sha256(json.dumps(decisive, sort_keys=True).encode()).hexdigest()


_RUN_KEYS = {f.name for f in dataclasses.fields(RunSpec)} - {"name"}
_CLAIM_KEYS = ({f.name for f in dataclasses.fields(Claim)} | {"metric"}) - {"value_ref"}
_AMENDMENT_KEYS = {f.name for f in dataclasses.fields(Amendment)}
_CARD_KEYS = {
    "title",
    "venue",
    "claim",
    "metric",
    "metrics",
    "pairing",
    "runs",
    "claims",
    "scales",
    "determinism",
    "amendments",
    "recorded",
    "paper_numbers",
    "status_note",
    "report_hook",
    "shared",
}
_GONE = {
    "controls": "parity 'controls' are gone: every run with role baseline or floor is a stand-in (litlab.claims)",
    "mode": "a run's 'mode' is gone: give each metric's direction once, in the card's 'metrics:'",
}


def _parse_run(where: str, name: Any, spec: Any) -> RunSpec:
    if not str(name).isidentifier():
        raise CardError(f"{where}: run name {name!r} must be an identifier (claims name runs)")
    if not isinstance(spec, dict) or "config" not in spec:
        raise CardError(f"{where}: runs.{name} needs a 'config' path")
    if "mode" in spec:
        raise CardError(f"{where}: runs.{name}: {_GONE['mode']}")
    bad = set(spec) - _RUN_KEYS
    for key, value in {**(spec.get("overrides") or {}), **_flat(spec.get("scale_overrides"))}.items():
        if _templated_seed(value):
            raise CardError(
                f"{where}: runs.{name}.overrides.{key} = {value!r}: seeds are not templated; a run has one seed "
                "(the card seed, seed_everything) and each component derives its stream from it "
                "(litlab.lit_modules.core.seeding.derive_seed): remove the override"
            )
    if bad:
        raise CardError(f"{where}: runs.{name} has unknown keys {sorted(bad)}; allowed: {sorted(_RUN_KEYS)}")
    if spec.get("role") not in ROLES:
        raise CardError(f"{where}: runs.{name}.role must be one of {ROLES}, got {spec.get('role')!r}")
    scales = tuple(spec.get("scales", DEFAULT_SCALES))
    if set(scales) - set(SCALES):
        raise CardError(f"{where}: runs.{name}.scales must be among {SCALES}, got {scales}")
    return RunSpec(
        name=name,
        config=str(spec["config"]),
        role=spec["role"],
        overrides=dict(spec.get("overrides") or {}),
        scale_overrides=dict(spec.get("scale_overrides") or {}),
        metric=spec.get("metric"),
        setting=str(spec.get("setting", "")),
        scales=scales,
        description=str(spec.get("description", "")),
        optional=bool(spec.get("optional", False)),
    )


def _flat(scale_overrides: Any) -> dict[str, Any]:
    return {k: v for per in (scale_overrides or {}).values() if isinstance(per, dict) for k, v in per.items()}


def check_seed_ledgers(
    card: Card, ledgers: dict[str, dict[int, dict[str, Any] | None]], scale: str = "quick"
) -> list[str]:
    """Problems with the runs' seed ledgers (run -> card seed -> ``summary.json``'s ``seed_ledger``) at one
    scale: a run without one, a run seed that is not its card seed, or a component whose derived seed or
    artefact fingerprint repeats across card seeds while the card does not declare it ``shared`` (for every
    scale or for this one)."""
    problems = []
    shared = set(card.shared_for(scale))
    for run, by_seed in ledgers.items():
        missing = sorted(s for s, ledger in by_seed.items() if not ledger)
        if missing:
            problems.append(
                f"run {run} seeds {missing}: summary.json has no seed_ledger (a run from before "
                "litlab recorded one: delete its folder and run it again)"
            )
            continue
        present = {s: ledger for s, ledger in by_seed.items() if ledger}
        for s, ledger in present.items():
            if ledger.get("run_seed") not in (None, s):
                problems.append(f"run {run} seed {s}: its ledger says run seed {ledger.get('run_seed')}")
        for kind in ("components", "artefacts"):
            names = set().union(*(ledger.get(kind, {}) for ledger in present.values()))
            for comp in sorted(names - shared):
                seen: dict[Any, list[int]] = {}
                for s, ledger in sorted(present.items()):
                    if comp in ledger.get(kind, {}):
                        seen.setdefault(ledger[kind][comp], []).append(s)
                repeats = [seeds for seeds in seen.values() if len(seeds) > 1]
                if repeats:
                    what = "seed" if kind == "components" else "artefact fingerprint"
                    problems.append(
                        f"run {run}: component {comp!r} has the same {what} for card seeds {repeats[0]}; "
                        f"every seed must vary it, or the card declares it under 'shared: {{{comp}: why}}' "
                        f"(or 'scales.{scale}.shared')"
                    )
    return problems


def _ref(at: str, text: Any, claim_metric: str, runs: dict[str, RunSpec], card_metric: str) -> Ref:
    """``"run"`` or ``"run:metric"`` -> Ref; a side without a metric reads the claim's, else the run's."""
    run, _, metric = str(text).partition(":")
    if run not in runs:
        raise CardError(f"{at} names unknown run {run!r}; runs: {sorted(runs)}")
    return Ref(run, metric or claim_metric or runs[run].metric or card_metric)


def _number(at: str, raw: dict, key: str) -> float | None:
    if raw.get(key) is None:
        return None
    try:
        return float(raw[key])
    except (TypeError, ValueError):
        raise CardError(f"{at}: {key} must be a number, got {raw[key]!r}") from None


def _parse_claim(where: str, i: int, raw: Any, runs: dict[str, RunSpec], card_metric: str) -> Claim:
    if not isinstance(raw, dict) or "id" not in raw or "kind" not in raw:
        raise CardError(f"{where}: claims[{i}] must be a mapping with 'id' and 'kind', got {raw!r}")
    cid = str(raw["id"])
    at = f"{where}: claim {cid!r}"
    if "controls" in raw:
        raise CardError(f"{at}: {_GONE['controls']}")
    bad = set(raw) - _CLAIM_KEYS
    if bad:
        raise CardError(f"{at} has unknown keys {sorted(bad)}; allowed: {sorted(_CLAIM_KEYS)}")
    kind = raw["kind"]
    if kind not in CLAIM_KINDS:
        raise CardError(f"{at}: kind must be one of {CLAIM_KINDS}, got {kind!r}")
    for flag in ("headline", "control", "same_units", "censored"):
        if not isinstance(raw.get(flag, False), bool):
            raise CardError(f"{at}: {flag} must be true or false, got {raw[flag]!r}")
    scales = tuple(raw.get("scales", DEFAULT_SCALES))
    if set(scales) - set(SCALES):
        raise CardError(f"{at}: scales must be among {SCALES}, got {scales}")
    claim_metric = str(raw.get("metric") or "")
    method = against = None
    if kind != "mechanism":
        if not raw.get("method") or not raw.get("against"):
            raise CardError(f"{at}: a {kind} claim needs 'method' and 'against' (run names)")
        method = _ref(at, raw["method"], claim_metric, runs, card_metric)
        against_raw = raw["against"]
        against = tuple(
            _ref(at, a, claim_metric, runs, card_metric)
            for a in ([against_raw] if isinstance(against_raw, str) else against_raw)
        )
    claim = Claim(
        id=cid,
        kind=kind,
        paper=str(raw.get("paper", "")),
        method=method,
        against=against or (),
        margin=_number(at, raw, "margin") or 0.0,
        margin_rel=_number(at, raw, "margin_rel"),
        headline=raw.get("headline", False),
        control=raw.get("control", False),
        paper_effect=_number(at, raw, "paper_effect"),
        paper_effect_rel=_number(at, raw, "paper_effect_rel"),
        value=str(raw.get("value", "")),
        op=str(raw.get("op", "")),
        target=_number(at, raw, "target") or 0.0,
        fails_if=str(raw.get("fails_if", "")).strip(),
        scales=scales,
        requires=str(raw.get("requires", "")),
        note=str(raw.get("note", "")),
        same_units=raw.get("same_units", False),
        censored=raw.get("censored", False),
    )
    if kind == "mechanism":
        if not claim.value or claim.op not in MECHANISM_OPS or "target" not in raw:
            raise CardError(
                f"{at}: a mechanism claim needs 'value' (a run, run:metric or derived.<name>), 'op' "
                f"(one of {MECHANISM_OPS}) and 'target'; got value={claim.value!r} op={claim.op!r}"
            )
        if claim_metric:
            raise CardError(f"{at}: a mechanism claim reads 'value' ('run:metric'), not 'metric'")
        if not claim.fails_if:
            raise CardError(
                f"{at}: a mechanism claim needs 'fails_if': the plausible wrong implementation that fails it "
                "(a property that holds by construction is a test in tests/, not a card claim)"
            )
        if claim.headline or claim.control or claim.censored:
            raise CardError(
                f"{at}: headline, control and censored claims are comparisons (better / parity), not mechanism"
            )
        ref = claim.value_ref
        if ref is not None:
            ref = _ref(at, claim.value, "", runs, card_metric)
            claim = dataclasses.replace(claim, value=f"{ref.run}:{ref.metric}")
    else:
        assert claim.method is not None
        if "margin" in raw and "margin_rel" in raw:
            raise CardError(f"{at}: give 'margin' or 'margin_rel', not both")
        if claim.margin < 0 or (claim.margin_rel or 0.0) < 0:
            raise CardError(
                f"{at}: the margin must be >= 0 (got margin={claim.margin}, margin_rel={claim.margin_rel}); "
                "a negative margin lets the baseline itself pass"
            )
        if claim.method in claim.against:
            raise CardError(f"{at}: the method {claim.method} is also in 'against'")
        metrics = {r.metric for r in claim.refs()}
        if len(metrics) > 1 and not claim.same_units:
            raise CardError(
                f"{at} compares different metrics: {sorted(metrics)} (set 'same_units: true' only where "
                "they are scalars of one kind, e.g. two orderings' AUCs of one fit)"
            )
    if claim.headline and claim.control:
        raise CardError(f"{at}: a claim is the headline or a positive control, not both")
    if claim.headline:
        if (claim.paper_effect is None) == (claim.paper_effect_rel is None):
            raise CardError(
                f"{at}: a headline claim needs 'paper_effect' (the effect the paper reports, in the claim "
                "metric's units) or 'paper_effect_rel' (a fraction of the compared run's mean), one of them"
            )
        if (claim.paper_effect or claim.paper_effect_rel or 0.0) <= 0:
            raise CardError(
                f"{at}: paper_effect must be > 0, got {claim.paper_effect or claim.paper_effect_rel}"
            )
        if not claim.paper.strip():
            raise CardError(f"{at}: a headline claim quotes the paper's sentence and number in 'paper:'")
    elif claim.paper_effect is not None or claim.paper_effect_rel is not None:
        raise CardError(f"{at}: paper_effect belongs to headline claims (headline: true)")
    if claim.control:
        if kind != "better":
            raise CardError(f"{at}: a positive control is a 'better' claim (a ceiling beats a floor)")
        assert claim.method is not None
        high = runs[claim.method.run].role
        low = {a.run: runs[a.run].role for a in claim.against}
        if high not in CONTROL_HIGH_ROLES or any(r not in CONTROL_LOW_ROLES for r in low.values()):
            raise CardError(
                f"{at}: a positive control compares a {' or '.join(CONTROL_HIGH_ROLES)} with "
                f"{' or '.join(CONTROL_LOW_ROLES)} runs; got {claim.method.run} ({high}) against "
                + ", ".join(f"{n} ({r})" for n, r in low.items())
            )
    if claim.headline or claim.control:
        optional = [r for r in claim.runs() if runs[r].optional]
        if optional:  # a default `litlab repro <slug>` would leave the card's verdict 'not run'
            raise CardError(
                f"{at}: a headline or positive control reads optional run(s) {optional}; "
                "the runs that decide a card's status run by default (remove 'optional: true')"
            )
    for run in claim.runs():
        missing = set(scales) - set(runs[run].scales)
        if missing and "scales" in raw:
            raise CardError(f"{at}: run {run!r} does not exist at scale(s) {sorted(missing)}")
    if "scales" not in raw:  # default: every scale where all its runs exist (a claim on no run: the defaults)
        scales = tuple(
            s
            for s in (SCALES if claim.runs() else DEFAULT_SCALES)
            if all(s in runs[r].scales for r in claim.runs())
        )
        claim = dataclasses.replace(claim, scales=scales)
    return claim


def _parse_amendments(where: str, raw: Any) -> tuple[Amendment, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise CardError(f"{where}: 'amendments' must be a list of {{date, changed, why, old}}, got {raw!r}")
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or {"date", "changed", "why", "old"} - set(entry):
            raise CardError(
                f"{where}: amendments[{i}] needs 'date', 'changed', 'why' and 'old' (the value before), got {entry!r}"
            )
        bad = set(entry) - _AMENDMENT_KEYS
        if bad:
            raise CardError(f"{where}: amendments[{i}] has unknown keys {sorted(bad)}")
        out.append(Amendment(**{k: str(v) for k, v in entry.items()}))
    return tuple(out)


def load_card(path: str | Path, check_preregistration: bool = True) -> Card:
    """Parse and validate ``seeds/<slug>.yaml``; every error names the file and the offending field.

    With ``check_preregistration`` the claims must be those recorded, or an amendment must carry their hash.
    The falsifiability check judges numbers: ``litlab.claims.load_checked_card`` adds it.
    """
    path = Path(path)
    if not path.exists():
        raise CardError(f"no reproduction card at {path}")
    try:
        raw = yaml.load(path.read_text(), Loader=_SafeLoader)
    except yaml.YAMLError as err:
        raise CardError(f"{path}: not valid YAML: {err}") from err
    where = str(path)
    if not isinstance(raw, dict):
        raise CardError(f"{where}: a card is a mapping, got {type(raw).__name__}")
    unknown = set(raw) - _CARD_KEYS
    if unknown:
        raise CardError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_CARD_KEYS)}")
    for key in ("title", "claim", "metric", "runs", "claims", "pairing"):
        if key not in raw:
            raise CardError(f"{where}: missing required key '{key}'")
    if raw["pairing"] not in PAIRINGS:
        raise CardError(
            f"{where}: pairing must be 'seed' (the runs of one card seed share data, base model and "
            f"initialisation: paired intervals) or 'none' (Welch), got {raw['pairing']!r}"
        )

    metric_raw = raw["metric"]
    if not isinstance(metric_raw, dict) or "name" not in metric_raw:
        raise CardError(
            f"{where}: 'metric' must be a mapping with 'name' (and 'mode': min|max), got {metric_raw!r}"
        )
    if metric_raw.get("mode", "min") not in ("min", "max"):
        raise CardError(f"{where}: metric.mode must be 'min' or 'max', got {metric_raw.get('mode')!r}")
    metric = Metric(str(metric_raw["name"]), metric_raw.get("mode", "min"))
    others = raw.get("metrics") or {}
    if not isinstance(others, dict) or any(m not in ("min", "max") for m in others.values()):
        raise CardError(f"{where}: 'metrics' maps each other metric a claim reads to min|max, got {others!r}")
    if others.get(metric.name, metric.mode) != metric.mode:
        raise CardError(f"{where}: metrics.{metric.name} contradicts metric.mode {metric.mode!r}")
    metrics = {metric.name: metric.mode, **{str(k): v for k, v in others.items()}}

    if not isinstance(raw["runs"], dict) or not raw["runs"]:
        raise CardError(
            f"{where}: 'runs' must be a non-empty mapping of run name -> {{role, config, overrides}}"
        )
    runs = {name: _parse_run(where, name, spec) for name, spec in raw["runs"].items()}

    if not isinstance(raw["claims"], list) or not raw["claims"]:
        raise CardError(f"{where}: 'claims' must be a non-empty list")
    claims = tuple(_parse_claim(where, i, c, runs, metric.name) for i, c in enumerate(raw["claims"]))
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise CardError(f"{where}: claim ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    for claim in claims:
        unmoded = sorted({r.metric for r in claim.refs()} - set(metrics))
        if unmoded:
            raise CardError(
                f"{where}: claim {claim.id!r} reads {unmoded}, which 'metrics:' does not list (give each "
                "metric's better direction, min or max)"
            )
    if not any(c.headline for c in claims):
        raise CardError(
            f"{where}: no headline claim: mark the claim that tests the paper's headline 'headline: true', "
            "with the abstract's sentence in 'paper:' and the reported effect in 'paper_effect:'"
        )
    if not any(c.control for c in claims):
        raise CardError(
            f"{where}: no positive control: a 'better' claim with 'control: true' in which a ceiling (or "
            "strong baseline) beats a floor (or weak baseline) by a stated margin shows the experiment can see "
            "an effect"
        )

    hook = str(raw.get("report_hook") or "")
    if hook and (hook.count(":") != 1 or not all(part.strip() for part in hook.split(":"))):
        raise CardError(f"{where}: report_hook must be 'package.module:function', got {hook!r}")

    scales_raw = raw.get("scales") or {}
    seeds = {
        s: tuple(int(x) for x in (scales_raw.get(s) or {}).get("seeds", [0, 1, 2] if s == "quick" else [0]))
        for s in SCALES
    }
    if len(set(seeds["quick"])) < MIN_QUICK_SEEDS:
        raise CardError(
            f"{where}: scales.quick.seeds {list(seeds['quick'])}: a claim over seeds needs at least "
            f"{MIN_QUICK_SEEDS} distinct seeds"
        )
    det_raw = raw.get("determinism") or {}
    if not isinstance(det_raw, dict) or set(det_raw) - {"atol", "rtol", "wall_clock", "metric_atol"}:
        raise CardError(
            f"{where}: determinism must be {{atol: x, rtol: y, wall_clock: [metric, ...], metric_atol: "
            f"{{metric: x}}}}, got {det_raw!r}"
        )
    wall_clock = det_raw.get("wall_clock") or []
    if not isinstance(wall_clock, list) or not all(isinstance(m, str) and m for m in wall_clock):
        raise CardError(f"{where}: determinism.wall_clock must be a list of metric names, got {wall_clock!r}")
    metric_atol = det_raw.get("metric_atol") or {}
    if not isinstance(metric_atol, dict) or not all(
        isinstance(m, str) and isinstance(a, (int, float)) and not isinstance(a, bool) and a >= 0
        for m, a in metric_atol.items()
    ):
        raise CardError(
            f"{where}: determinism.metric_atol must map metric names to tolerances >= 0, got {metric_atol!r}"
        )
    unlisted = sorted(set(metric_atol) - set(metrics) - {metric.name})
    if unlisted:
        raise CardError(
            f"{where}: determinism.metric_atol names {unlisted}, which no claim reads and the card's metrics "
            f"do not list"
        )
    card = Card(
        slug=path.stem,
        title=str(raw["title"]),
        venue=str(raw.get("venue", "")),
        claim=str(raw["claim"]),
        metric=metric,
        runs=runs,
        claims=claims,
        seeds=seeds,
        metrics=metrics,
        pairing=raw["pairing"],
        amendments=_parse_amendments(where, raw.get("amendments")),
        determinism=Determinism(
            **{k: float(v) for k, v in det_raw.items() if k not in ("wall_clock", "metric_atol")},
            wall_clock=tuple(wall_clock),
            metric_atol={m: float(a) for m, a in metric_atol.items()},
        ),
        recorded=dict(raw.get("recorded") or {}),
        paper_numbers=str(raw.get("paper_numbers", "")),
        status_note=str(raw.get("status_note", "")),
        report_hook=hook,
        shared=_parse_shared(where, raw.get("shared")),
        scale_shared={
            s: shared
            for s in SCALES
            if (shared := _parse_shared(f"{where}: scales.{s}", (scales_raw.get(s) or {}).get("shared")))
        },
        path=path,
    )
    if check_preregistration:
        check_preregistered(card)
    return card


def _parse_shared(where: str, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) and v.strip() for v in raw.values()):
        raise CardError(
            f"{where}: 'shared' maps each seed component shared by every seed to why, got {raw!r}"
        )
    return {str(k): v for k, v in raw.items()}


def check_preregistered(card: Card) -> None:
    """The claims are those the card recorded, or an amendment says what changed (and carries the new hash)."""
    recorded = card.recorded.get("claims_sha256")
    current = claims_sha256(card)
    if not recorded or current == recorded:
        return
    if any(a.claims_sha256 == current for a in card.amendments):
        return
    raise CardError(
        f"{card.path}: the claims, roles, metrics or pairing changed since they were recorded "
        f"(claims_sha256 {recorded[:12]}... then, {current[:12]}... now) and no amendment says so: add an "
        "'amendments:' entry {date, changed, why, old: <the value before>, "
        f"claims_sha256: {current}}} (a threshold moved after measuring is an amendment, and the report prints it)"
    )
