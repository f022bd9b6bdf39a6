"""Every card's full config runs on its stand-in (issue 32 item 2, ``litlab.standin``): in a temp folder,
``litlab fit --config configs/<slug>/full.yaml --stand-in`` builds the tiny models and data records offline,
constructs the full config's classes, trains at least two steps and writes a checkpoint; a relaunch with
``--ckpt_path last`` resumes from it (the same run folder, the checkpoint's weights); ``validate`` / ``test`` from
the checkpoint evaluate with finite metrics (a module with neither step, whose loop evaluates inside the fit, has
finite ``val/`` metrics in the fit's summary). The stand-in itself is deterministic (two builds write the same bytes)
and leaves the process's torch generator alone.

A card's test is in the default suite when it was measured at or under ~20 s here (``FAST``); the others are
``slow`` (``pytest -m slow tests/test_standin.py -k <slug>``)."""

from __future__ import annotations

import filecmp
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from litlab.standin import STAND_INS, expand_stand_in_flag, prepared_stand_in, stand_in_args

ROOT = Path(__file__).resolve().parents[1]
# measured here on the shared 2-core machine, each after the first fit of the process (which pays ~18 s importing
# every method module): scns 7.8 s, xkv 6.9, sale 9.2, salaad 9.4, lordo 10.4, litevsr 9.5 (slow: its full config
# already runs in the default suite in tests/test_litevsr_full.py). A card's family adds it here when its stand-in
# test takes ~20 s or less. janus_lora 5.4 s, loda 4.3, dare 5.1, ngt 7.0 (Pendulum-v1 where MuJoCo is missing, as in
# CI); u3cf 17-35 s and sfda_regression 18-27 s stay slow (they need torchvision).
FAST = {"scns", "xkv", "sale", "salaad", "lordo", "janus_lora", "loda", "dare", "ngt"}
FAST |= {"lock_in", "task_complexity"}  # 18.6 s and 7.3 s here at load 9; diffract (31 s) stays slow
FAST |= {"spr_raft", "lokra"}  # 5.9 s and 5.5 s here; csplora (20 s, 16-45 s at load 10) stays slow


# cards whose full config builds a torchvision ResNet: their fit is skipped where torchvision does not import
NEEDS_TORCHVISION = {"u3cf", "sfda_regression"}


def torchvision_missing() -> str | None:
    """The domain family's message when torchvision does not import here (its install line), else None."""
    from litlab.lit_modules.core.errors import ModelUnavailableError
    from litlab.lit_modules.domain.nets import resnet_weights_file

    try:
        resnet_weights_file("resnet18", None)
    except ModelUnavailableError as err:
        return str(err)
    return None


def cards(fast: set[str] = FAST) -> list:
    return [pytest.param(s, marks=() if s in fast else pytest.mark.slow, id=s) for s in STAND_INS]


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def fit(argv: list[str]):
    from litlab.cli import LitlabCLI

    return LitlabCLI(args=expand_stand_in_flag(argv))


@pytest.mark.parametrize("slug", cards())
def test_full_config_runs_on_its_stand_in(slug, tmp_path, monkeypatch):
    from lightning.pytorch.utilities.model_helpers import is_overridden

    from litlab.callbacks.divergence import first_nonfinite

    if slug in NEEDS_TORCHVISION and (missing := torchvision_missing()):
        pytest.skip(missing)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory but under --runs_dir
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns when pytest's arguments are there too
    config = ROOT / "configs" / slug / "full.yaml"
    common = [f"--config={config}", "--stand-in", f"--runs_dir={tmp_path / 'runs'}"]
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]

    first = fit(["fit", *common, *quiet])
    trainer = first.trainer
    assert trainer.state.finished and trainer.global_step >= 2, (slug, trainer.global_step)
    ckpt = first.run_dir / "checkpoints" / "last.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in ckpt.parent.glob("*"))
    assert sorted(os.listdir(tmp_path)) == ["runs"]

    # the relaunch finds the same stand-in files, so the same config hash and run folder, and resumes
    again = fit(["fit", *common, *quiet, "--ckpt_path=last"])
    assert again.run_dir == first.run_dir
    assert again.config.fit.ckpt_path == str(ckpt)  # what litlab resolved 'last' to and passed to Trainer.fit
    if again.trainer.ckpt_path is not None:  # None where the ranks ran in processes of their own (LoRDO's)
        assert again.trainer.ckpt_path == str(ckpt)
    assert again.trainer.global_step == trainer.global_step
    # the trained tensors the checkpoint holds are the model's now (frozen public weights may be left out of it)
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    now = again.model.state_dict()
    # (an entry that is not a tensor, an adapter layer's extra state, compares by value)
    assert all(torch.equal(now[k].cpu(), v) if torch.is_tensor(v) else now[k] == v for k, v in saved.items())

    evaluated = []
    for subcommand, hook in (("validate", "validation_step"), ("test", "test_step")):
        if not is_overridden(hook, first.model):
            continue
        run = fit([subcommand, *common, *quiet, f"--ckpt_path={ckpt}"])
        metrics = dict(run.trainer.callback_metrics)
        assert metrics, (slug, subcommand)
        assert first_nonfinite(metrics, run.model) is None, (slug, subcommand, metrics)
        evaluated.append(subcommand)
    if not evaluated:  # a loop that evaluates inside the fit (SCNS: at the end of each concept's task)
        metrics = json.loads((first.run_dir / "summary.json").read_text())["metrics"]
        assert any(k.startswith(("val/", "test/")) for k in metrics), (slug, sorted(metrics))
        assert first_nonfinite(metrics, first.model) is None, (slug, metrics)


