"""Reproduction cards (``seeds/<slug>.yaml``): the schema and its validation.

A card says what a paper claims, which runs test it (the method and its baselines, each a LightningCLI
config plus overrides), which logged metric each run reports, the claims that must hold between the runs,
and what the maintainers measured (``recorded:``). Example::

    title: "LoKRA: Low Kruskal-Rank Adaptation"
    venue: ICML 2026
    claim: Raising the Kruskal rank of the update beats LoRA at equal budget.
    metric: {name: val/rel_err, mode: min}
    scales:
      quick: {seeds: [0, 1, 2]}
    runs:
      lora: {config: configs/lokra/quick.yaml, overrides: {model.init_args.mode: lora}}
      lokra_plus: {config: configs/lokra/quick.yaml, overrides: {model.init_args.mode: lokra_plus,
                                                                 data.init_args.seed: "{seed}"}}
    claims:
      - id: beats_lora
        kind: better                 # better | parity | mechanism (see litlab.claims)
        method: lokra_plus
        against: [lora]
        margin: 0.05                 # metric units (or margin_rel: fraction of the compared run's mean)
        paper: "LoKRA+ recovers a diagonal target that LoRA cannot (Sec. 3, Prop. 2)"
    determinism: {atol: 1.0e-6}      # per-seed tolerance of "matches recorded"
    status_note: why the card has the status it has
    report_hook: litlab.lit_modules.peft.lokra:report   # optional: figures / derived numbers for the report
    recorded: {...}

``"{seed}"`` inside an override value is replaced by the card seed of the fit, so that data generation,
prompt sets and locally pre-trained models follow the seed as well as ``seed_everything`` does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from litlab.lit_modules.core.errors import CardError

Scale = Literal["quick", "full"]
SCALES: tuple[str, ...] = ("quick", "full")
CLAIM_KINDS = ("better", "parity", "mechanism")
MECHANISM_OPS = ("<", "<=", ">", ">=", "==")
MIN_QUICK_SEEDS = 3


@dataclass(frozen=True)
class Metric:
    name: str
    mode: Literal["min", "max"] = "min"


@dataclass(frozen=True)
class RunSpec:
    name: str
    config: str  # may contain "{scale}"
    overrides: dict[str, Any] = field(default_factory=dict)
    scale_overrides: dict[str, dict[str, Any]] = field(default_factory=dict)
    metric: str | None = None  # overrides the card's metric name for this run
    mode: Literal["min", "max"] | None = (
        None  # the better direction of this run's metric (default: the card's)
    )
    scales: tuple[str, ...] = SCALES
    description: str = ""
    optional: bool = False  # a long run (e.g. a real model on CPU): only with --all or when named by --only

    def config_path(self, scale: str) -> str:
        return self.config.format(scale=scale)

    def all_overrides(self, scale: str, seed: int | None = None) -> dict[str, Any]:
        merged = {**self.overrides, **self.scale_overrides.get(scale, {})}
        return merged if seed is None else {k: substitute_seed(v, seed) for k, v in merged.items()}


def substitute_seed(value: Any, seed: int) -> Any:
    """``"{seed}"`` -> the seed (an int); ``"x-{seed}"`` -> ``"x-3"``; containers recursively."""
    if isinstance(value, str) and "{seed}" in value:
        return seed if value == "{seed}" else value.replace("{seed}", str(seed))
    if isinstance(value, dict):
        return {k: substitute_seed(v, seed) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute_seed(v, seed) for v in value]
    return value


@dataclass(frozen=True)
class Claim:
    id: str
    kind: Literal["better", "parity", "mechanism"]
    paper: str = ""  # the paper's wording, with its section / table
    method: str = ""  # better / parity: the method's run
    against: tuple[str, ...] = ()  # better / parity: the compared runs
    margin: float = 0.0  # metric units
    margin_rel: float | None = None  # or a fraction of each compared run's mean
    controls: tuple[str, ...] = ()  # parity: runs that must fail the same test
    value: str = ""  # mechanism: a run name or "derived.<name>"
    op: str = ""  # mechanism: < <= > >= ==
    target: float = 0.0  # mechanism
    scales: tuple[str, ...] = SCALES
    requires: str = ""  # "cuda": listed but unrun without a GPU
    note: str = ""
    # better / parity: the compared runs may read different scalars of one kind (say two orderings' AUCs that
    # one analysis fit logs side by side); without it every compared run must read the same metric
    same_units: bool = False

    def runs(self) -> tuple[str, ...]:
        """The card runs this claim reads."""
        if self.kind == "mechanism":
            return () if self.value.startswith("derived.") else (self.value,)
        return (self.method, *self.against, *self.controls)


@dataclass(frozen=True)
class Determinism:
    """How far a re-run may land from a recorded per-seed value and still "match" (math.isclose)."""

    atol: float = 1e-6  # the recorded numbers are rounded to 6 decimals
    rtol: float = 0.0


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
    determinism: Determinism = Determinism()
    recorded: dict[str, Any] = field(default_factory=dict)
    paper_numbers: str = ""
    status_note: str = ""
    report_hook: str = ""  # "module:function", see litlab.repro.call_report_hook
    path: Path | None = None

    def runs_for(self, scale: str) -> dict[str, RunSpec]:
        return {n: r for n, r in self.runs.items() if scale in r.scales}

    def claims_for(self, scale: str) -> tuple[Claim, ...]:
        return tuple(c for c in self.claims if scale in c.scales)


_RUN_KEYS = {f.name for f in dataclasses.fields(RunSpec)} - {"name"}
_CLAIM_KEYS = {f.name for f in dataclasses.fields(Claim)}
_CARD_KEYS = {
    "title",
    "venue",
    "claim",
    "metric",
    "runs",
    "claims",
    "scales",
    "determinism",
    "recorded",
    "paper_numbers",
    "status_note",
    "report_hook",
}


def _parse_run(where: str, name: Any, spec: Any) -> RunSpec:
    if not str(name).isidentifier():
        raise CardError(f"{where}: run name {name!r} must be an identifier (claims name runs)")
    if not isinstance(spec, dict) or "config" not in spec:
        raise CardError(f"{where}: runs.{name} needs a 'config' path")
    bad = set(spec) - _RUN_KEYS
    if bad:
        raise CardError(f"{where}: runs.{name} has unknown keys {sorted(bad)}; allowed: {sorted(_RUN_KEYS)}")
    scales = tuple(spec.get("scales", SCALES))
    if set(scales) - set(SCALES):
        raise CardError(f"{where}: runs.{name}.scales must be among {SCALES}, got {scales}")
    if spec.get("mode") not in (None, "min", "max"):
        raise CardError(f"{where}: runs.{name}.mode must be 'min' or 'max', got {spec.get('mode')!r}")
    return RunSpec(
        name=name,
        config=str(spec["config"]),
        overrides=dict(spec.get("overrides") or {}),
        scale_overrides=dict(spec.get("scale_overrides") or {}),
        metric=spec.get("metric"),
        mode=spec.get("mode"),
        scales=scales,
        description=str(spec.get("description", "")),
        optional=bool(spec.get("optional", False)),
    )


def _parse_claim(where: str, i: int, raw: Any, runs: dict[str, RunSpec]) -> Claim:
    if not isinstance(raw, dict) or "id" not in raw or "kind" not in raw:
        raise CardError(f"{where}: claims[{i}] must be a mapping with 'id' and 'kind', got {raw!r}")
    cid = str(raw["id"])
    at = f"{where}: claim {cid!r}"
    bad = set(raw) - _CLAIM_KEYS
    if bad:
        raise CardError(f"{at} has unknown keys {sorted(bad)}; allowed: {sorted(_CLAIM_KEYS)}")
    kind = raw["kind"]
    if kind not in CLAIM_KINDS:
        raise CardError(f"{at}: kind must be one of {CLAIM_KINDS}, got {kind!r}")
    scales = tuple(raw.get("scales", SCALES))
    if set(scales) - set(SCALES):
        raise CardError(f"{at}: scales must be among {SCALES}, got {scales}")
    if raw.get("requires", "") not in ("", "cuda"):
        raise CardError(f"{at}: requires must be 'cuda' (or absent), got {raw['requires']!r}")
    against = raw.get("against") or []
    claim = Claim(
        id=cid,
        kind=kind,
        paper=str(raw.get("paper", "")),
        method=str(raw.get("method", "")),
        against=tuple([against] if isinstance(against, str) else against),
        margin=float(raw.get("margin", 0.0)),
        margin_rel=None if raw.get("margin_rel") is None else float(raw["margin_rel"]),
        controls=tuple(raw.get("controls") or ()),
        value=str(raw.get("value", "")),
        op=str(raw.get("op", "")),
        target=float(raw.get("target", 0.0)),
        scales=scales,
        requires=str(raw.get("requires", "")),
        note=str(raw.get("note", "")),
        same_units=raw.get("same_units", False),
    )
    if not isinstance(claim.same_units, bool):
        raise CardError(f"{at}: same_units must be true or false, got {raw['same_units']!r}")
    if kind == "mechanism":
        if not claim.value or claim.op not in MECHANISM_OPS or "target" not in raw:
            raise CardError(
                f"{at}: a mechanism claim needs 'value' (a run or derived.<name>), 'op' "
                f"(one of {MECHANISM_OPS}) and 'target'; got value={claim.value!r} op={claim.op!r}"
            )
    else:
        if not claim.method or not claim.against:
            raise CardError(f"{at}: a {kind} claim needs 'method' and 'against' (run names)")
        if "margin" in raw and "margin_rel" in raw:
            raise CardError(f"{at}: give 'margin' or 'margin_rel', not both")
        if claim.margin < 0 or (claim.margin_rel or 0.0) < 0:
            raise CardError(
                f"{at}: the margin must be >= 0 (got margin={claim.margin}, margin_rel={claim.margin_rel}); "
                "a negative margin lets the baseline itself pass"
            )
        if kind == "parity" and not claim.controls:
            raise CardError(
                f"{at}: a parity claim passes for the compared run itself; name 'controls' (runs that must "
                "fail the same test) so that it can tell the method from a baseline"
            )
        if claim.method in claim.against:
            raise CardError(f"{at}: the method {claim.method!r} is also in 'against'")
    for run in claim.runs():
        if run not in runs:
            raise CardError(f"{at} names unknown run {run!r}; runs: {sorted(runs)}")
        missing = set(scales) - set(runs[run].scales)
        if missing and "scales" in raw:
            raise CardError(f"{at}: run {run!r} does not exist at scale(s) {sorted(missing)}")
    if "scales" not in raw:  # default: every scale where all its runs exist
        scales = tuple(s for s in SCALES if all(s in runs[r].scales for r in claim.runs()))
        claim = dataclasses.replace(claim, scales=scales)
    metrics = {runs[r].metric for r in (claim.method, *claim.against, *claim.controls) if r}
    if kind != "mechanism" and len(metrics) > 1 and not claim.same_units:
        raise CardError(
            f"{at} compares runs that read different metrics: {sorted(map(str, metrics))} (set "
            "'same_units: true' only where they are scalars of one kind, e.g. two orderings' AUCs of one fit)"
        )
    return claim


def load_card(path: str | Path, check_falsifiable: bool = True) -> Card:
    """Parse and validate ``seeds/<slug>.yaml``; every error names the file and the offending field.

    With ``check_falsifiable`` the card's recorded numbers must pass ``litlab.claims.refutations``.
    """
    path = Path(path)
    if not path.exists():
        raise CardError(f"no reproduction card at {path}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise CardError(f"{path}: not valid YAML: {err}") from err
    where = str(path)
    if not isinstance(raw, dict):
        raise CardError(f"{where}: a card is a mapping, got {type(raw).__name__}")
    if "expectation" in raw:
        raise CardError(
            f"{where}: 'expectation' (one boolean expression over means) was replaced by 'claims' "
            "(see litlab/cards.py)"
        )
    unknown = set(raw) - _CARD_KEYS
    if unknown:
        raise CardError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_CARD_KEYS)}")
    for key in ("title", "claim", "metric", "runs", "claims"):
        if key not in raw:
            raise CardError(f"{where}: missing required key '{key}'")

    metric_raw = raw["metric"]
    if not isinstance(metric_raw, dict) or "name" not in metric_raw:
        raise CardError(
            f"{where}: 'metric' must be a mapping with 'name' (and 'mode': min|max), got {metric_raw!r}"
        )
    if metric_raw.get("mode", "min") not in ("min", "max"):
        raise CardError(f"{where}: metric.mode must be 'min' or 'max', got {metric_raw.get('mode')!r}")
    metric = Metric(str(metric_raw["name"]), metric_raw.get("mode", "min"))

    if not isinstance(raw["runs"], dict) or not raw["runs"]:
        raise CardError(f"{where}: 'runs' must be a non-empty mapping of run name -> {{config, overrides}}")
    runs = {name: _parse_run(where, name, spec) for name, spec in raw["runs"].items()}

    if not isinstance(raw["claims"], list) or not raw["claims"]:
        raise CardError(f"{where}: 'claims' must be a non-empty list")
    claims = tuple(_parse_claim(where, i, c, runs) for i, c in enumerate(raw["claims"]))
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise CardError(f"{where}: claim ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")

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
    if not isinstance(det_raw, dict) or set(det_raw) - {"atol", "rtol"}:
        raise CardError(f"{where}: determinism must be {{atol: x, rtol: y}}, got {det_raw!r}")
    card = Card(
        slug=path.stem,
        title=str(raw["title"]),
        venue=str(raw.get("venue", "")),
        claim=str(raw["claim"]),
        metric=metric,
        runs=runs,
        claims=claims,
        seeds=seeds,
        determinism=Determinism(**{k: float(v) for k, v in det_raw.items()}),
        recorded=dict(raw.get("recorded") or {}),
        paper_numbers=str(raw.get("paper_numbers", "")),
        status_note=str(raw.get("status_note", "")),
        report_hook=hook,
        path=path,
    )
    if check_falsifiable:
        # litlab.claims judges claims on numbers and imports this module's types
        from litlab.claims import recorded_values, refutations

        recorded = recorded_values(card, str(card.recorded.get("scale", "")))
        problems = refutations(card, {n: list(v.values()) for n, v in recorded.items()})
        if problems:
            raise CardError(f"{where}: refused, on its recorded numbers: " + "; ".join(problems))
    return card
