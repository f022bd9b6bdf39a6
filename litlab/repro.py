"""``litlab repro <slug>``: run a paper's method and its baselines over seeds, judge the card's claims, report.

Every run goes through the same LightningCLI path as ``litlab fit`` (``LitlabCLI``), with the card's overrides,
into ``runs/repro/<slug>/<config stem>/<config hash>-s<seed>/``, on one torch thread (so that a number does not
depend on ``--jobs``). A run whose ``summary.json`` says finished is reused (also by another card entry with the
same resolved config), so an interrupted reproduction resumes. The report (``report.md``, ``results.json``, a
plot) goes to ``runs/repro/<slug>/``. Exit codes: 1 when a claim the card recorded as passing fails now, or
(``--check-recorded``) when a seed's number moved beyond the card's determinism tolerance; 2 when the card is
refused (invalid, or a claim that cannot tell the method from a baseline).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import traceback
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from litlab.__main__ import prepare_process
from litlab.card_report import plot, print_table, render_markdown
from litlab.cards import SCALES, Card, check_seed_ledgers, claims_sha256, load_card, project_path
from litlab.claims import (
    ClaimResult,
    card_verdict,
    drift,
    evaluate_claim,
    judge_recorded,
    load_checked_card,
    mark_fragile,
    mismatches,
    null_table,
    recorded_values,
    refutations,
    regressions,
    seed_std,
)
from litlab.full_plan import full_scale_table, print_run_plan
from litlab.lit_modules.core.errors import (
    CardError,
    ConfigError,
    ResourceUnavailableError,
    RunFailed,
    RunPreempted,
    RunStopped,
)
from litlab.lit_modules.core.io import atomic_write_json, atomic_write_text
from litlab.lit_modules.core.results import CardResult, ReportExtras, RunResult, SeedRun
from litlab.verdicts import list_cards

# Many runs in one terminal: a table at the end says more than a progress bar per run (none of these
# change what a run computes, so they leave its identity hash alone).
QUIET_RUN_ARGS = ("--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false")


def override_args(overrides: dict[str, Any]) -> list[str]:
    """``{"model.init_args.mode": "lora"}`` -> ``["--model.init_args.mode=lora"]`` (YAML flow for non-strings)."""
    args = []
    for key, value in overrides.items():
        text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
        text = text[:-4].rstrip() if text.endswith("\n...") else text.removesuffix("...").strip()
        args.append(f"--{key}={text}")
    return args


def _finish_wandb_run() -> None:
    """In-process runs would otherwise all log into the first run's wandb run."""
    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish()


@dataclasses.dataclass(frozen=True)
class FitRequest:
    """One fit of a card (a run at a seed): built once, passed to a ``--jobs`` worker as this object (JSON),
    and turned into LightningCLI's arguments only where it is fitted (``cli_args``)."""

    run: str
    seed: int  # the run's one seed (seed_everything); every component derives its stream from it
    config: str
    overrides: dict[str, Any]
    experiment: str
    runs_dir: str
    extra: tuple[str, ...] = ()

    def cli_args(self) -> list[str]:
        return [
            "fit",
            f"--config={self.config}",
            *override_args(self.overrides),
            f"--seed_everything={self.seed}",
            f"--experiment={self.experiment}",
            f"--runs_dir={self.runs_dir}",
            *QUIET_RUN_ARGS,
            *self.extra,
        ]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FitRequest:
        return cls(**{**raw, "extra": tuple(raw.get("extra") or ())})


def fit_request(
    card: Card, run_name: str, scale: str, seed: int, out_dir: Path, extra: list[str]
) -> FitRequest:
    spec = card.runs[run_name]
    config = project_path(spec.config_path(scale))
    if not config.exists():
        raise CardError(f"{card.path}: runs.{run_name} config {config} does not exist")
    return FitRequest(
        run=run_name,
        seed=int(seed),
        config=str(config),
        overrides=spec.all_overrides(scale),
        experiment=Path(spec.config_path(scale)).stem,
        runs_dir=str(out_dir),
        extra=tuple(extra),
    )


_CHILD_REUSED = 3  # exit code of a child whose run had already finished


def _child_fit(request: FitRequest) -> int:
    """One fit in a ``--jobs`` worker, skipped when it already finished."""
    # Lightning and every method module (seconds): only in a process that fits
    from litlab.cli import LitlabCLI, RunAlreadyFinished

    sys.argv = sys.argv[:1]  # the args come as `args`; LightningCLI warns when they come from both places
    try:
        LitlabCLI(args=request.cli_args(), skip_finished=True)
    except RunAlreadyFinished:
        return _CHILD_REUSED
    finally:
        _finish_wandb_run()
    return 0


