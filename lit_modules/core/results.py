"""What a reproduction measured, as typed objects: what ``litlab repro`` hands a card's ``report_hook``.

A report hook is ``fn(result: CardResult, out_dir: Path) -> ReportExtras``: it reads each seed's run folder
(``SeedRun.run_dir``: ``summary.json``, ``csv/``, files a callback wrote) and returns figures, a markdown section
and derived numbers, which ``litlab repro`` adds to report.md, results.json and, with ``--record``, the card.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class SeedRun:
    """One fit of one card entry at one seed."""

    seed: int
    value: float
    run_dir: Path
    reused: bool = False
    wall_time_s: float | None = None

    def summary_metrics(self) -> dict[str, float]:
        """The final metrics the run logged (its ``summary.json``)."""
        return json.loads((self.run_dir / "summary.json").read_text())["metrics"]

    def config(self) -> dict[str, Any]:
        """The resolved config the run was fitted with: the ``config.yaml`` LightningCLI wrote into the trainer's
        log folder, which is the run folder when a wandb logger comes first and the CSV logger's newest
        ``csv/version_N/`` when there is none (``WANDB_MODE=disabled``)."""
        import yaml

        versions = sorted(
            self.run_dir.glob("csv/version_*/config.yaml"), key=lambda p: int(p.parent.name.split("_")[-1])
        )
        candidates = [self.run_dir / "config.yaml", *reversed(versions)]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise FileNotFoundError(
                f"run folder {self.run_dir} holds no config.yaml (nor csv/version_*/config.yaml)"
            )
        return yaml.safe_load(path.read_text())


@dataclass
class RunResult:
    """One card entry (a config and its overrides) over the card's seeds."""

    name: str
    metric: str
    seeds: list[int]
    values: list[float]
    mean: float
    std: float
    runs: list[SeedRun]
    # every metric the card's claims read from this run (and the card's other metrics it logged), per seed in
    # ``seeds`` order; ``values`` is the run's primary metric
    metrics: dict[str, list[float]] = field(default_factory=dict)

    @property
    def run_dirs(self) -> list[Path]:
        return [r.run_dir for r in self.runs]


@dataclass
class ReportExtras:
    """What a report hook adds: image paths under ``out_dir``, a markdown section, derived numbers."""

    figures: list[Path] = field(default_factory=list)
    markdown: str = ""
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass
class CardResult:
    slug: str
    title: str
    claim: str
    scale: str
    seeds: list[int]
    metric_name: str
    metric_mode: str
    runs: dict[str, RunResult]
    date: str
    wall_time_s: float
    extras: ReportExtras = field(default_factory=ReportExtras)
    # the card's design, for report hooks (which sit below litlab.cards): every run's role, and every claim as
    # plain data ({id, kind, method, against, value, headline, control}; sides are "run:metric")
    roles: dict[str, str] = field(default_factory=dict)
    design_claims: list[dict[str, Any]] = field(default_factory=list)
    # set by litlab.repro.judge once the runs (and the report hook) are done
    claims: list[Any] = field(default_factory=list)  # litlab.claims.ClaimResult, one per claim at this scale
    status: str = "not run"  # reproduced | not reproduced | inconclusive | not testable at this scale
    status_reason: str = ""  # which headline, control or sensitivity decided the status
    regressions: list[str] = field(default_factory=list)  # claims recorded as passing that fail now
    refutations: list[str] = field(default_factory=list)  # claims that cannot tell the method from a baseline
    mismatches: list[str] = field(default_factory=list)  # seeds whose number moved from the recorded one

    def claim_result(self, claim_id: str) -> Any:
        for c in self.claims:
            if c.id == claim_id:
                return c
        raise KeyError(f"no claim {claim_id!r}; claims: {[c.id for c in self.claims]}")

    @property
    def reused_runs(self) -> int:
        return sum(r.reused for run in self.runs.values() for r in run.runs)

    @property
    def total_runs(self) -> int:
        return sum(len(run.runs) for run in self.runs.values())

    def distinct_runs(self) -> Iterator[tuple[str, RunResult]]:
        """Each set of fits once: card entries that read another metric of the same runs are skipped."""
        seen: set[tuple[Path, ...]] = set()
        for name, run in self.runs.items():
            key = tuple(sorted(run.run_dirs))
            if key not in seen:
                seen.add(key)
                yield name, run

    def to_json(self) -> dict[str, Any]:
        """The results.json layout."""
        runs = {}
        for name, r in self.runs.items():
            runs[name] = {
                "metric": r.metric,
                "values": r.values,
                "seeds": r.seeds,
                "mean": r.mean,
                "std": r.std,
                "metrics": r.metrics,
                "runs": [{**dataclasses.asdict(s), "run_dir": str(s.run_dir)} for s in r.runs],
            }
        return {
            "slug": self.slug,
            "title": self.title,
            "claim": self.claim,
            "scale": self.scale,
            "seeds": self.seeds,
            "metric": {"name": self.metric_name, "mode": self.metric_mode},
            "runs": runs,
            "claims": [c.to_json() for c in self.claims],
            "status": self.status,
            "status_reason": self.status_reason,
            "regressions": self.regressions,
            "refutations": self.refutations,
            "mismatches": self.mismatches,
            "date": self.date,
            "wall_time_s": self.wall_time_s,
            "reused_runs": self.reused_runs,
            "total_runs": self.total_runs,
            "figures": [str(p) for p in self.extras.figures],
            "report_markdown": self.extras.markdown,
            "derived": {k: float(v) for k, v in self.extras.numbers.items()},
        }