@pytest.mark.parametrize("slug", cards(fast=set(STAND_INS)))  # a stand-in takes seconds (litlab.standin)
def test_stand_in_is_deterministic_and_leaves_the_generator_alone(slug, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    state = torch.random.get_rng_state()
    args = [stand_in_args(slug, tmp_path / name) for name in ("a", "b")]
    assert torch.equal(torch.random.get_rng_state(), state)
    assert args[0] and args[0] == [a.replace(str(tmp_path / "b"), str(tmp_path / "a")) for a in args[1]]
    names = files_under(tmp_path / "a")
    assert names and names == files_under(tmp_path / "b")
    _, differ, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", names, shallow=False)
    assert not differ and not errors, f"{slug}: two builds differ in {differ + errors}"


def test_the_flag_expands_where_it_stands_and_the_folder_is_reused(tmp_path, monkeypatch):
    """``--stand-in`` becomes the card's arguments at its place (later overrides win), the folder is written once
    (``stand_in.json``) and reused, and written again when its record is not this stand-in's."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = []

    def stand_in(workdir: Path) -> list[str]:
        calls.append(workdir)
        (workdir / "model").mkdir()
        return [f"--model.init_args.path={workdir / 'model'}", "--trainer.max_steps=2"]

    import litlab.standin as standin

    monkeypatch.setattr(standin, "stand_in_function", lambda slug: stand_in)
    monkeypatch.setitem(standin.STAND_INS, "toy", "tests.test_standin:stand_in")
    argv = [
        "fit",
        "-c",
        "configs/toy/full.yaml",
        "--stand-in",
        "--trainer.max_steps=5",
        f"--runs_dir={tmp_path}",
    ]
    expanded = expand_stand_in_flag(argv)
    workdir = (tmp_path / "toy" / "stand_in").resolve()
    assert expanded == [
        "fit",
        "-c",
        "configs/toy/full.yaml",
        f"--model.init_args.path={workdir / 'model'}",
        "--trainer.max_steps=2",
        "--trainer.max_steps=5",
        f"--runs_dir={tmp_path}",
    ]
    assert expand_stand_in_flag([*argv, "--experiment=other"])[3].startswith(
        f"--model.init_args.path={(tmp_path / 'other' / 'stand_in').resolve()}"
    )
    assert expand_stand_in_flag(argv) == expanded and len(calls) == 2  # reused
    (workdir / "stand_in.json").write_text("{}")  # another version's (or a half-written) folder
    assert expand_stand_in_flag(argv) == expanded and len(calls) == 3
    assert prepared_stand_in("toy", workdir) == expanded[3:5] and len(calls) == 3
    assert expand_stand_in_flag(argv[:3]) == argv[:3]  # no flag: unchanged


def test_a_missing_stand_in_or_config_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from litlab.lit_modules.core.errors import ConfigError

    with pytest.raises(ConfigError, match="no stand-in for card 'nope'"):
        expand_stand_in_flag(
            ["fit", "--config=configs/nope/full.yaml", "--stand-in", f"--runs_dir={tmp_path}"]
        )
    with pytest.raises(ConfigError, match="needs the card's full config"):
        expand_stand_in_flag(["fit", "--stand-in"])
    with pytest.raises(ConfigError, match="--experiment must be a folder name"):
        expand_stand_in_flag(["fit", "--config=configs/xkv/full.yaml", "--stand-in", "--experiment=../x"])


def test_hub_text_datamodule_streams_a_local_copy_in_the_hub_layout(tmp_path, monkeypatch):
    """``HubTextDataModule(local_dir=...)``: the C4-layout shards stream through the same loader, train and
    validation from their file names; a folder without the subset's files is named at construction."""
    from litlab.datamodules.text import HubTextDataModule
    from litlab.lit_modules.core.errors import DatasetUnavailableError
    from litlab.lit_modules.core.standin_text import write_c4_layout, write_gpt2_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    c4 = write_c4_layout(tmp_path / "c4", docs={"train": 4, "validation": 2})
    tok = write_gpt2_tokenizer(tmp_path / "gpt2")
    dm = HubTextDataModule(local_dir=str(c4), tokenizer=str(tok), block_size=32, batch_size=2, val_batches=1)
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (2, 32) and torch.equal(
        batch["input_ids"][0, 1:], batch["labels"][0, :-1]
    )
    (val,) = list(dm.val_dataloader())
    assert not torch.equal(val["input_ids"], batch["input_ids"])  # another split's text
    with pytest.raises(DatasetUnavailableError, match=r"holds no file of data set 'allenai/c4'"):
        HubTextDataModule(local_dir=str(tmp_path / "nothing"), tokenizer=str(tok))


def test_repro_refuses_a_stand_in_record_or_another_scale(capsys):
    from litlab.repro import main

    for argv, says in (
        (["xkv", "--scale", "full", "--stand-in", "--record"], "not the card's"),
        (["xkv", "--scale", "full", "--stand-in", "--check-recorded"], "not the card's"),
        (["xkv", "--stand-in"], "give --scale full"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.slow
def test_repro_runs_the_full_scale_runs_on_the_stand_in(tmp_path, monkeypatch):
    """``litlab repro xkv --scale full --stand-in``: every full-scale run of the card at its full seeds, on the
    stand-in's files written once under ``<out>/xkv/stand_in``, each run's own overrides kept (xKV-4 and per-layer
    SVD differ in compression ratio)."""
    from litlab.cards import load_card, project_path
    from litlab.repro import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the report hook finds config.yaml in csv/version_0 then
    monkeypatch.chdir(tmp_path)
    assert main(["xkv", "--scale", "full", "--stand-in", "--out", str(tmp_path / "out")]) == 0
    results = json.loads((tmp_path / "out" / "xkv" / "results.json").read_text())
    card = load_card(project_path("seeds/xkv.yaml"))
    assert set(results["runs"]) == set(card.runs_for("full")) and results["seeds"] == list(card.seeds["full"])
    assert (tmp_path / "out" / "xkv" / "stand_in" / "stand_in.json").is_file()
    ratios = {name: run["metrics"]["val/compression_ratio"][0] for name, run in results["runs"].items()}
    assert len(set(ratios.values())) == len(ratios), ratios


def test_a_runs_config_is_read_where_lightning_cli_wrote_it(tmp_path):
    """``SeedRun.config()``: the run folder's ``config.yaml`` (a wandb logger first), else the newest
    ``csv/version_N/config.yaml`` (the CSV logger alone, ``WANDB_MODE=disabled``); none is named."""
    from litlab.lit_modules.core.results import SeedRun

    run = SeedRun(seed=0, value=0.0, run_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="holds no config.yaml"):
        run.config()
    for version, lr in ((2, 0.2), (10, 0.3), (1, 0.1)):
        (tmp_path / "csv" / f"version_{version}").mkdir(parents=True)
        (tmp_path / "csv" / f"version_{version}" / "config.yaml").write_text(f"model: {{lr: {lr}}}\n")
    assert run.config() == {"model": {"lr": 0.3}}
    (tmp_path / "config.yaml").write_text("model: {lr: 1.0}\n")
    assert run.config() == {"model": {"lr": 1.0}}


def test_the_folder_is_written_again_when_a_helper_the_stand_in_calls_changes(tmp_path):
    import importlib.util
    import sys

    from litlab.standin import stand_in_source_sha256

    def load(name: str, source: str):
        path = tmp_path / f"{name.rpartition('.')[2]}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    try:
        load("litlab._probe_helper", "def write(workdir):\n    return ['--a=1']\n")
        stand_in = load(
            "litlab._probe_stand_in",
            "from litlab._probe_helper import write\n\ndef stand_in(workdir):\n    return write(workdir)\n",
        )
        before = stand_in_source_sha256(stand_in.stand_in)
        assert stand_in_source_sha256(stand_in.stand_in) == before
        load("litlab._probe_helper", "def write(workdir):\n    return ['--a=2', '--b=3']\n")
        stand_in = load(
            "litlab._probe_stand_in",
            "from litlab._probe_helper import write\n\ndef stand_in(workdir):\n    return write(workdir)\n",
        )
        assert stand_in_source_sha256(stand_in.stand_in) != before
    finally:
        sys.modules.pop("litlab._probe_helper", None)
        sys.modules.pop("litlab._probe_stand_in", None)
