"""``litlab sweep sweeps/<slug>.yaml [--count N] [--parallel P]``: run a wandb sweep file with no wandb server.

The file is a standard wandb sweep (``wandb sweep sweeps/<slug>.yaml`` + ``wandb agent`` use it online unchanged):
its ``command`` runs ``litlab fit --config … ${args}`` and its parameter names are LightningCLI keys. Here the
proposals come from wandb's own open-source sweep engine (the ``sweeps`` package: grid, random, bayes), each
proposal runs the file's command as a subprocess — a LightningCLI run logged offline — and its metric is read
from the run's ``summary.json``. State lives in ``runs/sweeps/<name>/sweep.json``: an interrupted sweep resumes,
re-running only the runs that did not finish. At the end: a table of runs sorted by the sweep's metric
(``results.md``/``results.csv``) and a plot of the metric against each parameter (``sweep.png``).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from litlab.lit_modules.core.errors import ConfigError, SweepError
from litlab.lit_modules.core.io import atomic_write_json, atomic_write_text

DEFAULT_COMMAND = ["${env}", "${interpreter}", "${program}", "${args}"]


def sweep_engine() -> ModuleType:
    """wandb's sweep engine, ``sweeps``: imported when a sweep runs (numpy and pydantic: half a second), so that
    ``litlab sweep --help`` answers at once."""
    with warnings.catch_warnings():  # sweeps 0.3 was written for pydantic 1: a config-key rename warning
        warnings.simplefilter("ignore")
        import sweeps
    return sweeps


def load_sweep(path: Path) -> dict[str, Any]:
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SweepError(f"cannot read sweep file {path}: {err}") from err
    if not isinstance(cfg, dict):
        raise SweepError(f"sweep file {path} must be a YAML mapping, got {type(cfg).__name__}")
    try:
        sweep_engine().SweepConfig(cfg)  # wandb's JSON schema: the same file must work with `wandb sweep`
    except Exception as err:
        raise SweepError(f"{path} is not a valid wandb sweep file: {err}") from err
    if cfg["method"] not in ("grid", "random", "bayes"):
        raise SweepError(f"{path}: method={cfg['method']!r}; litlab sweep runs grid, random and bayes")
    if cfg["method"] != "grid" and "metric" not in cfg:
        raise SweepError(
            f"{path}: method={cfg['method']!r} needs a metric: {{name: ..., goal: minimize|maximize}}"
        )
    return cfg


def expand_command(cfg: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """wandb agent's macros: ${env} ${interpreter} ${program} ${args} ${args_no_hyphens} ${args_json}."""

    def fmt(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v)

    out: list[str] = []
    for item in cfg.get("command") or DEFAULT_COMMAND:
        if item == "${env}":
            continue  # wandb adds /usr/bin/env here; the subprocess inherits the environment anyway
        elif item == "${interpreter}":
            out.append(sys.executable)
        elif item == "${program}":
            out.append(cfg.get("program", ""))
        elif item in ("${args}", "${args_no_boolean_flags}"):
            out += [f"--{k}={fmt(v)}" for k, v in params.items()]
        elif item == "${args_no_hyphens}":
            out += [f"{k}={fmt(v)}" for k, v in params.items()]
        elif item == "${args_json}":
            out.append(json.dumps(params))
        else:
            out.append(str(item))
    return out


def run_name(params: dict[str, Any]) -> str:
    return "run-" + hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:10]


