"""A run folder survives its users: a failed attempt never erases a finished record, a checkpoint that cannot be
written stops the run, one process writes a folder at a time (a killed holder does not block the resume), and
user errors are one short line with exit code 2."""

import builtins
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from litlab import runs
from litlab.cli import LitlabCLI
from litlab.lit_modules.core import errors
from litlab.lit_modules.core.errors import CheckpointError

ROOT = Path(__file__).resolve().parent.parent
ARGS = [
    "fit",
    f"--config={ROOT / 'configs/lokra/matrix.yaml'}",
    "--model.init_args.mode=lokra",
    "--data.init_args.steps_per_epoch=10",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def fit(tmp_path, *extra, run_id="R"):
    return LitlabCLI(args=[*ARGS, f"--runs_dir={tmp_path}", f"--run_id={run_id}", *extra])


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def litlab(*args, env=None):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", **(env or {})}
    return [sys.executable, "-m", "litlab", *args], env


def test_failed_attempts_keep_the_finished_record_and_are_listed(tmp_path):
    run_dir = fit(tmp_path, "--trainer.max_steps=20").run_dir
    finished = summary(run_dir)
    assert finished["status"] == "finished" and finished["metrics"]
    assert [a["status"] for a in finished["attempts"]] == ["finished"]
    versions = sorted(run_dir.glob("csv/version_*"))

    # a resume that fails inside fit
    raiser = '{"class_path": "resume_faults.RaiseAtStep", "init_args": {"step": 20}}'
    with pytest.raises(RuntimeError, match="injected failure"):
        fit(tmp_path, "--trainer.max_steps=40", "--ckpt_path=last", f"--trainer.callbacks+={raiser}")
    after = summary(run_dir)
    assert after["status"] == "finished" and after["metrics"] == finished["metrics"]
    assert after["global_step"] == 20
    assert [a["status"].split(":")[0] for a in after["attempts"]] == ["finished", "failed"]
    assert "injected failure" in after["attempts"][1]["status"]

    # a resume whose checkpoints are all truncated: refused before any logger starts (no new csv version); with
    # only last.ckpt truncated it resumes from the one before (tests/test_run_faults.py)
    versions = sorted(run_dir.glob("csv/version_*"))
    for ckpt in (run_dir / "checkpoints").glob("*.ckpt"):
        data = ckpt.read_bytes()
        ckpt.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        CheckpointError, match="no checkpoint in .* loads.*last.ckpt: checkpoint .* truncated"
    ):
        fit(tmp_path, "--trainer.max_steps=40", "--ckpt_path=last")
    after = summary(run_dir)
    assert after["status"] == "finished" and after["metrics"] == finished["metrics"]
    assert len(after["attempts"]) == 3 and "CheckpointError" in after["attempts"][2]["status"]
    assert sorted(run_dir.glob("csv/version_*")) == versions


def test_a_checkpoint_that_cannot_be_written_fails_the_run(tmp_path, monkeypatch):
    """As a user whose checkpoints/ is not writable (root ignores permissions, so every way of writing into the
    folder is refused here): Lightning's atomic save swallowed the PermissionError and the run ended finished."""
    ckpt_dir = str(tmp_path / "lokra" / "R" / "checkpoints")

    def refused(path) -> bool:
        return str(path).startswith(ckpt_dir)

    real_open, real_replace, real_rename = builtins.open, os.replace, os.rename

    def fake_open(file, mode="r", *a, **k):
        if refused(file) and any(c in mode for c in "wax+"):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, mode, *a, **k)

    def fake_move(real):
        def move(src, dst, *a, **k):
            if refused(dst):
                raise PermissionError(13, "Permission denied", str(dst))
            return real(src, dst, *a, **k)

        return move

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "replace", fake_move(real_replace))
    monkeypatch.setattr(os, "rename", fake_move(real_rename))
    with pytest.raises(CheckpointError, match="cannot write checkpoint .*last.ckpt|cannot write checkpoint"):
        fit(tmp_path, "--trainer.max_steps=20")
    monkeypatch.undo()
    status = summary(tmp_path / "lokra" / "R")["status"]
    assert status.startswith("failed: CheckpointWriteError: cannot write checkpoint"), status


def test_one_writer_per_run_folder_and_a_killed_holder_does_not_block(tmp_path):
    args = [*ARGS, f"--runs_dir={tmp_path}", "--run_id=CC"]
    cmd, env = litlab(*args, "--trainer.max_steps=1000000")
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lock = tmp_path / "lokra" / "CC" / ".lock"
    deadline = time.time() + 120
    while time.time() < deadline and first.poll() is None:
        if lock.exists() and lock.read_text().strip() == str(first.pid):
            break
        time.sleep(0.1)
    assert first.poll() is None, first.communicate()[0][-3000:]
    try:
        cmd, env = litlab(*args, "--trainer.max_steps=1000000")
        t0 = time.time()
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        assert f"in use by process {first.pid}" in second.stderr and "Traceback" not in second.stderr
        assert time.time() - t0 < 60  # refused at once, not after a fit
        with pytest.raises(errors.RunFolderBusy, match=str(first.pid)):
            runs.RunLock(lock.parent).acquire()
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert lock.exists()  # the killed holder's file is left behind ...
    resumed = fit(tmp_path, "--trainer.max_steps=20", run_id="CC")  # ... and does not block the next writer
    assert summary(resumed.run_dir)["status"] == "finished"


def test_user_errors_are_one_short_message_with_exit_code_2(tmp_path):
    run_dir = fit(tmp_path, "--trainer.max_steps=10").run_dir
    last = run_dir / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])
    cmd, env = litlab(*ARGS, f"--runs_dir={tmp_path / 'other'}", f"--ckpt_path={last}")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and str(last) in out.stderr and "truncated or corrupt" in out.stderr
    assert sum(line.startswith("litlab: error:") for line in out.stderr.splitlines()) == 1, out.stderr
    assert len(out.stderr.strip().splitlines()) <= 10, out.stderr
    out = subprocess.run(cmd, env={**env, "LITLAB_DEBUG": "1"}, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" in out.stderr
    out = subprocess.run([*cmd, "--debug"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "Traceback" in out.stderr
