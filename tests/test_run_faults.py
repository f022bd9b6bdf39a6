"""Runs that fail loudly and stay in their folder (issue 31): a kill while ``last.ckpt`` is written, SIGTERM and SIGUSR1
preemption, a NaN loss or metric, a disk that is full (as torch reports it), path escapes, a card's hook, usage errors.
Each on LoKRA's 64x64 matrix task (a fit of 20 steps takes about a second in-process); one real-process SIGTERM."""

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_run_safety import ARGS, fit

import litlab.checkpoint_io as checkpoint_io
from litlab.__main__ import main as litlab_main
from litlab.callbacks import run_summary
from litlab.lit_modules.core.errors import (
    CheckpointWriteError,
    RunDiverged,
    RunPreempted,
)

ROOT = Path(__file__).resolve().parent.parent


def callback(class_name: str, **init_args) -> str:
    return "--trainer.callbacks+=" + json.dumps(
        {"class_path": f"resume_faults.{class_name}", "init_args": init_args}
    )


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(autouse=True)
def _faults_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "tests"))  # resume_faults, as the subprocess tests get it
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns when given args and sys.argv both


def test_a_kill_while_last_ckpt_is_written_resumes_from_the_newest_complete_checkpoint(tmp_path, capsys):
    """The state a kill inside the write of last.ckpt leaves (no last.ckpt, a stale .last.ckpt.<pid>.tmp), then a
    truncated last.ckpt: each resume takes the newest checkpoint that loads, says which, and continues exactly."""
    reference = fit(tmp_path, "--trainer.max_steps=30", run_id="uninterrupted").run_dir
    run_dir = fit(tmp_path, "--trainer.max_steps=20").run_dir
    ckpts = run_dir / "checkpoints"
    (ckpts / "last.ckpt").unlink()
    stale = ckpts / ".last.ckpt.999999.tmp"
    stale.write_bytes(b"PK\x03\x04 half a zip")
    capsys.readouterr()
    fit(tmp_path, "--trainer.max_steps=30", "--ckpt_path=last")
    err = capsys.readouterr().err
    assert "resuming from" in err and "epoch=1-step=20.ckpt (there is no last.ckpt)" in err, err
    assert not stale.exists()
    resumed = summary(run_dir)
    assert resumed["status"] == "finished" and resumed["global_step"] == 30
    assert resumed["metrics"] == summary(reference)["metrics"]

    # a truncated last.ckpt (a copy cut short): the epoch checkpoint before it
    last = ckpts / "last.ckpt"
    last.write_bytes(last.read_bytes()[:2000])
    fit(tmp_path, "--trainer.max_steps=40", "--ckpt_path=last")
    err = capsys.readouterr().err
    assert "resuming from" in err and "epoch=2-step=30.ckpt" in err and "last.ckpt: checkpoint" in err, err
    finished = summary(run_dir)
    assert finished["global_step"] == 40
    # relaunched once more, with nothing left to train: the finished record keeps its metrics
    fit(tmp_path, "--trainer.max_steps=40", "--ckpt_path=last")
    again = summary(run_dir)
    assert again["metrics"] == finished["metrics"] and len(again["attempts"]) == len(finished["attempts"]) + 1