class LocalSweep:
    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.cfg = path, load_sweep(path)
        self.name = str(self.cfg.get("name") or path.stem)
        self.dir = root / self.name
        self.state_file = self.dir / "sweep.json"
        self.runs: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        if self.state_file.exists():
            self.runs = json.loads(self.state_file.read_text())["runs"]
        metric = self.cfg.get("metric") or {}
        self.metric, self.goal = metric.get("name"), metric.get("goal", "minimize")

    def save(self) -> None:
        with self._lock:  # runs finish on several threads
            atomic_write_json(
                self.state_file, {"sweep_file": str(self.path), "config": self.cfg, "runs": self.runs}
            )

    def run_dir(self, name: str) -> Path:
        return self.dir / "runs" / self.name / name

    # ---- proposals from wandb's sweep engine ------------------------------------------------------
    def _as_sweep_runs(self) -> list:
        sweeps = sweep_engine()

        states = {
            "finished": sweeps.RunState.finished,
            "failed": sweeps.RunState.failed,
            "running": sweeps.RunState.running,
            "pending": sweeps.RunState.pending,
        }
        out = []
        for r in self.runs:
            summary = {self.metric: r["metric"]} if self.metric and r.get("metric") is not None else {}
            out.append(
                sweeps.SweepRun(
                    name=r["name"],
                    state=states.get(r["status"], sweeps.RunState.failed),
                    config={k: {"value": v} for k, v in r["params"].items()},
                    summary_metrics=summary,
                    history=[summary] if summary else [],
                )
            )
        return out

    def propose(self) -> dict[str, Any] | None:
        sweeps = sweep_engine()

        proposal = sweeps.next_run(self.cfg, self._as_sweep_runs(), validate=False)
        if proposal is None:
            return None
        params = {k: v["value"] for k, v in proposal.config.items()}
        entry: dict[str, Any] = {
            "name": run_name(params),
            "params": params,
            "status": "pending",
            "metric": None,
        }
        if any(r["name"] == entry["name"] for r in self.runs):  # random search may repeat a point
            entry["name"] += f"-{len(self.runs)}"
        self.runs.append(entry)
        self.save()
        return entry

    # ---- running one proposal ---------------------------------------------------------------------
    def execute(self, entry: dict[str, Any], extra: list[str]) -> None:
        run_dir = self.run_dir(entry["name"])
        summary_path = run_dir / "summary.json"
        if _finished(summary_path):  # finished before an interruption of the sweep itself
            return self._collect(entry, summary_path, 0)
        cmd = [
            *_resolve_litlab(expand_command(self.cfg, entry["params"])),
            f"--runs_dir={self.dir / 'runs'}",
            f"--experiment={self.name}",
            f"--run_id={entry['name']}",
            *extra,
        ]
        if summary_path.parent.joinpath("checkpoints", "last.ckpt").exists():
            cmd.append("--ckpt_path=last")  # an interrupted run continues from its last checkpoint
        entry["status"], entry["command"] = "running", shlex.join(cmd)
        self.save()
        env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")}
        run_dir.mkdir(parents=True, exist_ok=True)
        log_path = run_dir / "sweep_run.log"
        start = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "a") as log:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        self._collect(entry, summary_path, code)
        if entry["status"] != "finished":
            entry["error"] = error_line(log_path, start) or f"exit code {code}"
            self.save()
            print(
                f"litlab sweep: {entry['name']} failed: {entry['error']} (log: {log_path})", file=sys.stderr
            )

    def check_first(self, extra: list[str]) -> None:
        """Dry-run the first parameter set through the ``litlab fit`` parser: a parameter the model does not
        accept stops the sweep here, with the parser's message, instead of failing every run."""
        entry = next((r for r in self.runs if r["status"] != "finished"), None) or self.propose()
        if entry is None:
            return
        cmd = expand_command(self.cfg, entry["params"])
        at = next((i for i, c in enumerate(cmd) if c == "fit"), None)
        if at is None or not any("litlab" in c for c in cmd[:at]):
            return  # not a `litlab fit` command: nothing to dry-run
        from litlab.cli import check_fit_args  # Lightning and every method module (seconds): only here

        try:
            check_fit_args(
                [*cmd[at:], f"--runs_dir={self.dir / 'runs'}", f"--experiment={self.name}", *extra]
            )
        except ConfigError as err:
            raise SweepError(
                f"{self.path}: the first parameter set {entry['params']} is refused: {err}"
            ) from err

    def _collect(self, entry: dict[str, Any], summary_path: Path, code: int) -> None:
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        ok = code == 0 and summary.get("status") == "finished"
        entry["status"] = "finished" if ok else "failed"
        entry["exit_code"] = code
        if self.metric:
            value = (summary.get("metrics") or {}).get(self.metric)
            entry["metric"] = float(value) if isinstance(value, (int, float)) else None
        entry["run_dir"] = str(summary_path.parent)
        self.save()

    def run(self, count: int | None, parallel: int, extra: list[str]) -> None:
        todo = [r for r in self.runs if r["status"] != "finished"]  # interrupted or failed: run them again
        started = 0
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            futures = []
            while count is None or started < count:
                entry = todo.pop(0) if todo else self.propose()
                if entry is None:
                    break
                futures.append(pool.submit(self.execute, entry, extra))
                started += 1
                if len(futures) >= parallel:  # the engine proposes from finished results, not guesses
                    for f in futures:
                        f.result()
                    futures = []
            for f in futures:
                f.result()

    # ---- report -----------------------------------------------------------------------------------
    def ranked(self) -> list[dict[str, Any]]:
        done = [r for r in self.runs if r["status"] == "finished"]
        if not self.metric:
            return done
        sign = -1 if self.goal == "maximize" else 1
        return sorted(done, key=lambda r: (r["metric"] is None, sign * (r["metric"] or 0.0)))

    def report(self) -> str:
        keys = sorted({k for r in self.runs for k in r["params"]})
        header = ["rank", "run", *keys, self.metric or "metric", "status"]
        rows = [
            [
                str(i + 1),
                r["name"],
                *(str(r["params"].get(k)) for k in keys),
                f"{r['metric']:.6g}" if r.get("metric") is not None else "—",
                r["status"],
            ]
            for i, r in enumerate(self.ranked())
        ]
        rows += [
            ["—", r["name"], *(str(r["params"].get(k)) for k in keys), "—", r["status"]]
            for r in self.runs
            if r["status"] != "finished"
        ]
        with open(self.dir / "results.csv", "w", newline="") as f:
            csv.writer(f).writerows([header, *rows])
        md = "\n".join(
            [
                f"# sweep {self.name} ({self.cfg['method']}, {self.goal} {self.metric})",
                "",
                "| " + " | ".join(header) + " |",
                "|" + "---|" * len(header),
                *("| " + " | ".join(row) + " |" for row in rows),
            ]
        )
        atomic_write_text(self.dir / "results.md", md + "\n")
        self._plot(keys)
        return md

    def _plot(self, keys: list[str]) -> None:
        done = [r for r in self.ranked() if r.get("metric") is not None]
        if not done or not keys:
            (self.dir / "sweep.png").unlink(missing_ok=True)  # a plot of an earlier state would mislead
            return
        import matplotlib  # a second to import: only when a sweep has results to plot

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3), squeeze=False)
        for ax, k in zip(axes[0], keys):
            xs = [r["params"].get(k) for r in done]
            labels = sorted({str(x) for x in xs}, key=lambda s: (len(s), s))
            numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
            ax.scatter(xs if numeric else [labels.index(str(x)) for x in xs], [r["metric"] for r in done])
            if not numeric:
                ax.set_xticks(range(len(labels)), labels, rotation=30)
            ax.set_xlabel(k.rsplit(".", 1)[-1])
            ax.set_ylabel(self.metric)
            ax.grid(alpha=0.3)
        fig.suptitle(f"sweep {self.name}")
        fig.tight_layout()
        fig.savefig(self.dir / "sweep.png", dpi=100)
        plt.close(fig)


