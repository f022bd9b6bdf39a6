"""The continual family's written contracts (lit_modules/continual/contract.py): what the harness needs from
its DataModule and from a task-end callback, checked once at setup; the Trainer alone runs the DataModule's
hooks; the family's report and the step-time benchmark."""

import dataclasses
import json

import lightning as L
import pytest
import torch

from litlab.benchmarks import continual_steps
from litlab.callbacks.continual import AccuracyMatrixCallback
from litlab.datamodules.continual import ContinualDataModule
from litlab.lit_modules.continual.contract import (
    ContinualData,
    TaskEndCallback,
    TaskTestSets,
    task_end_callbacks,
)
from litlab.lit_modules.continual.harness import Backbone, SequentialLoRA
from litlab.lit_modules.continual.report import accuracy_matrix_report
from litlab.lit_modules.core.contracts import protocol_members
from litlab.lit_modules.core.errors import ContractError
from litlab.lit_modules.core.results import CardResult, ReportExtras, RunResult, SeedRun

FAST = dict(backbone=Backbone(pretrain_epochs=2))


def _trainer(quiet_trainer, dm, callbacks=()):
    # quiet_trainer writes under the test's tmp_path: the accuracy-matrix files land there
    return quiet_trainer(
        max_epochs=dm.num_tasks * dm.epochs_per_task,
        reload_dataloaders_every_n_epochs=1,
        callbacks=list(callbacks),
    )


def test_the_contracts_name_what_the_harness_reads():
    assert protocol_members(TaskTestSets) == ["num_tasks", "task_test_loader"]
    assert set(protocol_members(ContinualData)) == {
        "num_tasks",
        "task_test_loader",
        "epochs_per_task",
        "num_classes",
        "input_kind",
        "pretext_inputs",
        "scenario_kind",
        "cumulative",
        "task_of_epoch",
        "train_classes",
        "task_train_loader",
    }
    assert protocol_members(TaskEndCallback) == ["on_task_end"]
    assert ContinualDataModule(cumulative=True).cumulative is True


def test_a_datamodule_lacking_a_member_is_named_with_its_class():
    class Lacking(L.LightningDataModule):  # a task sequence without cumulative / scenario_kind / ...
        num_tasks, epochs_per_task, num_classes = 1, 1, 10

        def task_test_loader(self, t, batch_size=512):
            return []

    dm = Lacking()
    with pytest.raises(ContractError, match=r"Lacking lacks 'input_kind', which SequentialLoRA needs"):
        SequentialLoRA(**FAST).build(dm)


def test_members_set_in_setup_are_missing_until_setup_ran():
    with pytest.raises(ContractError, match=r"ContinualDataModule lacks 'input_kind'.*setup\(\)"):
        SequentialLoRA(**FAST).build(ContinualDataModule())


class _CountingSetup(ContinualDataModule):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.setup_calls = []

    def setup(self, stage=None):
        self.setup_calls.append(stage)
        super().setup(stage)


def test_only_the_trainer_runs_the_datamodule_setup(quiet_trainer):
    dm = _CountingSetup(num_tasks=2, epochs_per_task=1)
    L.seed_everything(0)
    _trainer(quiet_trainer, dm, [AccuracyMatrixCallback()]).fit(SequentialLoRA(**FAST), dm)
    assert dm.setup_calls == ["fit"]


class _BadTaskEnd(L.Callback):
    def on_task_end(self, trainer, pl_module):  # lacks the task index
        pass


class _Listener(L.Callback):
    def __init__(self):
        self.tasks = []

    def on_task_end(self, trainer, pl_module, t):
        self.tasks.append(t)


def test_task_end_callbacks_are_checked_once_and_called_in_order(quiet_trainer):
    with pytest.raises(ContractError, match=r"_BadTaskEnd.on_task_end must accept \(trainer, pl_module, t\)"):
        task_end_callbacks([_BadTaskEnd()])
    plain, listener = L.Callback(), _Listener()
    assert task_end_callbacks([plain, listener]) == [listener]
    dm = ContinualDataModule(num_tasks=2, epochs_per_task=1)
    L.seed_everything(0)
    _trainer(quiet_trainer, dm, [listener]).fit(SequentialLoRA(**FAST), dm)
    assert listener.tasks == [0, 1]
    dm = ContinualDataModule(num_tasks=2, epochs_per_task=1)
    with pytest.raises(ContractError, match="_BadTaskEnd"):
        _trainer(quiet_trainer, dm, [_BadTaskEnd()]).fit(SequentialLoRA(**FAST), dm)


def test_accuracy_matrix_callback_checks_its_datamodule():
    class NoTests(L.LightningDataModule):
        num_tasks = 2

    with pytest.raises(ContractError, match="NoTests lacks 'task_test_loader'.*AccuracyMatrixCallback"):
        AccuracyMatrixCallback().setup(type("T", (), {"datamodule": NoTests()})(), None, "fit")