def _exit_with_parent(poll_s: float = 1.0) -> None:
    """A worker stops when the ``litlab repro`` that started it dies (even by SIGKILL), not after its fit."""
    # the pid comes from the parent: a parent that died before this line ran would otherwise go unnoticed
    parent = int(os.environ.get("LITLAB_REPRO_PID", os.getppid()))

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="litlab-parent-watcher").start()


def _worker_loop() -> int:
    """A ``--jobs`` worker process: imports once (litlab.cli imports every method module: seconds), then fits
    one task per line of stdin (``{"request": FitRequest as JSON, "log": path}``), each with its output in its own log file,
    and answers each task's exit code on a line of its stdout, exactly as a process per fit would (in-process
    fits one after another are what ``--jobs 1`` does)."""
    prepare_process()
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    _exit_with_parent()
    control = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        task = json.loads(line)
        with open(task["log"], "wb") as log:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                code = _child_fit(FitRequest.from_json(task["request"]))
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
            except BaseException:  # the run's error goes to its log; the worker takes the next task
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
        control.write(f"{code}\n")
        control.flush()
    return 0


def fit_in_subprocesses(jobs: dict[str, FitRequest], workers: int, log_dir: Path) -> set[str]:
    """Fit each distinct request in a pool of ``workers`` processes; returns the keys that ran.

    Separate processes, one thread each, are how a 20-run card uses every core: in one process the runs of a
    card are sequential and tiny models cannot keep two cores busy. Each worker lives for the whole card (one
    import, not one per fit) and writes ``log_dir/<key>.log`` per fit.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "LITLAB_REPRO_PID": str(os.getpid()),
    }
    code = "import sys; from litlab.repro import _worker_loop; sys.exit(_worker_loop())"
    # -P (Python >= 3.11; importing litlab does the same on 3.10): the working directory is not put on sys.path. In a checkout its top-level `kernels/` folder would
    # shadow the `kernels` distribution that transformers imports (ImportError in every worker's fit).
    pending: queue.Queue[str] = queue.Queue()
    for key in jobs:
        pending.put(key)
    exit_codes: dict[str, int] = {}

    def serve() -> None:
        proc = subprocess.Popen(
            [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=Path.cwd(),
            text=True,
        )
        assert proc.stdin is not None and proc.stdout is not None  # both are pipes
        try:
            while True:
                try:
                    key = pending.get_nowait()
                except queue.Empty:
                    break
                proc.stdin.write(
                    json.dumps({"request": jobs[key].to_json(), "log": str(log_dir / f"{key}.log")}) + "\n"
                )
                proc.stdin.flush()
                answer = proc.stdout.readline()
                if not answer:  # the worker died (killed, out of memory): the rest go to another worker
                    exit_codes[key] = proc.wait()
                    return
                exit_codes[key] = int(answer)
        finally:
            if proc.poll() is None:
                proc.stdin.close()
                proc.wait()

    threads = [threading.Thread(target=serve) for _ in range(min(workers, len(jobs)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ran = set()
    for key in jobs:
        code_ = exit_codes.get(key)
        if code_ not in (0, _CHILD_REUSED):  # rerun in-process next, where its error surfaces as usual
            what = "no worker ran it" if code_ is None else f"its worker answered {code_}"
            print(f"litlab repro: {key}: {what} (log {log_dir / f'{key}.log'})", file=sys.stderr)
        elif code_ == 0:
            ran.add(key)
    return ran


def run_one(card: Card, request: FitRequest) -> SeedRun:
    """One LightningCLI fit; returns its summary (reused when it already finished)."""
    import torch

    from litlab.cli import LitlabCLI, RunAlreadyFinished  # see _child_fit

    run_name, seed = request.run, request.seed

    reused = True
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when args come from both places
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a --jobs worker: float sums round by thread count
    try:
        cli = LitlabCLI(args=request.cli_args(), skip_finished=True)
        run_dir = cli.run_dir
        reused = False
    except RunAlreadyFinished as done:
        run_dir = done.run_dir
    except RunStopped as stopped:  # diverged or preempted: a failed run, never a number
        raise RunFailed(f"run {run_name} seed {seed} did not finish: {stopped.status}") from stopped
    finally:
        torch.set_num_threads(threads)
        sys.argv = argv
        _finish_wandb_run()
    assert run_dir is not None  # LitlabCLI sets it before it fits
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("status") != "finished":
        raise RunFailed(f"run {run_name} seed {seed} did not finish: {summary.get('status')} ({run_dir})")
    metric = card.run_metric(run_name)
    if metric not in summary["metrics"]:
        raise KeyError(f"run {run_name} logged no metric {metric!r}; it logged {sorted(summary['metrics'])}")
    return SeedRun(
        seed=seed,
        value=float(summary["metrics"][metric]),
        run_dir=Path(run_dir),
        reused=reused,
        wall_time_s=summary.get("wall_time_s"),
    )


def validate_runs(card: Card, requests: dict[str, list[FitRequest]], scale: str) -> None:
    """Resolve and parse every run's config (at its first seed) through the ``litlab fit`` parser
    before the first fit, so that a card whose last run names a missing file or a bad key stops at once with
    that run's name instead of after the runs before it trained. (Claims are checked when the card loads.)"""
    from litlab.cli import check_fit_args  # see _child_fit

    for name, per_seed in requests.items():
        try:
            check_fit_args(per_seed[0].cli_args())
        except ConfigError as err:
            raise CardError(
                f"{card.path}: runs.{name}: {card.runs[name].config_path(scale)} is refused: {err}"
            ) from err


