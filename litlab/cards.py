"""Reproduction cards (``seeds/<slug>.yaml``): the schema, its validation, and the expectation language.

A card says what a paper claims, which runs test it (the method and its baselines, each a LightningCLI
config plus overrides), which logged metric decides, what must hold between the runs' means, and what the
maintainers measured (``recorded:``). Example::

    title: "LoKRA: Low Kruskal-Rank Adaptation"
    venue: ICML 2026
    claim: Raising the Kruskal rank of the update beats LoRA at equal budget.
    metric: {name: val/rel_err, mode: min}
    scales:
      quick: {seeds: [0, 1, 2]}
    runs:
      lora: {config: configs/lokra/quick.yaml, overrides: {model.init_args.mode: lora}}
      lokra_plus: {config: configs/lokra/quick.yaml, overrides: {model.init_args.mode: lokra_plus}}
    expectation: lokra_plus < lora - 0.05
    report_hook: litlab.lit_modules.peft.lokra:report   # optional: extra figures / derived numbers for the report
    recorded: {...}

Expectations are boolean expressions over run names (each stands for the run's mean over seeds), numbers,
``+ - * /``, comparisons, ``and``/``or``/``not`` and ``abs``/``min``/``max``; ``std(run)`` gives a run's std.
"""

from __future__ import annotations

import ast
import dataclasses
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from litlab.lit_modules.core.errors import CardError

Scale = Literal["quick", "full"]
SCALES: tuple[str, ...] = ("quick", "full")


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
    scales: tuple[str, ...] = SCALES
    description: str = ""
    optional: bool = False  # a long run (e.g. a real model on CPU): only with --all or when named by --only

    def config_path(self, scale: str) -> str:
        return self.config.format(scale=scale)

    def all_overrides(self, scale: str) -> dict[str, Any]:
        return {**self.overrides, **self.scale_overrides.get(scale, {})}


@dataclass(frozen=True)
class Card:
    slug: str
    title: str
    venue: str
    claim: str
    metric: Metric
    runs: dict[str, RunSpec]
    expectation: dict[str, str]  # scale -> expression
    seeds: dict[str, tuple[int, ...]]  # scale -> default seeds
    recorded: dict[str, Any] = field(default_factory=dict)
    paper_numbers: str = ""
    report_hook: str = ""  # "module:function", see litlab.repro.call_report_hook
    path: Path | None = None

    def runs_for(self, scale: str) -> dict[str, RunSpec]:
        return {n: r for n, r in self.runs.items() if scale in r.scales}


_RUN_KEYS = {f.name for f in dataclasses.fields(RunSpec)} - {"name"}
_CARD_KEYS = {
    "title",
    "venue",
    "claim",
    "metric",
    "runs",
    "expectation",
    "scales",
    "recorded",
    "paper_numbers",
    "report_hook",
}


def load_card(path: str | Path) -> Card:
    """Parse and validate ``seeds/<slug>.yaml``; every error names the file and the offending field."""
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
    unknown = set(raw) - _CARD_KEYS
    if unknown:
        raise CardError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_CARD_KEYS)}")
    for key in ("title", "claim", "metric", "runs", "expectation"):
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
    runs = {}
    for name, spec in raw["runs"].items():
        if not str(name).isidentifier():
            raise CardError(
                f"{where}: run name {name!r} must be an identifier (it is used in the expectation)"
            )
        if not isinstance(spec, dict) or "config" not in spec:
            raise CardError(f"{where}: runs.{name} needs a 'config' path")
        bad = set(spec) - _RUN_KEYS
        if bad:
            raise CardError(
                f"{where}: runs.{name} has unknown keys {sorted(bad)}; allowed: {sorted(_RUN_KEYS)}"
            )
        scales = tuple(spec.get("scales", SCALES))
        if set(scales) - set(SCALES):
            raise CardError(f"{where}: runs.{name}.scales must be among {SCALES}, got {scales}")
        runs[name] = RunSpec(
            name=name,
            config=str(spec["config"]),
            overrides=dict(spec.get("overrides") or {}),
            scale_overrides=dict(spec.get("scale_overrides") or {}),
            metric=spec.get("metric"),
            scales=scales,
            description=str(spec.get("description", "")),
            optional=bool(spec.get("optional", False)),
        )

    expectation = raw["expectation"]
    expectation = {s: expectation for s in SCALES} if isinstance(expectation, str) else dict(expectation)
    for scale, expr in expectation.items():
        if scale not in SCALES:
            raise CardError(f"{where}: expectation scale {scale!r} is not one of {SCALES}")
        known = {n for n, r in runs.items() if scale in r.scales}
        missing = expression_names(expr) - known
        if missing:
            raise CardError(
                f"{where}: expectation[{scale}] names unknown runs {sorted(missing)}; runs: {sorted(known)}"
            )

    hook = str(raw.get("report_hook") or "")
    if hook and (hook.count(":") != 1 or not all(part.strip() for part in hook.split(":"))):
        raise CardError(f"{where}: report_hook must be 'package.module:function', got {hook!r}")

    scales_raw = raw.get("scales") or {}
    seeds = {
        s: tuple(int(x) for x in (scales_raw.get(s) or {}).get("seeds", [0, 1, 2] if s == "quick" else [0]))
        for s in SCALES
    }
    return Card(
        slug=path.stem,
        title=str(raw["title"]),
        venue=str(raw.get("venue", "")),
        claim=str(raw["claim"]),
        metric=metric,
        runs=runs,
        expectation=expectation,
        seeds=seeds,
        recorded=dict(raw.get("recorded") or {}),
        paper_numbers=str(raw.get("paper_numbers", "")),
        report_hook=hook,
        path=path,
    )


# ---- the expectation language -------------------------------------------------------------------
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CMPOPS = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_FUNCS = {"abs": abs, "min": min, "max": max}


def _parse(expr: str) -> ast.Expression:
    try:
        return ast.parse(expr, mode="eval")
    except SyntaxError as err:
        raise CardError(f"expectation {expr!r} is not a valid expression: {err.msg}") from err


def expression_names(expr: str) -> set[str]:
    funcs = set(_FUNCS) | {"std"}
    return {n.id for n in ast.walk(_parse(expr)) if isinstance(n, ast.Name) and n.id not in funcs}


def split_clauses(expr: str) -> list[str]:
    """Top-level ``and`` clauses, so a report can say which part of an expectation failed."""
    tree = _parse(expr).body
    if isinstance(tree, ast.BoolOp) and isinstance(tree.op, ast.And):
        return [ast.unparse(v) for v in tree.values]
    return [expr]


def evaluate(expr: str, means: dict[str, float], stds: dict[str, float] | None = None) -> bool:
    stds = stds or {}

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in means:
                raise CardError(f"expectation {expr!r}: no result for run {node.id!r}")
            return means[node.id]
        if isinstance(node, ast.BoolOp):
            values = [bool(ev(v)) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not ev(node.operand)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = ev(comp)
                if type(op) not in _CMPOPS or not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
            if node.func.id == "std" and len(node.args) == 1 and isinstance(node.args[0], ast.Name):
                return stds[node.args[0].id]
            if node.func.id in _FUNCS:
                return _FUNCS[node.func.id](*[ev(a) for a in node.args])
        raise CardError(f"expectation {expr!r}: unsupported syntax {ast.unparse(node)!r}")

    return bool(ev(_parse(expr)))
