"""`litlab sweep`: a wandb sweep file run offline by wandb's own sweep engine, resumed after an interruption."""

import json
from pathlib import Path

import pytest
import yaml

from litlab.lit_modules.core.errors import SweepError
from litlab.sweep import expand_command, load_sweep, main

ROOT = Path(__file__).resolve().parent.parent


def test_every_sweep_file_is_a_valid_wandb_sweep():
    for path in sorted((ROOT / "sweeps").glob("*.yaml")):
        cfg = load_sweep(path)
        assert "${args}" in cfg["command"] and cfg["program"] == "litlab", path
        assert any(part.startswith("configs/") for part in cfg["command"]), path


def test_macros_and_bad_files(tmp_path):
    cfg = {"program": "litlab", "command": ["${env}", "litlab", "fit", "${args}"]}
    assert expand_command(cfg, {"model.init_args.lr": 0.1, "data.init_args.target": "diag"}) == [
        "litlab",
        "fit",
        "--model.init_args.lr=0.1",
        "--data.init_args.target=diag",
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: sideways\nparameters: {a: {values: [1]}}\n")
    with pytest.raises(SweepError, match="not a valid wandb sweep"):
        load_sweep(bad)


def test_grid_sweep_offline_end_to_end_and_resume(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    sweep_file = tmp_path / "tiny.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {
                "program": "litlab",
                "method": "grid",
                "metric": {"name": "val/rel_err", "goal": "minimize"},
                "parameters": {
                    "model.init_args.lr": {"values": [0.03, 0.001]},
                    "model.init_args.mode": {"values": ["lora", "lokra_plus"]},
                },
                "command": ["${env}", "litlab", "fit", "--config", "configs/lokra/matrix.yaml", "${args}"],
            }
        )
    )
    extra = [
        "--",
        "--trainer.max_steps=6",
        "--data.init_args.steps_per_epoch=6",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=false",
        "--model.init_args.penalty.lam=0.0",
    ]
    out = tmp_path / "sweeps"
    # an "interrupted" sweep: only 2 of the 4 grid points ran
    assert main([str(sweep_file), "--count", "2", "--parallel", "2", "--out", str(out), *extra]) == 0
    state = json.loads((out / "tiny" / "sweep.json").read_text())
    first = {r["name"] for r in state["runs"]}
    assert len(first) == 2 and all(r["status"] == "finished" for r in state["runs"])
    # resume: the remaining 2 run, the finished 2 are not redone (each run's log has one attempt)
    assert main([str(sweep_file), "--parallel", "2", "--out", str(out), *extra]) == 0
    state = json.loads((out / "tiny" / "sweep.json").read_text())
    runs = state["runs"]
    assert len(runs) == 4 and all(r["status"] == "finished" for r in runs)
    assert {(r["params"]["model.init_args.lr"], r["params"]["model.init_args.mode"]) for r in runs} == {
        (0.03, "lora"),
        (0.03, "lokra_plus"),
        (0.001, "lora"),
        (0.001, "lokra_plus"),
    }
    for r in runs:
        assert Path(r["run_dir"], "sweep_run.log").read_text().count("Trainer.fit") == 1, r["name"]
    # the table: 4 rows sorted by the metric, the plot beside it
    lines = [
        ln
        for ln in (out / "tiny" / "results.md").read_text().splitlines()
        if ln.startswith("| ") and ln[2].isdigit()
    ]
    values = [float(ln.split("|")[-3]) for ln in lines]
    assert len(values) == 4 and values == sorted(values)
    assert values == pytest.approx(sorted(r["metric"] for r in runs), rel=1e-5)
    assert (out / "tiny" / "sweep.png").exists() and (out / "tiny" / "results.csv").exists()
