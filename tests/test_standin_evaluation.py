"""The stand-ins of the continual, RL and domain cards (``lit_modules/{continual,rl,domain}/standin.py``) and the
evaluation of a checkpoint they made necessary: ``litlab test`` on a continual or RL run, whose loops evaluate
inside the fit, replays that evaluation from the checkpoint (the last row of the accuracy matrix; the evaluation
episodes). The generic fit / resume / evaluate test of every card is ``tests/test_standin.py``."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from litlab.standin import expand_stand_in_flag

ROOT = Path(__file__).resolve().parents[1]


def run(subcommand: str, slug: str, tmp_path: Path, *extra: str):
    from litlab.cli import LitlabCLI

    argv = [
        subcommand,
        f"--config={ROOT / 'configs' / slug / 'full.yaml'}",
        "--stand-in",
        f"--runs_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        *extra,
    ]
    return LitlabCLI(args=expand_stand_in_flag(argv))


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns when pytest's arguments are there too


def test_continual_test_of_the_last_checkpoint_is_the_accuracy_matrix_last_row(tmp_path, offline):
    """LoDA's full config on its stand-in (tiny ViTModel, ImageNet-R folders, 2 tasks): ``litlab test`` from the
    fit's last checkpoint gives, per task, the accuracy the fit's AccuracyMatrixCallback recorded after the last
    task, and over all samples its ACC."""
    from litlab.callbacks.continual import AccuracyMatrixCallback

    first = run("fit", "loda", tmp_path)
    (matrix,) = [c for c in first.trainer.callbacks if isinstance(c, AccuracyMatrixCallback)]
    assert len(matrix.R) == 2 and len(first.model.proto_labels) == 4  # 2 tasks, 4 classes
    tested = run("test", "loda", tmp_path, f"--ckpt_path={first.run_dir / 'checkpoints' / 'last.ckpt'}")
    metrics = {k: float(v) for k, v in tested.trainer.callback_metrics.items()}
    assert [metrics[f"test/acc_task{j}"] for j in range(2)] == pytest.approx(matrix.R[-1], abs=1e-6)
    assert metrics["test/acc"] == pytest.approx(matrix.metrics()["cl/acc"], abs=1e-6)


def test_rl_test_replays_the_evaluation_episodes_of_the_fit(tmp_path, offline):
    """DARE's full config on its stand-in: ``litlab test`` plays the restored policy from the evaluation
    callback's reset seeds, so its two episodes (the stand-in's callback plays two too) return what the fit's
    final evaluation did."""
    from litlab.callbacks.rl_eval import RLEvalCallback

    first = run("fit", "dare", tmp_path)
    (callback,) = [c for c in first.trainer.callbacks if isinstance(c, RLEvalCallback)]
    assert callback.n_episodes == 2 and first.datamodule.iteration == 16
    assert len(first.model.mechanism) == 5  # DARE's mask ran on the online steps that had a full online batch
    final = callback.history[-1]
    tested = run(
        "test",
        "dare",
        tmp_path,
        f"--ckpt_path={first.run_dir / 'checkpoints' / 'last.ckpt'}",
    )
    assert tested.trainer.limit_test_batches == 2
    assert float(tested.trainer.callback_metrics["test/return"]) == pytest.approx(
        final["eval/return"], rel=1e-5
    )


def test_rl_stand_in_uses_the_configs_env_where_mujoco_imports(tmp_path):
    from litlab.lit_modules.rl.contract import load_dataset
    from litlab.lit_modules.rl.standin import CONFIG_ENV, FALLBACK_ENV, stand_in_dare, stand_in_ngt

    for slug in ("dare", "ngt"):
        config = yaml.safe_load((ROOT / "configs" / slug / "full.yaml").read_text())
        assert config["data"]["init_args"]["env_id"] == CONFIG_ENV
    has_mujoco = importlib.util.find_spec("mujoco") is not None
    env_id = CONFIG_ENV if has_mujoco else FALLBACK_ENV
    for slug, stand_in, level in (("dare", stand_in_dare, "medium"), ("ngt", stand_in_ngt, "expert")):
        args = stand_in(tmp_path / slug)
        assert (f"--data.init_args.env_id={FALLBACK_ENV}" in args) is not has_mujoco
        data = load_dataset(tmp_path / slug / f"{env_id}-{level}.hdf5")
        dims = (11, 3) if env_id == CONFIG_ENV else (3, 1)
        assert (data["observations"].shape[1], data["actions"].shape[1]) == dims
        assert 300 <= len(data["rewards"]) <= 1000 and data["timeouts"][-1]


def test_domain_stand_in_files_are_what_the_full_datamodules_read(tmp_path):
    """Office-31 as its archive lays it out (<domain>/images/<class>/; before, the DataModule took ``images`` for
    the one class) and dSprites' image lists as RSD releases them (4 factor values a line; before, only 3 were read)
    as the stand-ins write them, read by the full configs'
    DataModules (without torchvision: the ImageFolder rules are litlab's own then)."""
    from litlab.datamodules.domain import MultiTargetDigitsDataModule, RegressionDomainsDataModule
    from litlab.lit_modules.domain import standin

    standin.stand_in_u3cf(tmp_path)
    office = MultiTargetDigitsDataModule(
        benchmark="office31",
        source="amazon",
        targets=["dslr", "webcam"],
        data_root=str(tmp_path / "office31"),
        image_size=standin.IMAGE_SIZE,
    )
    office.setup()
    assert office.classes == list(standin.OFFICE31_CLASSES)
    assert office.source_x.shape == (9, 3, 64, 64) and [len(x) for x in office.target_x] == [9, 9]
    for domain in standin.OFFICE31_DOMAINS:  # Office-31 without its images/ level reads the same
        shutil.copytree(tmp_path / "office31" / domain / "images", tmp_path / "flat" / domain)
    flat = MultiTargetDigitsDataModule(
        benchmark="office31",
        source="amazon",
        targets=["dslr"],
        data_root=str(tmp_path / "flat"),
        image_size=64,
    )
    flat.setup()
    assert flat.classes == office.classes and torch.equal(flat.source_x, office.source_x)
    standin.stand_in_sfda_regression(tmp_path)
    dsprites = RegressionDomainsDataModule(
        benchmark="dsprites", source="color", target="noisy", data_root=str(tmp_path / "dsprites"), size=64
    )
    dsprites.setup()
    assert len(dsprites.source_dataset) == 24 and len(dsprites.target_train_dataset) == 16
    # RSD's lines carry (scale, orientation, x, y): the targets are scale, x, y, min-max scaled on the source
    lines = (tmp_path / "dsprites" / "color.txt").read_text().split("\n")[:-1]
    factors = torch.tensor([[float(v) for v in line.split()[1:]] for line in lines])
    assert factors.shape == (24, 4)
    expected = factors[:, [0, 2, 3]]
    expected = (expected - expected.min(0).values) / (expected.max(0).values - expected.min(0).values)
    torch.testing.assert_close(dsprites.source_dataset.tensors[1], expected)
    # the task letters the card's runs use at every scale (RSD's and TLLib's scripts too) name the same domains
    letters = RegressionDomainsDataModule(
        benchmark="dsprites", source="C", target="S", data_root=str(tmp_path / "dsprites"), size=64
    )
    assert (letters.source_domain, letters.target) == ("color", "scream")
    letters.setup()
    assert torch.equal(letters.source_dataset.tensors[0], dsprites.source_dataset.tensors[0])
