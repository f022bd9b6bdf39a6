"""`litlab slurm` against a real Slurm cluster (.ci/run starts a single-node one on localhost with
.ci/slurm_local.sh): a 2-task CPU job training with DDP over gloo, and a job requeued by SIGUSR1 that resumes."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from litlab.slurm import main as slurm_main
from litlab.slurm import parse

ROOT = Path(__file__).resolve().parent.parent
QUICK = [
    "--config",
    "configs/lordo/quick.yaml",
    "--trainer.enable_progress_bar=false",
    "--trainer.strategy.init_args.mode=ddp",
    "--model.init_args.optimizer=adamw",
    "--data.init_args.block_size=64",
    "--model.init_args.net.block_size=64",
]


def _cluster_reason() -> str | None:
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "no Slurm client tools (sinfo/sbatch); as root: .ci/slurm_local.sh install && .ci/slurm_local.sh start"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "sinfo timed out: no slurmctld answers (start one: .ci/slurm_local.sh start, then export SLURM_CONF)"
    if out.returncode != 0 or not ({"idle", "mix", "alloc"} & set(out.stdout.split())):
        return (
            f"no running Slurm node (sinfo: {(out.stderr or out.stdout).strip()[:200]!r}); start one with "
            ".ci/slurm_local.sh start and export SLURM_CONF"
        )
    return None


_REASON = _cluster_reason()


def needs_cluster(test):
    return pytest.mark.slurm(pytest.mark.skipif(_REASON is not None, reason=str(_REASON))(test))


def submit(capsys, args) -> tuple[str, Path]:
    assert slurm_main(args) == 0
    out = capsys.readouterr()
    job_id = out.out.strip().splitlines()[-1]
    run_dir = Path(out.err.split("script ")[1].split(",")[0]).parent
    return job_id, run_dir


def job_state(job_id: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30
    ).stdout
    return out.split("JobState=")[1].split()[0] if "JobState=" in out else "GONE"


def cluster_diagnostics(job_id: str) -> str:
    """What a failure message needs to say why a job did not run: the job record (state, Reason), the node's
    state, and the tails of the daemons' logs (.ci/slurm_local.sh keeps them beside SLURM_CONF)."""

    def out(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"{cmd[0]}: {err}"

    parts = [out(["scontrol", "show", "job", "-o", job_id]), out(["sinfo", "-N", "-o", "%N %t %E"])]
    conf = os.environ.get("SLURM_CONF")
    for log in sorted(Path(conf).parent.glob("log/*.log")) if conf else []:
        parts.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
    return "\n".join(parts)


def wait(job_id: str, until, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if until():
            return
        time.sleep(1)
    diagnostics = cluster_diagnostics(job_id)
    subprocess.run(["scancel", job_id], timeout=20)
    pytest.fail(f"job {job_id} timed out in state {job_state(job_id)}\n{diagnostics}")


@needs_cluster
def test_two_task_ddp_job_runs_both_ranks(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    job, run_dir = submit(
        capsys,
        [
            *QUICK,
            "--trainer.max_steps=32",
            "--data.init_args.train_windows_per_epoch=1024",
            f"--runs_dir={tmp_path}",
            "--nodes",
            "1",
            "--gpus-per-node",
            "0",
            "--tasks-per-node",
            "2",
        ],
    )
    wait(job, lambda: job_state(job) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE"), 420)
    log = (run_dir / f"slurm-{job}.out").read_text()
    assert job_state(job) in ("COMPLETED", "GONE"), log[-3000:]
    assert (
        "GLOBAL_RANK: 0, MEMBER: 1/2" in log and "GLOBAL_RANK: 1, MEMBER: 2/2" in log
    )  # SLURM_PROCID 0 and 1
    assert any(line.startswith("1: ") for line in log.splitlines())  # srun --label task 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["global_step"] == 32
    assert "val/loss" in summary["metrics"] and (run_dir / "checkpoints" / "last.ckpt").exists()


@needs_cluster
def test_sigusr1_requeues_and_resumes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    # sbatch exports this process's environment: a MASTER_PORT left by an in-process DDP fit of another test in
    # this worker would pin the job's rendezvous to a port that may be taken (EADDRINUSE seen under xdist)
    for name in ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    job, run_dir = submit(
        capsys,
        [
            *QUICK,
            "--trainer.max_steps=200",
            f"--runs_dir={tmp_path}",
            "--nodes",
            "1",
            "--gpus-per-node",
            "0",
            "--tasks-per-node",
            "1",
        ],
    )
    # the CSV logger first writes its file after 100 steps: signal part-way through the run
    wait(job, lambda: list(run_dir.glob("csv/version_0/metrics.csv")), 420)
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    wait(job, lambda: (run_dir / "summary.json").exists() and job_state(job) in ("COMPLETED", "GONE"), 420)
    log = (run_dir / f"slurm-{job}.out").read_text()
    assert "Requeued SLURM job" in log and f"job {job} attempt 1" in log, log[-3000:]
    assert "Restored all states from the checkpoint" in log and list(run_dir.glob("hpc_ckpt_*.ckpt"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["global_step"] == 200


def test_script_and_bad_arguments(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert (
        slurm_main(
            [
                *QUICK,
                f"--runs_dir={tmp_path}",
                "--nodes",
                "2",
                "--gpus-per-node",
                "4",
                "--partition",
                "gpu",
                "--time",
                "01:00:00",
                "--account",
                "proj",
                "--dry-run",
            ]
        )
        == 0
    )
    script = capsys.readouterr().out
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --signal=SIGUSR1@90",
        "#SBATCH --requeue",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj",
    ):
        assert line in script
    assert "srun --label litlab fit --config configs/lordo/quick.yaml" in script
    assert "--trainer.num_nodes=2 --trainer.devices=4 --trainer.accelerator=gpu" in script
    with pytest.raises(SystemExit):
        parse([*QUICK, "--nodes", "1"])  # no --gpus-per-node
    with pytest.raises(SystemExit):
        parse(["--nodes", "1", "--gpus-per-node", "2"])  # no --config


def test_the_run_folder_lookup_leaves_the_folder_unlocked(tmp_path):
    """`litlab slurm` reads the run folder from the parsed config; it must not keep that folder's lock, or the
    job it submits (on the same folder) stops as "in use" (seen: an in-process `litlab slurm` under pytest)."""
    from litlab.runs import RunLock
    from litlab.slurm import run_dir_of

    args = [f"--config={ROOT / 'configs/lokra/matrix.yaml'}", f"--runs_dir={tmp_path}"]
    run_dir = run_dir_of(args)
    RunLock(run_dir).acquire().release()  # RunFolderBusy here if run_dir_of had kept the lock
