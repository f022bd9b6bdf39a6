"""Validate before work: `litlab repro` parses every run of a card before its first fit, `litlab sweep` dry-runs
its first parameter set and says why a run failed, and data files name themselves in their errors."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from litlab import repro
from litlab.cards import load_card
from litlab.lit_modules.core.errors import CardError

ROOT = Path(__file__).resolve().parent.parent


def _card_with_bad_last_run(tmp_path, change) -> Path:
    raw = yaml.safe_load((ROOT / "seeds" / "lokra.yaml").read_text())
    quick = [n for n, r in raw["runs"].items() if "quick" in r.get("scales", ["quick", "full"])]
    last = quick[-1]
    change(raw["runs"][last])
    path = tmp_path / "lokra.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path, last


@pytest.mark.parametrize("what", ["missing config", "bad key"])
def test_repro_refuses_a_bad_run_before_the_first_fit(tmp_path, monkeypatch, what):
    def change(run):
        if what == "missing config":
            run["config"] = "configs/lokra/no_such_file.yaml"
        else:
            run.setdefault("overrides", {})["model.init_args.no_such_argument"] = 1

    path, last = _card_with_bad_last_run(tmp_path, change)
    card = load_card(path)
    fits = []
    monkeypatch.setattr(repro, "run_one", lambda *a, **k: fits.append(a) or pytest.fail("a fit started"))
    match = "no_such_file.yaml" if what == "missing config" else "no_such_argument"
    with pytest.raises(CardError, match=match) as err:
        repro.reproduce(card, scale="quick", seeds=[0], out_root=tmp_path / "out")
    assert f"runs.{last}" in str(err.value) and not fits
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("summary.json"))


def _sweep_file(tmp_path, parameters) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "s",
                "program": "litlab",
                "method": "grid",
                "metric": {"name": "val/rel_err", "goal": "minimize"},
                "parameters": parameters,
                "command": ["litlab", "fit", "--config", str(ROOT / "configs/lokra/matrix.yaml"), "${args}"],
            }
        )
    )
    return path


def _sweep(*args):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "litlab", "sweep", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_sweep_stops_on_a_parameter_the_parser_refuses(tmp_path):
    path = _sweep_file(tmp_path, {"model.init_args.no_such_param": {"values": [1, 2]}})
    out = _sweep(path, "--out", tmp_path / "out")
    assert out.returncode == 2, out.stderr[-3000:]
    assert "no_such_param" in out.stderr and "first parameter set" in out.stderr
    assert not list((tmp_path / "out").rglob("sweep_run.log"))  # no run was launched


def test_sweep_shows_a_failing_runs_error_and_writes_no_empty_plot(tmp_path):
    path = _sweep_file(tmp_path, {"model.init_args.mode": {"values": ["lora"]}})
    missing = tmp_path / "no_such.ckpt"
    out = _sweep(path, "--out", tmp_path / "out", "--", "--trainer.max_steps=2", f"--ckpt_path={missing}")
    assert out.returncode == 1, out.stderr[-3000:]
    assert "failed:" in out.stderr and "checkpoint not found" in out.stderr and str(missing) in out.stderr
    assert not (tmp_path / "out" / "s" / "sweep.png").exists() and "plot:" not in out.stderr
    runs = json.loads((tmp_path / "out" / "s" / "sweep.json").read_text())["runs"]
    assert "checkpoint not found" in runs[0]["error"]


def test_a_truncated_data_file_names_itself(tmp_path):
    from litlab.datamodules.rl_d4rl import load_dataset, read_metadata, write_d4rl

    n = 50
    data = {
        "observations": np.zeros((n, 3)),
        "next_observations": np.zeros((n, 3)),
        "actions": np.zeros((n, 1)),
        "rewards": np.zeros(n),
        "terminals": np.zeros(n, bool),
    }
    path = write_d4rl(tmp_path / "toy.hdf5", data, {"env": "toy"})
    assert len(load_dataset(path)["observations"]) == n
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 3])
    for read in (load_dataset, read_metadata):
        with pytest.raises(Exception, match="toy.hdf5.*cannot be read") as err:
            read(path)
        assert type(err.value).__name__ == "DataFileError"  # a user error: one line, exit code 2
    path.write_bytes(b"not hdf5 at all")
    with pytest.raises(Exception, match=re.escape(str(path))) as err:
        load_dataset(path)
    assert type(err.value).__name__ == "DataFileError"
