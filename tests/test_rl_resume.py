"""An RL run killed with SIGKILL in its online phase resumes from last.ckpt with its replay buffer, iteration
and env-step counters (the online phase continues; it does not restart from zero)."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from litlab.checkpoint_io import SafeCheckpointIO

ROOT = Path(__file__).resolve().parent.parent
OFFLINE, ONLINE = 100, 500
ARGS = [
    "fit",
    f"--config={ROOT / 'configs/dare/quick.yaml'}",
    f"--model.init_args.offline_steps={OFFLINE}",
    f"--model.init_args.online_steps={ONLINE}",
    "--model.init_args.networks.hidden=[32, 32]",
    "--model.init_args.optim.batch_offline=32",
    "--model.init_args.optim.batch_online=32",
    "--trainer.callbacks.init_args.every_n_iterations=200",
    "--trainer.callbacks.init_args.n_episodes=1",
    "--trainer.callbacks.init_args.checkpoint_every_n_iterations=100",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


def litlab(args, runs_dir):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "litlab", *args, f"--runs_dir={runs_dir}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def dm_state(path):
    return SafeCheckpointIO().load_checkpoint(path)["RLDataModule"]  # loads with weights_only=True


def test_sigkill_in_online_phase_then_resume(tmp_path):
    runs = tmp_path / "runs"
    proc = litlab(ARGS, runs)
    deadline, state, last = time.time() + 300, None, None
    while time.time() < deadline and proc.poll() is None:
        found = list(runs.glob("*/*/checkpoints/last.ckpt"))
        if found:
            last = found[0]
            try:
                state = dm_state(last)
            except Exception:  # noqa: BLE001 - being replaced right now
                state = None
            if state and state["iteration"] >= OFFLINE + 200:
                break
        time.sleep(0.1)
    assert state is not None and state["iteration"] >= OFFLINE + 200, (
        proc.communicate()[0][-3000:] if proc.poll() is not None else "no online checkpoint in time"
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    run_dir = last.parent.parent
    assert not (run_dir / "summary.json").exists()  # it really was cut short
    state = dm_state(last)  # the file as the kill left it
    killed_iter, killed_env_steps = state["iteration"], state["collector"]["env_steps"]
    assert killed_iter < OFFLINE + ONLINE and killed_env_steps == killed_iter - OFFLINE
    assert state["online"]["size"] == killed_env_steps and state["online"]["obs"].shape == (
        killed_env_steps,
        3,
    )

    resumed = litlab([*ARGS, "--ckpt_path=last"], runs)
    output = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, output[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    final = dm_state(run_dir / "checkpoints" / "last.ckpt")
    assert final["iteration"] == OFFLINE + ONLINE
    assert final["collector"]["env_steps"] == ONLINE  # continued from the counter, not restarted
    assert final["online"]["size"] == ONLINE
    assert final["online"]["rew"][:killed_env_steps].equal(state["online"]["rew"])  # the old buffer was kept
    attempts = sorted(run_dir.glob("csv/version_*/metrics.csv"))
    assert len(attempts) == 2
    with open(attempts[1]) as f:
        steps = [float(r["env_steps"]) for r in csv.DictReader(f) if r.get("env_steps")]
    assert steps and min(steps) > killed_env_steps and max(steps) == ONLINE