def reproduce(
    card: Card,
    scale: str = "quick",
    seeds: list[int] | None = None,
    only: list[str] | None = None,
    out_root: Path = Path("runs/repro"),
    extra: list[str] | None = None,
    include_optional: bool = False,
    jobs: int = 1,
    trusted_hooks: tuple[str, ...] = (),
) -> CardResult:
    seeds = list(seeds if seeds is not None else card.seeds[scale])
    runs = card.runs_for(scale)
    if only:
        unknown = set(only) - set(runs)
        if unknown:
            raise CardError(
                f"--only names unknown runs {sorted(unknown)}; the card has {sorted(runs)} at scale {scale}"
            )
        runs = {n: runs[n] for n in only}
    elif not include_optional:
        runs = {n: r for n, r in runs.items() if not r.optional}
    out_dir = out_root / card.slug
    # every (run, seed) becomes one request, once (CardError here: a config that does not exist)
    requests = {n: [fit_request(card, n, scale, s, out_dir, list(extra or [])) for s in seeds] for n in runs}
    if seeds:
        validate_runs(card, requests, scale)
    started = time.time()
    fitted_here: set[Path] = set()  # run folders fitted by this invocation (shared by entries of one run)
    fitted_keys: set[str] = set()  # the _fit_key of every request a --jobs worker fitted
    if jobs > 1:
        distinct: dict[str, FitRequest] = {}
        for name, per_seed in requests.items():
            for req in per_seed:
                if _fit_key(req) not in {_fit_key(r) for r in distinct.values()}:  # same config, other name
                    distinct[f"{name}-s{req.seed}"] = req
        fitted_keys = {_fit_key(distinct[k]) for k in fit_in_subprocesses(distinct, jobs, out_dir / "logs")}
    per_run: dict[str, RunResult] = {}
    for name, per_seed in requests.items():
        values = []
        for req in per_seed:
            v = run_one(card, req)
            if _fit_key(req) in fitted_keys:
                v.reused = False  # a worker fitted it; run_one only read its summary
            if not v.reused:
                fitted_here.add(v.run_dir)
            elif v.run_dir in fitted_here:  # another entry of this card fitted it moments ago
                v.reused = False
            values.append(v)
        xs = [v.value for v in values]
        per_run[name] = RunResult(
            name=name,
            metric=card.run_metric(name),
            seeds=seeds,
            values=xs,
            mean=statistics.fmean(xs),
            std=seed_std(xs),
            runs=values,
            metrics=read_metrics(card, name, values),
        )
    result = CardResult(
        slug=card.slug,
        title=card.title,
        claim=card.claim,
        scale=scale,
        seeds=seeds,
        metric_name=card.metric.name,
        metric_mode=card.metric.mode,
        runs=per_run,
        date=date.today().isoformat(),
        wall_time_s=round(time.time() - started, 1),
    )
    problems = check_seed_ledgers(
        card, {n: {v.seed: _ledger(v.run_dir) for v in r.runs} for n, r in per_run.items()}, scale
    )
    if problems:
        raise CardError(f"{card.path}: refused, on its runs' seed ledgers: " + "; ".join(problems))
    result.roles, result.design_claims = card_design(card)
    call_report_hook(card, result, out_dir, trusted_hooks)
    judge(card, result)
    return result


