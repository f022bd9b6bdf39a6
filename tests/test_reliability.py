"""A run killed with SIGKILL part-way resumes from last.ckpt and ends where an uninterrupted run ends."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from litlab.checkpoint_io import SafeCheckpointIO
from litlab.cli import LitlabCLI
from litlab.lit_modules.core.errors import CheckpointError

ROOT = Path(__file__).resolve().parent.parent
ARGS = [
    "fit",
    f"--config={ROOT / 'configs/lokra/matrix.yaml'}",
    "--model.init_args.mode=lokra",
    "--model.init_args.penalty.lam=0.01",
    "--trainer.max_steps=600",
    "--data.init_args.steps_per_epoch=50",
    "--trainer.deterministic=true",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def litlab(args, runs_dir, **popen):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "litlab", *args, f"--runs_dir={runs_dir}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    reference = LitlabCLI(args=[*ARGS, f"--runs_dir={tmp_path / 'ref'}"])
    expected = json.loads((reference.run_dir / "summary.json").read_text())["metrics"]["val/rel_err"]

    runs = tmp_path / "runs"
    proc = litlab(ARGS, runs)
    deadline = time.time() + 240
    last = None
    while time.time() < deadline and proc.poll() is None:
        found = list(runs.glob("*/*/checkpoints/last.ckpt"))
        if found:
            last = found[0]
            break
        time.sleep(0.05)
    assert last is not None, f"no checkpoint before the run ended: {proc.communicate()[0][-2000:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    run_dir = last.parent.parent
    assert not (run_dir / "summary.json").exists()  # it really was cut short
    step_at_kill = SafeCheckpointIO().load_checkpoint(last)["global_step"]
    assert 0 < step_at_kill < 600

    resumed = litlab([*ARGS, "--ckpt_path=last"], runs)
    output = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["global_step"] == 600
    assert summary["metrics"]["val/rel_err"] == pytest.approx(expected, abs=1e-6)
    assert len(list(run_dir.glob("csv/version_*/metrics.csv"))) == 2  # the first attempt's log was kept


def test_truncated_checkpoint_gives_a_clear_error(tmp_path, capsys):
    cli = LitlabCLI(args=[*ARGS, "--trainer.max_steps=50", f"--runs_dir={tmp_path}"])
    last = cli.run_dir / "checkpoints" / "last.ckpt"
    assert SafeCheckpointIO().load_checkpoint(last)["global_step"] == 50  # loads with weights_only=True
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])
    # named by path: refused, naming the file and the cause
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        LitlabCLI(args=[*ARGS, f"--runs_dir={tmp_path}", f"--ckpt_path={last}"])
    # --ckpt_path last: the newest checkpoint that loads, saying why it is not last.ckpt (issue 31)
    capsys.readouterr()
    resumed = LitlabCLI(
        args=[
            *ARGS,
            "--trainer.max_steps=60",
            f"--runs_dir={tmp_path}",
            "--run_id=" + cli.run_dir.name,
            "--ckpt_path=last",
        ]
    )
    err = capsys.readouterr().err
    assert "resuming from" in err and "epoch=0-step=50.ckpt" in err and "truncated or corrupt" in err, err
    assert json.loads((resumed.run_dir / "summary.json").read_text())["global_step"] == 60