def test_sigterm_saves_a_checkpoint_at_that_step_records_preempted_and_exits_143(tmp_path):
    """A real SIGTERM to a real `litlab fit` process (what SLURM sends on preemption); the relaunch continues exactly."""
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "PYTHONPATH": str(ROOT / "tests"),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "litlab",
        *ARGS,
        f"--runs_dir={tmp_path}",
        "--run_id=P",
        "--trainer.max_steps=20",
    ]
    out = subprocess.run(
        [*cmd, callback("SignalAtStep", step=7)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 143, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "preempted by SIGTERM at step 8" in out.stderr, out.stderr[
        -3000:
    ]
    run_dir = tmp_path / "lokra" / "P"
    record = summary(run_dir)
    assert record["status"] == "preempted: SIGTERM at step 8" and record["global_step"] == 8
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 8

    fit(tmp_path, "--trainer.max_steps=20", "--ckpt_path=last", run_id="P")
    reference = fit(tmp_path, "--trainer.max_steps=20", run_id="uninterrupted").run_dir
    assert summary(run_dir)["status"] == "finished"
    assert summary(run_dir)["metrics"] == summary(reference)["metrics"]


def test_sigusr1_outside_slurm_is_a_preemption_too(tmp_path):
    before = signal.getsignal(signal.SIGUSR1)
    # a fit leaves the process' SIGUSR1 handler as it found it
    fit(tmp_path, "--trainer.max_steps=2", run_id="before")
    assert signal.getsignal(signal.SIGUSR1) == before
    with pytest.raises(RunPreempted, match="SIGUSR1 at step 4") as stopped:
        fit(tmp_path, "--trainer.max_steps=20", callback("SignalAtStep", step=3, signal_name="SIGUSR1"))
    assert stopped.value.exit_code == 138
    assert summary(tmp_path / "lokra" / "R")["status"] == "preempted: SIGUSR1 at step 4"
    assert signal.getsignal(signal.SIGUSR1) == before


def test_a_nan_loss_stops_the_fit_as_diverged_before_it_is_checkpointed(tmp_path):
    with pytest.raises(RunDiverged, match="loss is .* at step 2") as stopped:
        fit(tmp_path, "--trainer.max_steps=20", "--model.init_args.lr=1e30")
    assert stopped.value.exit_code == 4
    run_dir = tmp_path / "lokra" / "R"
    assert summary(run_dir)["status"] == "diverged: loss at step 2"
    assert not list(run_dir.glob("checkpoints/*.ckpt"))


def test_a_nan_metric_is_diverged_and_never_finished_even_with_the_check_off(tmp_path):
    nan_metric = callback("LogValueAtStep", name="probe/ratio", value="nan", step=5)
    with pytest.raises(RunDiverged, match="probe/ratio"):
        fit(tmp_path, "--trainer.max_steps=20", nan_metric)
    assert summary(tmp_path / "lokra" / "R")["status"] == "diverged: probe/ratio at step 5"
    # off: the fit runs to its end, and its record still is not "finished"
    with pytest.raises(RunDiverged, match="at the end of the fit"):
        fit(tmp_path, "--trainer.max_steps=20", nan_metric, "--stop_on_divergence=false", run_id="off")
    record = summary(tmp_path / "lokra" / "off")
    assert record["status"] == "diverged: probe/ratio at step 20" and record["global_step"] == 20


def test_a_relaunch_after_a_kill_between_the_final_checkpoint_and_the_summary_records_the_metrics(
    tmp_path, capsys
):
    """Killed after the last checkpoint of a completed fit but before its summary: the relaunch resumes at the end
    (Lightning trains and logs nothing), validates the restored weights and records their metrics as finished."""
    run_dir = fit(tmp_path, "--trainer.max_steps=20").run_dir
    finished = summary(run_dir)
    (run_dir / "summary.json").unlink()  # what the kill leaves: the checkpoint, no summary
    capsys.readouterr()
    fit(tmp_path, "--trainer.max_steps=20", "--ckpt_path=last")
    assert "validating to record the run's metrics" in capsys.readouterr().err
    relaunched = summary(run_dir)
    assert relaunched["status"] == "finished" and relaunched["global_step"] == 20
    val = {k: v for k, v in finished["metrics"].items() if k.startswith("val/")}
    assert val and all(relaunched["metrics"][k] == pytest.approx(v, abs=1e-6) for k, v in val.items())


def test_a_nan_metric_in_validate_is_diverged_with_its_exit_code(tmp_path):
    nan_metric = callback("LogValueInValidation", name="probe/ratio", value="nan")
    code = litlab_main(["validate", *ARGS[1:], f"--runs_dir={tmp_path}", "--run_id=V", nan_metric])
    assert code == 4
    record = json.loads((tmp_path / "lokra" / "V" / "summary-validate.json").read_text())
    assert record["status"] == "diverged: probe/ratio at step 0"


def test_a_full_disk_as_torch_reports_it_keeps_the_previous_checkpoint_and_exits_74(
    tmp_path, monkeypatch, capsys
):
    run_dir = fit(tmp_path, "--trainer.max_steps=10").run_dir
    before = {p.name: p.read_bytes() for p in (run_dir / "checkpoints").glob("*.ckpt")}
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):  # what torch raises when the disk fills during the write
        real_save(obj, f, *args, **kwargs)
        Path(f).write_bytes(Path(f).read_bytes()[:100])
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4416 vs 4310")

    monkeypatch.setattr(checkpoint_io.torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError, match="cannot write checkpoint .*unexpected pos .* MiB free"):
        fit(tmp_path, "--trainer.max_steps=20", "--ckpt_path=last")
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in (run_dir / "checkpoints").glob("*.ckpt")} == before
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))
    assert summary(run_dir)["attempts"][-1]["status"].startswith("failed: CheckpointWriteError: cannot write")

    # the summary itself cannot be written: the status goes to stderr, and `litlab fit` exits 74
    def no_space(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(run_summary, "atomic_write_json", no_space)
    capsys.readouterr()
    args = [*ARGS, f"--runs_dir={tmp_path}", "--run_id=S", "--trainer.max_steps=5"]
    assert litlab_main(args) == 74
    err = capsys.readouterr().err
    assert "summary.json (No space left on device)" in err and len(err.strip().splitlines()) <= 3, err


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--run_id", "../../escaped"),
        ("--experiment", "../x"),
        ("--run_id", "/abs/escaped"),
        ("--run_id", ".."),
    ],
)
def test_run_names_that_are_paths_are_refused(tmp_path, capsys, flag, value):
    runs = tmp_path / "runs"
    assert litlab_main([*ARGS, f"--runs_dir={runs}", f"{flag}={value}", "--trainer.max_steps=1"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} must be a folder name" in err and repr(value) in err and "Traceback" not in err, err
    assert not list(tmp_path.rglob("*"))  # nothing written, inside --runs_dir or out of it


def test_an_unknown_config_key_is_a_short_error_naming_it(capsys):
    with pytest.raises(SystemExit) as exited:
        litlab_main([*ARGS[:2], "--model.init_args.no_such_key_xyz=1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_key_xyz" in err and "--help" in err and len(err.strip().splitlines()) <= 15, err


def test_a_card_hook_outside_litlab_and_modules_in_the_working_directory_do_not_run(tmp_path):
    """A folder holding a card whose report_hook names a module beside it, and a module shadowing one litlab imports
    (netrc): `python -m litlab repro` run there refuses the hook before any run, and imports neither."""
    card = (ROOT / "seeds" / "u3cf.yaml").read_text()
    (tmp_path / "card.yaml").write_text(
        "\n".join(
            "report_hook: evil:hook" if line.startswith("report_hook:") else line
            for line in card.splitlines()
        )
    )
    for module in ("evil", "netrc"):
        (tmp_path / f"{module}.py").write_text(f"open('ran-{module}', 'w').close()\ndef hook(*args): pass\n")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [sys.executable, "-m", "litlab", "repro", "card.yaml", "--out", "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "--trust-hooks evil" in out.stderr, out.stderr[-3000:]
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not list(tmp_path.glob("ran-*")) and not (tmp_path / "out").exists()


def test_repro_counts_a_diverged_run_as_failed_never_as_a_number(tmp_path, capsys):
    from test_repro import TINY_CARD

    from litlab.repro import main as repro_main

    card = tmp_path / "tiny.yaml"
    card.write_text(TINY_CARD)
    out = tmp_path / "out"
    args = [str(card), "--out", str(out), "--only", "plus", "--seeds", "0", "--", "--model.init_args.lr=1e30"]
    assert repro_main(args) == 1
    err = capsys.readouterr().err
    assert "run plus seed 0 did not finish: diverged: loss at step 2; no result is recorded" in err, err[
        -2000:
    ]
    assert not (out / "tiny" / "results.json").exists()  # no number
    report = (out / "tiny" / "report.md").read_text()  # and the report says why
    assert "no result" in report and "did not finish: diverged: loss at step 2" in report


def test_a_kill_right_after_a_mid_epoch_checkpoint_keeps_that_steps_row(tmp_path):
    """Killed inside step 5's on_train_batch_end, just after its checkpoint was written and before Lightning logs the
    step: the row of step 5 is on disk already, and the resumed attempt logs each later step once — together the
    two attempts hold every (metric, step) of an uninterrupted run, with its values."""
    import csv

    def rows(run_dir: Path) -> dict[tuple[str, int], list[float]]:
        out: dict[tuple[str, int], list[float]] = {}
        for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
            for row in csv.DictReader(path.open()):
                for key, value in row.items():
                    if key.startswith("train/") and value:
                        out.setdefault((key, int(row["step"])), []).append(float(value))
        return out

    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT / "tests"), "OMP_NUM_THREADS": "1"}
    every_step = ["--trainer.max_steps=12", "--trainer.log_every_n_steps=1"]
    checkpoint = callback(
        "KillRightAfterStepCheckpoint",
        kill_at_step=5,
        dirpath=str(tmp_path / "lokra" / "K" / "checkpoints"),
        every_n_train_steps=5,
        save_last=True,
    )
    cmd = [sys.executable, "-m", "litlab", *ARGS, f"--runs_dir={tmp_path}", "--run_id=K", *every_step]
    out = subprocess.run(
        [*cmd, checkpoint], env=env, capture_output=True, text=True, timeout=300, start_new_session=True
    )
    assert out.returncode == -9, out.stderr[-3000:]
    run_dir = tmp_path / "lokra" / "K"
    killed = rows(run_dir)
    assert ("train/loss", 4) in killed, sorted(killed)  # step 5 is the 5th batch: logged at step index 4
    fit(tmp_path, *every_step, "--ckpt_path=last", run_id="K")
    reference = rows(fit(tmp_path, *every_step, run_id="uninterrupted").run_dir)
    resumed = rows(run_dir)
    assert sorted(resumed) == sorted(reference)
    assert all(len(v) == 1 for v in resumed.values()), {k: v for k, v in resumed.items() if len(v) > 1}
    assert resumed == reference


def test_sigterm_before_training_is_a_preemption_with_exit_143_not_a_silent_death(tmp_path):
    """SIGTERM while the run is still being set up (Lightning's handler not installed yet): one line naming the
    signal, exit 143 as for a preemption inside training, no traceback."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT / "tests"), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "litlab",
        *ARGS,
        f"--runs_dir={tmp_path}",
        "--run_id=S",
        callback("SignalInSetup"),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 143, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "preempted by SIGTERM outside the training loop" in out.stderr