def _card_result(tmp_path) -> CardResult:
    runs = {}
    for name, R in (("seq_lora", [[1.0, 0.0], [0.5, 0.9]]), ("janus_lora", [[1.0, 0.0], [0.8, 0.9]])):
        seed_runs = []
        for seed in (0, 1):
            d = tmp_path / f"{name}-s{seed}"
            d.mkdir(parents=True)
            metrics = {"cl/acc": 0.7, "cl/bwt": R[1][0] - 1.0, "cl/forgetting": 1.0 - R[1][0], "cl/maa": 0.8}
            (d / "accuracy_matrix.json").write_text(json.dumps({"R": R, "metrics": metrics}))
            seed_runs.append(SeedRun(seed=seed, value=0.7, run_dir=d))
        runs[name] = RunResult(name, "cl/acc", [0, 1], [0.7, 0.7], 0.7, 0.0, seed_runs)
        runs[f"{name}_bwt"] = RunResult(f"{name}_bwt", "cl/bwt", [0, 1], [0.0, 0.0], 0.0, 0.0, seed_runs)
    return CardResult(
        slug="janus_lora",
        title="t",
        claim="c",
        scale="quick",
        seeds=[0, 1],
        metric_name="cl/acc",
        metric_mode="max",
        runs=runs,
        date="2026-12-01",
        wall_time_s=1.0,
    )


def test_report_reads_each_distinct_run_once_and_times_nothing(tmp_path):
    extras = accuracy_matrix_report(_card_result(tmp_path / "runs"), tmp_path / "out", slug="janus_lora")
    assert isinstance(extras, ReportExtras) and extras.numbers == {}
    assert extras.figures == [tmp_path / "out" / "janus_lora_accuracy_matrices.png"]
    assert extras.figures[0].stat().st_size > 1000
    table = [
        line for line in extras.markdown.splitlines() if line.startswith("| seq_lora") or "janus" in line
    ]
    assert table == [
        "| seq_lora | 0.700 | -0.500 | 0.500 | 0.800 | 2 |",
        "| janus_lora | 0.700 | -0.200 | 0.200 | 0.800 | 2 |",
    ]
    assert "litlab bench continual_steps" in extras.markdown


def test_card_report_hooks_are_the_family_report(tmp_path):
    from litlab.lit_modules.continual import janus_lora, loda

    result = _card_result(tmp_path / "runs")
    for hook, slug in ((janus_lora.report, "janus_lora"), (loda.report, "loda")):
        extras = hook(result, tmp_path / slug)
        assert extras.numbers == {} and extras.figures[0].name == f"{slug}_accuracy_matrices.png"


def test_benchmark_rejects_an_unknown_method(capsys):
    with pytest.raises(SystemExit):
        continual_steps.main(["--methods", "no_such_method"])
    assert "no_such_method" in capsys.readouterr().err
    assert set(continual_steps.METHODS) >= {"lora", "janus_lora", "loda", "inflora", "olora", "lora_gpm"}
    with pytest.raises(ValueError, match="steps >= 1"):
        continual_steps.time_training_steps({}, ContinualDataModule(), steps=0)


def test_benchmark_prints_every_method_relative_to_lora(capsys, monkeypatch):
    fast = {n: (lambda f=f: _fast(f())) for n, f in continual_steps.METHODS.items()}
    monkeypatch.setattr(continual_steps, "METHODS", fast)
    torch.manual_seed(0)
    assert (
        continual_steps.main(["--methods", "janus_lora", "loda", "--steps", "2", "--warmup-steps", "1"]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[2:]] == ["lora", "janus_lora", "loda"]
    assert float(out[2].split()[-1]) == 1.0


def _fast(module):
    module.backbone_cfg = dataclasses.replace(module.backbone_cfg, pretrain_epochs=2)
    return module


def test_the_continual_cards_share_one_task_stream():
    """Every quick run of both continual cards reads configs/continual/digits_stream.yaml and changes nothing of it
    but ``cumulative`` (the joint-training ceiling); each card has a frozen floor and that ceiling."""
    import yaml

    from litlab.cards import load_card, project_path

    stream = project_path("configs/continual/digits_stream.yaml")
    for slug in ("janus_lora", "loda"):
        card = load_card(project_path(f"seeds/{slug}.yaml"), check_preregistration=False)
        roles = {spec.role for spec in card.runs.values()}
        assert {"floor", "ceiling"} <= roles, slug
        for name, spec in card.runs_for("quick").items():
            config = project_path(spec.config_path("quick"))
            data = yaml.safe_load(config.read_text())["data"]
            assert (config.parent / data).resolve() == stream.resolve(), (slug, name)
            data_overrides = {k: v for k, v in spec.all_overrides("quick").items() if k.startswith("data")}
            assert data_overrides in ({}, {"data.init_args.cumulative": True}), (slug, name, data_overrides)
            assert (data_overrides != {}) == (spec.role == "ceiling"), (slug, name)
