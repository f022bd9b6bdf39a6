"""Every RL config builds: quick variants smoke-run (fast_dev_run); full-scale configs stop at once, saying
what is missing (MuJoCo, or the locally generated D4RL-layout data set), when it is missing."""

from pathlib import Path

import pytest

from litlab.cli import LitlabCLI
from litlab.lit_modules.core.errors import ResourceUnavailableError

ROOT = Path(__file__).resolve().parent.parent
SMOKE = [
    "configs/dare/quick.yaml",
    "configs/dare/diffusion.yaml",
    "configs/ngt/quick.yaml",
    "configs/ngt/bc.yaml",
    "configs/ngt/exp_shaping.yaml",
]
FULL = [
    "configs/dare/full.yaml",
    "configs/ngt/full.yaml",
    "configs/ngt/humanoid_hlg.yaml",
    "configs/ngt/hopper_state_only.yaml",
]


@pytest.mark.parametrize("config", SMOKE)
def test_quick_variants_smoke_run(config, tmp_path):
    cli = LitlabCLI(
        args=[
            "fit",
            f"--config={ROOT / config}",
            "--trainer.fast_dev_run=true",
            f"--runs_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    assert cli.trainer.state.finished and cli.trainer.global_step >= 1


@pytest.mark.parametrize("config", FULL)
def test_full_scale_configs_fail_at_once_when_data_or_mujoco_is_missing(config, tmp_path, monkeypatch):
    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path / "empty_cache"))
    with pytest.raises(ResourceUnavailableError, match=r"gymnasium\[mujoco\]|litlab data d4rl --env"):
        LitlabCLI(args=["fit", f"--config={ROOT / config}", f"--runs_dir={tmp_path}"])