def card_design(card: Card) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Every run's role and every claim as plain data: what a report hook may read of the card."""
    claims = [
        {
            "id": c.id,
            "kind": c.kind,
            "method": str(c.method) if c.method else "",
            "against": [str(a) for a in c.against],
            "value": c.value,
            "headline": c.headline,
            "control": c.control,
        }
        for c in card.claims
    ]
    return {name: spec.role for name, spec in card.runs.items()}, claims


def _fit_key(req: FitRequest) -> str:
    """What decides a fit's result: card entries whose requests agree on it share one run folder."""
    return json.dumps({k: v for k, v in req.to_json().items() if k != "run"}, sort_keys=True, default=str)


def _ledger(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("seed_ledger")
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_metrics(card: Card, run_name: str, seed_runs: list[SeedRun]) -> dict[str, list[float]]:
    """Per seed, every metric the card's claims read from this run (each must be logged), and the card's other
    metrics where the run logged them (a baseline or floor is a stand-in for every claim on its metrics)."""
    needed = card.metrics_of(run_name)
    out: dict[str, list[float]] = {}
    summaries = [r.summary_metrics() for r in seed_runs]
    for metric in [*needed, *(m for m in card.metrics if m not in needed)]:
        if all(metric in s for s in summaries):
            out[metric] = [float(s[metric]) for s in summaries]
        elif metric in needed:
            logged = sorted(summaries[0]) if summaries else []
            raise KeyError(
                f"run {run_name} logged no metric {metric!r} (a claim reads it); it logged {logged}"
            )
    return out


def measured_values(result: CardResult) -> dict[str, dict[str, dict[int, float]]]:
    """Run -> metric -> {seed: value} of a reproduction."""
    return {
        name: {metric: dict(zip(r.seeds, xs)) for metric, xs in r.metrics.items()}
        for name, r in result.runs.items()
    }


def judge(card: Card, result: CardResult) -> None:
    """Claims, card status, regressions, refutations and per-seed mismatches of ``result``, in place."""
    import torch  # for torch.cuda (seconds to import): only when claims are judged

    values = measured_values(result)
    result.claims = [
        evaluate_claim(card, c, values, result.extras.numbers, has_cuda=torch.cuda.is_available())
        for c in card.claims_for(result.scale)
    ]
    mark_fragile(card, result.claims, values, result.extras.numbers)
    result.status, result.status_reason = card_verdict(card, result.claims, result.scale)
    result.regressions = regressions(card, result.scale, result.claims)
    result.refutations = refutations(card, values)
    result.mismatches = mismatches(card, result.scale, values)


def check_report_hook(card: Card, trusted: tuple[str, ...] = ()) -> None:
    """A card is data, but its ``report_hook`` names code that ``litlab repro`` would import and call: only hooks
    inside litlab, or in a module the user named with ``--trust-hooks``, are run (README, "What runs code")."""
    if not card.report_hook:
        return
    module_name = card.report_hook.split(":")[0].strip()
    if module_name == "litlab" or module_name.startswith("litlab.") or module_name in trusted:
        return
    raise CardError(
        f"{card.path}: report_hook {card.report_hook!r} is outside litlab and would run that module's code; "
        f"if you trust it, pass --trust-hooks {module_name}"
    )


def call_report_hook(card: Card, result: CardResult, out_dir: Path, trusted: tuple[str, ...] = ()) -> None:
    """A card's ``report_hook: "module:function"`` adds what a table of means cannot show.

    It is called as ``fn(result, out_dir) -> ReportExtras`` after all runs finished (``litlab.lit_modules.core.results``
    documents both types): figures it wrote under ``out_dir``, a markdown section for report.md, and numbers derived
    from the runs, which go into results.json and, with ``--record``, into the card's ``recorded:``.
    """
    if not card.report_hook:
        return
    check_report_hook(card, trusted)
    module_name, fn_name = card.report_hook.split(":")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as err:
        raise CardError(f"{card.path}: report_hook {card.report_hook!r} cannot be imported: {err}") from err
    extras = fn(result, out_dir)
    if not isinstance(extras, ReportExtras):
        raise CardError(
            f"{card.path}: report_hook {card.report_hook} returned {type(extras).__name__}, "
            "not a ReportExtras"
        )
    result.extras = extras


def claim_entry(c: ClaimResult) -> dict[str, Any]:
    """A claim's result as the card's ``recorded:`` block keeps it."""
    entry: dict[str, Any] = {"verdict": c.verdict}
    if c.headline or c.control:
        entry["role"] = "headline" if c.headline else "control"
    if c.comparisons:
        entry["vs"] = {
            x.against: {
                "n": x.n_pairs if x.paired else [x.n_method, x.n_against],
                "diff": round(x.diff, 6),
                "ci95": [round(x.ci_low, 6), round(x.ci_high, 6)],
                "margin": round(x.margin, 6),
                **({"paired": True} if x.paired else {}),
                **({"reach": True} if x.reach else {}),  # fractions of seeds that reach (censored)
            }
            for x in c.comparisons
        }
    if c.headline and c.comparisons:
        if c.mde is not None:  # None: judged on reach fractions only (censored)
            entry["mde"] = round(c.mde, 6)
        entry["paper_effect"] = round(c.paper_effect or 0.0, 6)
        if c.sensitivity:
            entry["sensitivity"] = c.sensitivity
    if c.value is not None:
        entry["value"] = [round(v, 6) for v in c.value] if isinstance(c.value, list) else round(c.value, 6)
    if c.reason:
        entry["reason"] = c.reason
    if c.fragile:
        entry["fragile"] = True  # flips within the card's determinism tolerance
    return entry


def _result_entry(seeds: list[int], metrics: dict[str, list[float]]) -> dict[str, Any]:
    return {
        "seeds": list(seeds),
        "metrics": {
            m: {
                "values": [round(v, 6) for v in xs],
                "mean": round(statistics.fmean(xs), 6),
                "std": round(seed_std(xs), 6),
            }
            for m, xs in metrics.items()
        },
    }


def judged_block(card: Card, recorded: dict[str, Any], keep_hash: bool) -> dict[str, Any]:
    """``recorded`` with every claim judged on its numbers, the status and the claims' hash."""
    import torch  # see judge

    probe = dataclasses.replace(card, recorded=recorded)
    results = judge_recorded(probe, has_cuda=torch.cuda.is_available())
    status, reason = card_verdict(card, results, str(recorded.get("scale", "quick")))
    head: dict[str, Any] = {k: recorded[k] for k in ("date", "command", "scale", "seeds") if k in recorded}
    sha = (
        recorded.get("claims_sha256") if keep_hash and recorded.get("claims_sha256") else claims_sha256(card)
    )
    tail = {
        k: v
        for k, v in recorded.items()
        if k not in head and k not in ("status", "status_reason", "claims_sha256", "claims")
    }
    return {
        **head,
        "status": status,
        "status_reason": reason,
        "claims_sha256": sha,
        **{k: tail.pop(k) for k in ("wall_time_s", "reused_runs") if k in tail},
        "claims": {c.id: claim_entry(c) for c in results},
        **tail,
    }


def write_recorded(card: Card, block: dict[str, Any]) -> None:
    """Replace the card's ``recorded:`` block (kept last in the file)."""
    assert card.path is not None
    text = card.path.read_text()
    head = text.split("\nrecorded:", 1)[0].rstrip() + "\n"
    dumped = yaml.safe_dump({"recorded": block}, sort_keys=False, width=110, default_flow_style=None)
    atomic_write_text(card.path, head + dumped)


def record_into_card(card: Card, res: CardResult, command: str) -> None:
    """Write this run's measured numbers into the card's ``recorded:`` block, with every claim judged on them
    and the hash of the claims they were judged by (pre-registration: a later change needs an amendment)."""
    results = {n: _result_entry(r.seeds, r.metrics) for n, r in res.runs.items()}
    block: dict[str, Any] = {
        "date": res.date,
        "command": command,
        "scale": res.scale,
        "seeds": res.seeds,
        "wall_time_s": res.wall_time_s,
        "reused_runs": res.reused_runs,  # > 0: wall_time_s did not time those runs
        "results": results,
    }
    # runs this invocation did not repeat (optional runs, --only) keep their earlier numbers
    earlier = card.recorded if card.recorded.get("scale") == res.scale else {}
    for name, entry in (earlier.get("results") or {}).items():
        if name in card.runs and name not in res.runs:
            results[name] = {
                **entry,
                "from": entry.get("from") or f"{earlier.get('date')}: {earlier.get('command')}",
            }
    default_runs = {n for n, r in card.runs_for(res.scale).items() if not r.optional}
    if earlier and not default_runs <= set(res.runs):
        # a partial invocation (--only): the card's date, command and timing stay those of its last full
        # one; the runs measured now say where they come from
        for key in ("date", "command", "wall_time_s", "reused_runs"):
            if key in earlier:
                block[key] = earlier[key]
            else:
                block.pop(key, None)
        for name in res.runs:
            results[name]["from"] = f"{res.date}: {command} ({res.wall_time_s} s)"
    # a partial invocation keeps the derived numbers of the runs it did not measure; a full one writes only its own
    # (a number the report hook no longer derives does not linger in the card)
    kept = (earlier.get("derived") or {}) if earlier and not default_runs <= set(res.runs) else {}
    derived = {**kept, **{k: round(v, 6) for k, v in res.extras.numbers.items()}}
    if derived:
        block["derived"] = derived
    write_recorded(card, judged_block(card, block, keep_hash=False))


def rejudge_card(card: Card) -> dict[str, Any]:
    """Judge the card's claims again on its recorded numbers (after an amendment) and write the verdicts; the
    recorded hash stays that of the claims the numbers were measured under."""
    if not card.recorded:
        raise CardError(f"{card.path}: nothing recorded to judge")
    block = judged_block(card, dict(card.recorded), keep_hash=True)
    write_recorded(card, block)
    return block


def print_null(card: Card) -> int:
    """``--null``: each comparative claim re-evaluated on the recorded numbers with every baseline or floor
    run in the method's place; exit 2 when a passing claim survives a substitution."""
    scale = str(card.recorded.get("scale", "quick"))
    rows = null_table(card, recorded_values(card, scale))
    print(
        f"{card.slug}: recorded numbers ({scale}), each claim with each baseline/floor in the method's place"
    )
    print(f"{'claim':34s} {'verdict':8s} {'stand-in':40s} with the stand-in")
    survivors = 0
    for claim, actual, ref, holds in rows:
        bad = actual.holds and holds
        survivors += int(bool(bad))
        label = "HOLDS: refused" if bad else ("holds" if holds else "fails")
        print(f"{claim.id:34s} {actual.verdict:8s} {str(ref):40s} {label}")
    untested = [
        c.id for c in card.claims if c.comparative and not c.control and c.id not in {r[0].id for r in rows}
    ]
    if untested:
        print("no stand-in with recorded values (or not judged): " + ", ".join(untested))
    problems = refutations(card, recorded_values(card, scale))
    for p in problems:
        print(f"REFUSED {p}")
    return 2 if problems else 0


def print_plan(
    card: Card, scale: str, seeds: list[int] | None, only: list[str] | None, include_optional: bool
) -> int:
    """The fits a reproduction would run, one line per run (nothing is imported or built)."""
    seeds = list(seeds if seeds is not None else card.seeds[scale])
    runs = card.runs_for(scale)
    chosen = {n: r for n, r in runs.items() if (n in only if only else include_optional or not r.optional)}
    unknown = set(only or ()) - set(runs)
    if unknown:
        print(f"litlab repro: --only names unknown runs {sorted(unknown)}; the card has {sorted(runs)}")
        return 2
    print(
        f"{card.slug} at scale {scale}: {len(chosen)} runs x {len(seeds)} seeds {seeds} = {len(chosen) * len(seeds)} fits"
    )
    hours = shared = 0.0
    for name, spec in chosen.items():
        overrides = " ".join(override_args(spec.all_overrides(scale))) or "(none)"
        print(f"  {name:<24} {spec.role:<9} {spec.config_path(scale)}  {overrides}")
        if scale == "full":  # what it costs: parameters, memory, GPU-hours, slurm (litlab/full_plan.py)
            est = print_run_plan(spec.config_path(scale), override_args(spec.all_overrides(scale)), seeds)
            hours += est.gpu_hours * len(seeds) if est else 0.0
            shared = max(shared, est.shared_gpu_hours * len(seeds) if est else 0.0)
    if scale == "full" and chosen:
        also = f" (+ {shared:,.3g} for their shared stage, once per seed)" if shared else ""
        print(f"  in all: {hours:,.3g} H100 GPU-hours for these {len(chosen) * len(seeds)} fits{also}")
    if scale == "full" and not chosen:
        print(f"  the card has no full-scale run; its config configs/{card.slug}/full.yaml as it stands:")
        print_run_plan(f"configs/{card.slug}/full.yaml", [], seeds)
    left_out = sorted(set(runs) - set(chosen))
    if left_out:
        print(f"  not run: {', '.join(left_out)} (optional: --all, or name them with --only)")
    return 0


def print_drift(card: Card, res: CardResult) -> None:
    """Per run: how far its numbers moved from the recorded ones, and whether within the card's tolerance."""
    tol = card.determinism
    print(f"\nagainst the recorded numbers (determinism: {tol.describe()}):")
    if tol.wall_clock:
        print(f"  not compared (wall-clock timings, machine-dependent): {', '.join(tol.wall_clock)}")
    for d in drift(card, res.scale, measured_values(res)):
        verdict = "within tolerance" if d.within else f"MOVED beyond tolerance ({d.beyond} values)"
        print(f"  {d.run:<28} {d.compared:>3} values  max |measured - recorded| {d.max_abs:.3g}  {verdict}")
    shaky = [c.id for c in res.claims if c.fragile]
    if shaky:
        print(f"  fragile (flip within the tolerance): {', '.join(shaky)}")


# ---- command line -------------------------------------------------------------------------------
def seed_list(text: str) -> list[int]:
    """``--seeds 0,1,2``: comma-separated seeds, each in ``[0, 2**32)`` (NumPy's range)."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, got {text!r}") from None
    bad = [s for s in seeds if not 0 <= s < 2**32]
    if bad or not seeds:
        raise argparse.ArgumentTypeError(f"--seeds must be integers in [0, 2**32), got {text!r}")
    return seeds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="litlab repro", description=__doc__.split("\n")[0])
    parser.add_argument("slug", nargs="?", help="card name (seeds/<slug>.yaml) or a path to a card file")
    parser.add_argument("--list", action="store_true", help="list cards and their recorded status")
    parser.add_argument("--markdown", action="store_true", help="with --list: the README's methods table")
    parser.add_argument(
        "--scale",
        choices=list(SCALES),
        default="quick",
        help="quick (default), medium (where the card has one: real pretrained models, <= 30 min) or full",
    )
    parser.add_argument(
        "--seeds",
        type=seed_list,
        default=None,
        help="comma-separated seeds (default: the card's)",
    )
    parser.add_argument("--only", type=lambda s: s.split(","), default=None, help="comma-separated run names")
    parser.add_argument("--all", action="store_true", help="also the card's optional (long) runs")
    parser.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=1,
        help="run the card's runs in this many worker processes (one thread each; default 1)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="report root (default runs/repro; with --stand-in runs/repro-stand-in, apart from the card's numbers)",
    )
    parser.add_argument(
        "--stand-in",
        action="store_true",
        help="with --scale full: each run on the card's stand-in (litlab.standin: tiny models of the full "
        "config's classes, a few records of its data, CPU), its arguments after the run's own overrides",
    )
    parser.add_argument(
        "--record", action="store_true", help="write the measured numbers into the card's recorded: block"
    )
    parser.add_argument(
        "--null",
        action="store_true",
        help="re-evaluate the recorded numbers with every baseline/floor run in the method's place; run nothing",
    )
    parser.add_argument(
        "--rejudge",
        action="store_true",
        help="judge the claims again on the recorded numbers (after an amendment) and write the verdicts; run nothing",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the fits this invocation would run (run, role, seeds, config, overrides); run nothing",
    )
    parser.add_argument(
        "--full-scale-table",
        action="store_true",
        help="print docs/full-scale.md: every card's full-scale runs with their parameters, memory and GPU-hours",
    )
    parser.add_argument(
        "--check-recorded",
        action="store_true",
        help="exit 1 when a seed's number differs from the recorded one beyond the card's determinism tolerance",
    )
    parser.add_argument(
        "--trust-hooks",
        type=lambda s: tuple(m.strip() for m in s.split(",") if m.strip()),
        default=(),
        metavar="MODULE[,MODULE]",
        help="run a card's report_hook from these modules too (a hook runs code; by default only litlab's own)",
    )
    parser.epilog = "Arguments after `--` go to every run's LightningCLI (e.g. -- --trainer.accelerator=gpu)."
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.stand_in and args.scale != "full":
        parser.error(f"--stand-in runs the full-scale config: give --scale full (got --scale {args.scale})")
    if args.stand_in and (args.record or args.check_recorded):
        parser.error(
            "--stand-in numbers are a tiny random model's, not the card's: no --record or --check-recorded"
        )
    args.out = args.out or Path("runs/repro-stand-in" if args.stand_in else "runs/repro")
    if args.list:
        return list_cards(markdown=args.markdown)
    if args.full_scale_table:
        print(full_scale_table(override_args), end="")
        return 0
    if not args.slug:
        parser.error("give a card slug (see `litlab repro --list`)")
    for name in ("lightning.pytorch", "lightning.fabric"):  # per-run banners drown the report
        logging.getLogger(name).setLevel(logging.WARNING)
    card_path = (
        Path(args.slug) if args.slug.endswith((".yaml", ".yml")) else project_path(f"seeds/{args.slug}.yaml")
    )
    try:
        # --null and --rejudge show and settle what the falsifiability check refuses
        card = load_checked_card(card_path, check_falsifiable=not (args.null or args.rejudge))
        if args.rejudge:
            block = rejudge_card(card)
            print(f"{card.slug}: {block['status']} ({block['status_reason']})")
            card = load_card(card_path)
        if args.null or args.rejudge:
            return print_null(card)
        # a full-scale plan of a card without full-scale runs still plans its full config
        if not card.runs_for(args.scale) and not (args.plan and args.scale == "full"):
            raise CardError(
                f"{card_path}: the card has no runs at scale {args.scale!r} (a run names its scales, e.g. "
                f"'scales: [medium]'; its scales: {sorted({s for r in card.runs.values() for s in r.scales})})"
            )
        if args.plan:
            return print_plan(card, args.scale, args.seeds, args.only, args.all)
        check_report_hook(card, args.trust_hooks)  # before the runs, not after an hour of them
        if args.stand_in:  # written once, shared by every run and seed (and by --jobs workers)
            from litlab.standin import prepared_stand_in

            extra = [*prepared_stand_in(card.slug, args.out / card.slug / "stand_in"), *extra]
    except ConfigError as err:  # a card without a stand-in
        print(f"litlab repro {args.slug}: {err}", file=sys.stderr)
        return 2
    except CardError as err:
        print(f"litlab repro: {err}", file=sys.stderr)
        return 2
    try:
        res = reproduce(
            card,
            args.scale,
            args.seeds,
            args.only,
            args.out,
            extra,
            include_optional=args.all,
            jobs=args.jobs,
            trusted_hooks=args.trust_hooks,
        )
    except RunFailed as err:  # a diverged or failed run: the card gets no number for it, and says so
        print(f"litlab repro {card.slug}: {err}; no result is recorded", file=sys.stderr)
        atomic_write_text(
            args.out / card.slug / "report.md",
            f"# {card.title} — reproduction ({args.scale}): no result\n\n{err}.\n\nA diverged, preempted or "
            "failed run is never recorded as a number: nothing was judged and the card's recorded block is "
            "unchanged. Its status and attempts are in the run folder's summary.json.\n",
        )
        # preempted: 143 (SIGTERM) as for `litlab fit`, so a scheduler's wrapper requeues rather than gives up
        return err.__cause__.exit_code if isinstance(err.__cause__, RunPreempted) else 1
    except (CardError, ResourceUnavailableError) as err:
        # a full-scale run on a machine without the model or data: say what is missing, no traceback
        print(f"litlab repro {card.slug} --scale {args.scale}: {err}", file=sys.stderr)
        return 2
    # a machine's own folders stay out of the card: an absolute --out is recorded as a placeholder
    command = "litlab repro " + " ".join(
        "<out folder>" if i and argv[i - 1] == "--out" and Path(a).is_absolute() else a
        for i, a in enumerate(argv)
    )
    out_dir = args.out / card.slug
    atomic_write_json(out_dir / "results.json", res.to_json())
    atomic_write_text(out_dir / "report.md", render_markdown(card, res, command))
    plot(res, out_dir / f"{card.slug}_{args.scale}.png")
    print_table(card, res)
    print(f"report: {out_dir / 'report.md'}", file=sys.stderr)
    if res.refutations:
        print("litlab repro: card refused: " + "; ".join(res.refutations), file=sys.stderr)
        return 2
    if args.check_recorded:
        print_drift(card, res)
    if args.record:
        record_into_card(card, res, command)
    if res.regressions or (args.check_recorded and res.mismatches):
        return 1
    return 0