def error_line(log_path: Path, start: int = 0) -> str | None:
    """The line of a failed run's log (from byte ``start``: this attempt) that says why: litlab's own one-line
    error, else the last exception line of a traceback, else the last line."""
    try:
        with open(log_path, errors="replace") as f:
            f.seek(start)
            lines = [line.strip() for line in f if line.strip()]
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        if line.startswith("litlab: error:"):
            return line.removeprefix("litlab: error:").strip()
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", line) or line.startswith("error:"):
            return line
    return lines[-1] if lines else None


def _resolve_litlab(cmd: list[str]) -> list[str]:
    """``litlab`` from this interpreter's environment when it is not on PATH (e.g. an unactivated venv)."""
    if cmd and cmd[0] == "litlab" and shutil.which("litlab") is None:
        beside = Path(sys.executable).parent / "litlab"
        return [str(beside), *cmd[1:]] if beside.exists() else [sys.executable, "-m", "litlab", *cmd[1:]]
    return cmd


def _finished(summary_path: Path) -> bool:
    try:
        return json.loads(summary_path.read_text()).get("status") == "finished"
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="litlab sweep", description=__doc__.split("\n")[0])
    parser.add_argument("sweep_file", type=Path)
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="run at most N more runs (default: until grid is exhausted; required for random/bayes)",
    )
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument(
        "--out", type=Path, default=Path("runs/sweeps"), help="sweeps root (default runs/sweeps)"
    )
    parser.epilog = "Arguments after `--` go to every run (e.g. -- --trainer.max_steps=50)."
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.parallel < 1:
        parser.error(f"--parallel={args.parallel} must be >= 1")
    if args.count is not None and args.count < 0:
        parser.error(f"--count={args.count} must be >= 0")
    try:
        sweep = LocalSweep(args.sweep_file, args.out)
    except SweepError as err:
        print(f"litlab sweep: {err}", file=sys.stderr)
        return 2
    if sweep.cfg["method"] != "grid" and args.count is None:
        parser.error(f"method={sweep.cfg['method']!r} never runs out of proposals: give --count N")
    try:
        sweep.check_first(extra)
    except SweepError as err:
        print(f"litlab sweep: {err}", file=sys.stderr)
        return 2
    sweep.run(args.count, args.parallel, extra)
    print(sweep.report())
    plot = sweep.dir / "sweep.png"
    print(
        f"\nresults: {sweep.dir / 'results.md'}"
        + (f", plot: {plot}" if plot.exists() else ", no plot (no run logged the metric)"),
        file=sys.stderr,
    )
    return 0 if all(r["status"] == "finished" for r in sweep.runs) else 1
