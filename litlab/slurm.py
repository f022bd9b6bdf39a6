"""``litlab slurm <fit args…> --nodes N --gpus-per-node G``: write an sbatch script for ``litlab fit`` and submit it.

One Slurm task per GPU (or per ``--tasks-per-node`` CPU worker): ``srun litlab fit …`` starts every rank and
Lightning's ``SLURMEnvironment`` reads the ranks from Slurm, so the same config that runs locally runs here
unchanged (``trainer.num_nodes``/``trainer.devices`` are set from the allocation). Preemption: Slurm sends
SIGUSR1 90 s before the end (``--signal=SIGUSR1@90``); Lightning's auto-requeue saves ``hpc_ckpt_<n>.ckpt`` in
the run folder and requeues the job (``--requeue``); the requeued attempt resumes from that checkpoint, or from
the run's ``checkpoints/last.ckpt`` when there is none (e.g. a job resubmitted by hand after a time-out).

    litlab slurm --config configs/lordo/quick.yaml --nodes 2 --gpus-per-node 4 --partition gpu --time 04:00:00
    litlab slurm --config configs/lordo/quick.yaml --nodes 1 --gpus-per-node 0 --tasks-per-node 2 --dry-run
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

SUBCOMMANDS = ("fit", "validate", "test", "predict")


def run_dir_of(fit_args: list[str], subcommand: str = "fit") -> Path:
    """The folder ``litlab <subcommand> <fit_args>`` will use, from the parsed config alone (nothing is built)."""
    from litlab.cli import LitlabCLI  # imports every method module: `litlab slurm --help` stays instant

    class _Stop(Exception):
        pass

    class _RunDirOnly(LitlabCLI):
        takes_run_lock = False

        def instantiate_classes(self) -> None:
            raise _Stop

    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        cli = _RunDirOnly.__new__(_RunDirOnly)
        try:
            _RunDirOnly.__init__(cli, args=[subcommand, *fit_args])
        except _Stop:
            pass
    finally:
        sys.argv = argv
    assert cli.run_dir is not None
    return cli.run_dir


def sbatch_script(args: argparse.Namespace, subcommand: str, fit_args: list[str], run_dir: Path) -> str:
    tasks = args.tasks_per_node or args.gpus_per_node
    directives = [
        f"--job-name={args.job_name or 'litlab-' + run_dir.parent.name}",
        f"--nodes={args.nodes}",
        f"--ntasks-per-node={tasks}",
        f"--cpus-per-task={args.cpus_per_task}",
        "--signal=SIGUSR1@90",
        "--requeue",
        "--open-mode=append",
        f"--output={run_dir.resolve()}/slurm-%j.out",
    ]
    if args.gpus_per_node:
        directives.append(f"--gpus-per-node={args.gpus_per_node}")
    for flag in ("partition", "time", "account", "mem"):
        if getattr(args, flag):
            directives.append(f"--{flag}={getattr(args, flag)}")
    directives += args.sbatch_arg or []
    found = shutil.which("litlab")
    bin_dir = (
        Path(found).resolve().parent if found else Path(sys.executable).parent
    )  # e.g. an unactivated venv
    run = shlex.quote(str(run_dir.resolve()))
    command = " ".join(shlex.quote(a) for a in ["litlab", subcommand, *fit_args])
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        "",
        "# written by `litlab slurm`; one task per device, Lightning's SLURMEnvironment reads the ranks",
        "set -euo pipefail",
        f"cd {shlex.quote(str(Path.cwd()))}",
        f"export PATH={shlex.quote(str(bin_dir))}:$PATH",
        f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{args.cpus_per_task}}}",
        f"RUN_DIR={run}",
        "RESUME=()",
        'if compgen -G "$RUN_DIR/hpc_ckpt_*.ckpt" > /dev/null; then',
        '  echo "resuming from Lightning\'s auto-requeue checkpoint in $RUN_DIR"   # picked up by Lightning',
        'elif [ -f "$RUN_DIR/checkpoints/last.ckpt" ]; then',
        '  RESUME=(--ckpt_path=last); echo "resuming from $RUN_DIR/checkpoints/last.ckpt"',
        "fi",
        'echo "job $SLURM_JOB_ID attempt ${SLURM_RESTART_COUNT:-0} on $SLURM_JOB_NODELIST"',
        f'srun --label {command} "${{RESUME[@]}}"',
        "",
    ]
    return "\n".join(lines)


def parse(argv: list[str]) -> tuple[argparse.Namespace, str, list[str]]:
    parser = argparse.ArgumentParser(
        prog="litlab slurm",
        description=__doc__.split("\n")[0],
        epilog="Every other argument goes to `litlab fit` unchanged.",
    )
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="GPUs per node, one task each; 0 for CPU workers (then give --tasks-per-node)",
    )
    parser.add_argument("--tasks-per-node", type=int, default=None, help="default: --gpus-per-node")
    parser.add_argument("--cpus-per-task", type=int, default=1)
    parser.add_argument("--partition")
    parser.add_argument("--time", help="wall-clock limit, e.g. 04:00:00")
    parser.add_argument("--account")
    parser.add_argument("--mem", help="memory per node, e.g. 64G")
    parser.add_argument("--job-name")
    parser.add_argument(
        "--sbatch-arg", action="append", help="an extra #SBATCH line, e.g. --sbatch-arg=--qos=high"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the script, do not submit")
    args, rest = parser.parse_known_args(argv)
    subcommand = rest.pop(0) if rest and rest[0] in SUBCOMMANDS else "fit"
    if args.gpus_per_node is None:
        parser.error("--gpus-per-node is required (0 for a CPU job, with --tasks-per-node)")
    tasks = args.tasks_per_node or args.gpus_per_node
    for name, value in [
        ("--nodes", args.nodes),
        ("tasks per node", tasks),
        ("--cpus-per-task", args.cpus_per_task),
    ]:
        if value is None or value < 1:
            parser.error(f"{name}={value} must be >= 1 (a CPU job needs --tasks-per-node)")
    if args.gpus_per_node and args.tasks_per_node and args.tasks_per_node != args.gpus_per_node:
        parser.error(
            f"--tasks-per-node={args.tasks_per_node} must equal --gpus-per-node={args.gpus_per_node}: "
            "Lightning runs one task per GPU"
        )
    if not any(a == "--config" or a.startswith("--config=") for a in rest):
        parser.error("give the run's config: litlab slurm --config configs/<slug>/quick.yaml --nodes N ...")
    placement = [f"--trainer.num_nodes={args.nodes}", f"--trainer.devices={tasks}"]
    if args.gpus_per_node:
        placement.append("--trainer.accelerator=gpu")
    return args, subcommand, [*rest, *placement]


def main(argv: list[str]) -> int:
    args, subcommand, fit_args = parse(argv)
    run_dir = run_dir_of(fit_args, subcommand)
    script = sbatch_script(args, subcommand, fit_args, run_dir)
    print(script)
    if args.dry_run:
        return 0
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "slurm.sbatch"
    path.write_text(script)
    if shutil.which("sbatch") is None:
        print(f"litlab slurm: `sbatch` is not on PATH; the script is at {path}", file=sys.stderr)
        return 2
    try:  # sbatch retries an unreachable controller for its MessageTimeout; do not wait past a few of those
        done = subprocess.run(
            ["sbatch", "--parsable", str(path)], capture_output=True, text=True, env=os.environ, timeout=180
        )
    except subprocess.TimeoutExpired:
        print(
            f"litlab slurm: sbatch did not answer in 180 s (is slurmctld up? `sinfo`); the script is at {path}",
            file=sys.stderr,
        )
        return 2
    if done.returncode != 0:
        print(f"litlab slurm: sbatch failed ({done.returncode}): {done.stderr.strip()}", file=sys.stderr)
        return done.returncode
    job_id = done.stdout.strip().split(";")[0]
    print(f"submitted job {job_id}: script {path}, log {run_dir}/slurm-{job_id}.out", file=sys.stderr)
    print(job_id)
    return 0
