"""`litlab` command end to end: every quick config, run layout, defaults, and bad-config errors."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from litlab.cli import LitlabCLI

ROOT = Path(__file__).resolve().parent.parent
QUICK_CONFIGS = sorted(ROOT.glob("configs/*/quick.yaml"))


def run(args, tmp_path):
    return LitlabCLI(args=[*args, f"--runs_dir={tmp_path / 'runs'}", "--trainer.enable_progress_bar=false"])


# This test checks that each quick config parses, builds and fits a step, not its locally pre-trained base: with
# the test session's empty cache, full-length pre-training of these bases took minutes each (493 s for diffract
# at load 4-5 in a clean-clone CI run). The cards train the real ones.
SHORT_BASE = {
    "diffract": ["--model.init_args.base.pretrain_steps=50"],
    "lock_in": ["--model.init_args.base.pretrain_steps=50"],
    "lokra": ["--model.init_args.base.pretrain_steps=50"],
    "csplora": ["--model.init_args.base.epochs=1"],
    "task_complexity": ["--model.init_args.base.pretrain_steps=50"],
    "scns": ["--model.init_args.base.pretrain_steps=5"],
}


@pytest.mark.parametrize("config", QUICK_CONFIGS, ids=[c.parent.name for c in QUICK_CONFIGS])
def test_every_quick_config_fits_with_fast_dev_run(config, tmp_path):
    extra = SHORT_BASE.get(config.parent.name, [])
    cli = run(["fit", f"--config={config}", "--trainer.fast_dev_run=true", *extra], tmp_path)
    assert cli.trainer.state.finished and cli.trainer.global_step >= 1


def test_run_layout_summary_checkpoint_and_loggers(tmp_path):
    cfg = ROOT / "configs/lokra/matrix.yaml"
    args = [
        "fit",
        f"--config={cfg}",
        "--trainer.max_steps=20",
        "--data.init_args.steps_per_epoch=10",
        "--model.init_args.mode=lokra_plus",
    ]
    cli = run(args, tmp_path)
    run_dir = cli.run_dir
    assert run_dir.parent == tmp_path / "runs" / "lokra" and run_dir.name.endswith("-s0")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["global_step"] == 20
    assert 0 <= summary["metrics"]["val/rel_err"] < 1.5
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    # the adapters alone, loadable onto a fresh base: same ΔW as the trained module's
    from litlab.lit_modules.core.adapters import load_adapters
    from litlab.lit_modules.peft.lokra import LoKRAMatrixApprox

    fresh = LoKRAMatrixApprox(mode="lokra_plus")
    load_adapters(fresh, run_dir / "adapters.safetensors")
    assert torch.allclose(fresh.adapted["layer"].delta_weight(), cli.model.adapted["layer"].delta_weight())
    assert list(run_dir.glob("csv/version_*/metrics.csv"))
    assert list(
        run_dir.glob("csv/version_*/config.yaml")
    )  # each attempt's resolved config beside its metrics
    callbacks = {type(c).__name__ for c in cli.trainer.callbacks}
    assert {"ModelCheckpoint", "LearningRateMonitor", "RunSummary"} <= callbacks
    # same config and seed -> same folder (this is what makes ckpt_path=last and repro reuse work)
    from litlab.cli import RunAlreadyFinished

    with pytest.raises(RunAlreadyFinished) as done:
        LitlabCLI(args=[*args, f"--runs_dir={tmp_path / 'runs'}"], skip_finished=True)
    assert done.value.run_dir == run_dir
    # validate the trained checkpoint in the same run folder: the same metric as at the end of fit
    validated = run(["validate", *args[1:], "--ckpt_path=last"], tmp_path)
    assert validated.run_dir == run_dir
    after = json.loads((run_dir / "summary-validate.json").read_text())["metrics"]["val/rel_err"]
    assert after == pytest.approx(summary["metrics"]["val/rel_err"], abs=1e-6)
    other_seed = run([*args, "--seed_everything=1"], tmp_path)
    assert other_seed.run_dir.name.endswith("-s1") and other_seed.run_dir.name[:10] == run_dir.name[:10]


def test_wandb_offline_logger_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = ROOT / "configs/lokra/matrix.yaml"
    cli = run(
        [
            "fit",
            f"--config={cfg}",
            "--trainer.max_steps=4",
            "--data.init_args.steps_per_epoch=2",
            "--trainer.enable_checkpointing=false",
        ],
        tmp_path,
    )
    assert {type(lg).__name__ for lg in cli.trainer.loggers} == {"WandbLogger", "CSVLogger"}
    assert list(cli.run_dir.glob("wandb/offline-run-*"))
    cli.trainer.loggers[0].experiment.finish()


def test_print_config_shows_resolved_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        LitlabCLI(args=["fit", f"--config={ROOT / 'configs/lokra/quick.yaml'}", "--print_config"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert (
        "litlab.lit_modules.peft.lokra.LoKRALanguageModel" in out
        and "eps: 0.0001" in out
        and "seed_everything: 0" in out
    )


@pytest.mark.parametrize(
    "bad,needle",
    [
        (["--model.init_args.rnak=4"], "rnak"),
        (["--model.init_args.adapter.rank=four"], "rank"),
        (["--model.init_args.mode=loha"], "mode"),
        (["--trainer.max_stepz=3"], "max_stepz"),
    ],
)
def test_bad_config_errors_name_the_key(bad, needle, capsys):
    with pytest.raises(SystemExit) as exit_info:
        LitlabCLI(args=["fit", f"--config={ROOT / 'configs/lokra/matrix.yaml'}", *bad])
    assert exit_info.value.code != 0
    assert needle in capsys.readouterr().err


def test_litlab_command_runs_from_the_shell(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = subprocess.run(
        [sys.executable, "-m", "litlab", "fit", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert out.returncode == 0 and "--ckpt_path" in out.stdout and "--run_id" in out.stdout


def test_full_scale_config_fails_at_once_offline(tmp_path, monkeypatch):
    from litlab.lit_modules.core.errors import ModelUnavailableError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.time()
    with pytest.raises(ModelUnavailableError) as err:
        run(
            [
                "fit",
                f"--config={ROOT / 'configs/lokra/full.yaml'}",
                "--trainer.accelerator=cpu",
                "--trainer.precision=32",
            ],
            tmp_path,
        )
    assert time.time() - started < 60
    text = str(err.value)
    assert "meta-llama/Meta-Llama-3-8B" in text and "hf download" in text
