"""The continual-learning protocol: task-sequence DataModule, accuracy-matrix callback and metrics, the shared
module's task hooks under a real Trainer (incl. resuming mid-task from a checkpoint), and the baselines."""

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from litlab.benchmarks.continual_steps import time_training_steps
from litlab.callbacks.continual import AccuracyMatrixCallback, cl_metrics
from litlab.checkpoint_io import SafeCheckpointIO
from litlab.datamodules.continual import ContinualDataModule
from litlab.lit_modules.continual.baselines import InfLoRA, OLoRA
from litlab.lit_modules.continual.harness import Backbone, SequentialLoRA
from litlab.lit_modules.continual.janus_lora import JanusLoRA

ROOT = Path(__file__).resolve().parent.parent
FAST = dict(backbone=Backbone(pretrain_epochs=2))


# ---- data -------------------------------------------------------------------------------------------
def test_split_digits_tasks_are_disjoint_class_sets():
    dm = ContinualDataModule(num_tasks=5)
    dm.setup()
    assert dm.task_classes == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]] and dm.scenario_kind == "class"
    for t in range(5):
        assert set(dm.train_sets[t][1].unique().tolist()) == set(dm.task_classes[t])
        assert set(dm.test_sets[t][1].unique().tolist()) == set(dm.task_classes[t])
    assert sum(len(s[1]) for s in dm.train_sets) == 1257 and sum(len(s[1]) for s in dm.test_sets) == 540
    assert dm.train_sets[0][0].shape[1:] == (1, 8, 8)
    shuffled = ContinualDataModule(num_tasks=5, class_order="shuffled")
    shuffled.setup()
    assert sorted(c for cs in shuffled.task_classes for c in cs) == list(range(10))
    assert shuffled.task_classes != dm.task_classes
    cumulative = ContinualDataModule(cumulative=True)
    cumulative.setup()
    assert cumulative.train_classes(2) == [0, 1, 2, 3, 4, 5] and len(cumulative._task_train(2)) > len(
        dm._task_train(2)
    )


@pytest.mark.parametrize("benchmark", ["digits", "mnist1d"])
@pytest.mark.parametrize("scenario", ["permuted", "rotated"])
def test_domain_incremental_variants(benchmark, scenario):
    dm = ContinualDataModule(benchmark=benchmark, scenario=scenario, num_tasks=3)
    dm.setup()
    assert dm.scenario_kind == "domain" and all(cs == list(range(10)) for cs in dm.task_classes)
    x0, x1 = dm.train_sets[0][0], dm.train_sets[1][0]
    assert x0.shape == x1.shape and not torch.allclose(x0, x1)
    assert torch.equal(dm.train_sets[0][1], dm.train_sets[2][1])
    if scenario == "permuted":  # a permutation of the features: same multiset of values per sample
        assert torch.allclose(x0.flatten(1).sort(1).values, x1.flatten(1).sort(1).values)


def test_mnist1d_is_generated_locally_as_tokens():
    dm = ContinualDataModule(benchmark="mnist1d")
    dm.setup()
    assert dm.input_kind == "tokens" and dm.input_shape == (10, 4)
    assert sum(len(s[1]) for s in dm.train_sets) == 4000 and sum(len(s[1]) for s in dm.test_sets) == 1000


def test_bad_data_arguments_are_named():
    with pytest.raises(ValueError, match="num_tasks must divide 10"):
        ContinualDataModule(num_tasks=3)
    with pytest.raises(ValueError, match="'cifar'"):
        ContinualDataModule(benchmark="cifar")
    with pytest.raises(ValueError, match="scenario"):
        ContinualDataModule(scenario="shuffled")


# ---- metrics ----------------------------------------------------------------------------------------
def test_cl_metrics_on_a_hand_made_matrix():
    R = [[0.9, 0.0, 0.0], [0.6, 0.8, 0.0], [0.5, 0.7, 0.9]]
    sizes = [10, 10, 20]
    correct = [[round(r * n) for r, n in zip(row, sizes)] for row in R]
    m = cl_metrics(R, correct, sizes, init_acc=[0.1, 0.1, 0.1])
    assert m["cl/acc"] == pytest.approx((5 + 7 + 18) / 40)
    assert m["cl/acc_task_mean"] == pytest.approx(0.7)
    assert m["cl/maa"] == pytest.approx((0.9 + 14 / 20 + 30 / 40) / 3)
    assert m["cl/bwt"] == pytest.approx(((0.5 - 0.9) + (0.7 - 0.8)) / 2)
    assert m["cl/forgetting"] == pytest.approx(((0.9 - 0.5) + (0.8 - 0.7)) / 2)
    assert m["cl/fwt"] == pytest.approx(((0.0 - 0.1) + (0.0 - 0.1)) / 2)


# ---- the task loop under a real Trainer --------------------------------------------------------------
class _StopAfterEpoch(L.Callback):
    def __init__(self, epoch):
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


def _fit(quiet_trainer, module, dm, root, stop_after=None, ckpt_path=None):
    callbacks = [AccuracyMatrixCallback(), ModelCheckpoint(dirpath=str(root / "ckpt"), save_last=True)]
    if stop_after is not None:
        callbacks.append(_StopAfterEpoch(stop_after))
    trainer = quiet_trainer(
        max_epochs=dm.num_tasks * dm.epochs_per_task,
        reload_dataloaders_every_n_epochs=1,
        callbacks=callbacks,
        enable_checkpointing=True,
        default_root_dir=str(root),
        plugins=[SafeCheckpointIO()],
        deterministic=True,
    )
    trainer.fit(module, dm, ckpt_path=ckpt_path)
    return trainer, callbacks[0]


def test_one_fit_walks_the_tasks_and_fills_the_matrix(tmp_path, quiet_trainer):
    L.seed_everything(0)
    dm = ContinualDataModule(num_tasks=5, epochs_per_task=1)
    trainer, acc = _fit(quiet_trainer, JanusLoRA(**FAST), dm, tmp_path)
    assert len(acc.R) == 5 and all(len(r) == 5 for r in acc.R)
    assert all(
        acc.R[i][j] == 0.0 for i in range(5) for j in range(i + 1, 5)
    )  # unseen classes: never predicted
    # above chance among the seen classes, 1/(2i+2) (a 2-epoch backbone: not much above on the last tasks)
    assert all(acc.R[i][i] > 1 / (2 * i + 2) for i in range(5))
    metrics = trainer.callback_metrics
    for k in ("cl/acc", "cl/bwt", "cl/forgetting", "cl/maa", "cl/fwt", "cl/violation_max"):
        assert k in metrics
    saved = json.loads((tmp_path / "accuracy_matrix.json").read_text())
    assert saved["R"] == acc.R and (tmp_path / "accuracy_matrix.png").stat().st_size > 1000


def test_resume_mid_task_from_checkpoint_matches_an_uninterrupted_run(tmp_path, quiet_trainer):
    """Janus-LoRA with online statistics, stopped in the middle of task 1 and resumed from last.ckpt."""
    dm_kw = dict(num_tasks=2, epochs_per_task=2)
    L.seed_everything(0)
    _, full = _fit(quiet_trainer, JanusLoRA(**FAST), ContinualDataModule(**dm_kw), tmp_path / "full")
    L.seed_everything(0)
    _fit(quiet_trainer, JanusLoRA(**FAST), ContinualDataModule(**dm_kw), tmp_path / "cut", stop_after=2)
    L.seed_everything(0)
    _, resumed = _fit(
        quiet_trainer,
        JanusLoRA(**FAST),
        ContinualDataModule(**dm_kw),
        tmp_path / "cut",
        ckpt_path=str(tmp_path / "cut" / "ckpt" / "last.ckpt"),
    )
    assert len(resumed.R) == 2
    assert torch.allclose(torch.tensor(resumed.R), torch.tensor(full.R), atol=1e-6)


def test_max_epochs_must_match_the_task_sequence(quiet_trainer):
    dm = ContinualDataModule(num_tasks=5, epochs_per_task=2)
    trainer = quiet_trainer(max_epochs=3, reload_dataloaders_every_n_epochs=1)
    with pytest.raises(ValueError, match="num_tasks × epochs_per_task"):
        trainer.fit(SequentialLoRA(**FAST), dm)


# ---- baselines --------------------------------------------------------------------------------------
def _standalone(module, dm):
    torch.manual_seed(0)
    module.build(dm)
    module._standalone_opt = module.configure_optimizers()
    return module._standalone_opt


def _task(module, dm, t, opt):
    module.on_task_start(t, dm)
    for batch in dm.task_train_loader(t, batch_size=32):
        module.cl_step(batch, opt, lambda loss: loss.backward())
    return module.on_task_end(t, dm)


def test_inflora_down_projection_is_fixed_orthonormal_and_outside_the_old_basis():
    dm = ContinualDataModule()
    dm.setup()
    module = InfLoRA(**FAST)
    opt = _standalone(module, dm)
    _task(module, dm, 0, opt)
    V = {n: m.V.clone() for n, m in module.memories.items()}
    module.on_task_start(1, dm)
    A = {n: layer.branches["default"].A.detach().clone() for n, layer in module.adapted.items()}
    for batch in dm.task_train_loader(1, batch_size=32):
        module.cl_step(batch, opt, lambda loss: loss.backward())
    for n, layer in module.adapted.items():
        assert torch.equal(layer.branches["default"].A, A[n])
        assert torch.allclose(A[n] @ A[n].T, torch.eye(4), atol=1e-5)
        assert torch.linalg.matrix_norm(A[n].double() @ V[n]) < 1e-5
        assert torch.count_nonzero(layer.branches["default"].B) > 0


def test_olora_penalises_overlap_with_old_down_projections():
    dm = ContinualDataModule()
    dm.setup()
    module = OLoRA(**FAST)
    opt = _standalone(module, dm)
    _task(module, dm, 0, opt)
    assert all(A.shape == (4, 64) for A in module.past_A.values())
    module.on_task_start(1, dm)
    logs = module.cl_step(
        next(iter(dm.task_train_loader(1, batch_size=32))), opt, lambda loss: loss.backward()
    )
    assert logs["loss_orth"] > 0


def test_time_training_steps_reports_every_module():
    dm = ContinualDataModule()
    secs = time_training_steps(
        {"lora": SequentialLoRA(**FAST), "janus": JanusLoRA(**FAST)}, dm, steps=3, warmup_steps=2
    )
    assert set(secs) == {"lora", "janus"} and all(s > 0 for s in secs.values())


def test_text_task_sequence_is_class_incremental_over_modules():
    dm = ContinualDataModule(benchmark="text")
    dm.setup()
    assert dm.input_kind == "text" and dm.input_shape == (64,) and dm.scenario_kind == "class"
    assert dm.train_sets[0][0].dtype == torch.long and len(dm.train_sets[0][1]) == 2 * 196
    with pytest.raises(ValueError, match="class-incremental"):
        ContinualDataModule(benchmark="text", scenario="permuted")


@pytest.mark.slow
def test_text_config_runs_janus_on_a_pretrained_tiny_gpt(tmp_path):
    from litlab.cli import LitlabCLI

    cli = LitlabCLI(
        args=[
            "fit",
            f"--config={ROOT / 'configs/janus_lora/text.yaml'}",
            f"--runs_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
            "--trainer.max_epochs=5",
            "--data.init_args.epochs_per_task=1",
        ]
    )
    metrics = json.loads((cli.run_dir / "summary.json").read_text())["metrics"]
    assert metrics["cl/violation_max"] < 1e-9 and metrics["cl/acc"] > 0.1
    assert (cli.run_dir / "accuracy_matrix.png").exists()


def test_backbone_pretraining_runs_on_one_thread_and_restores_the_count(tmp_path, monkeypatch):
    """The recorded cards' TinyViT was pre-trained on one thread; more threads round differently and 30 epochs
    make that another backbone, so pre-training pins one thread whatever the process uses."""
    from litlab.lit_modules.continual import backbones

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))
    seen = []
    real_step = torch.optim.AdamW.step
    monkeypatch.setattr(
        torch.optim.AdamW,
        "step",
        lambda self, *a, **k: (seen.append(torch.get_num_threads()), real_step(self))[1],
    )
    before = torch.get_num_threads()
    torch.set_num_threads(
        2
    )  # the test session runs on one thread: show that pre-training does not inherit two
    try:
        backbones.pretrained_backbone(torch.rand(64, 1, 8, 8), "image", epochs=1)
        assert seen and set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ---- one run seed reaches everything random -----------------------------------------------------------
def _setup(monkeypatch, run_seed, **kw):
    monkeypatch.setenv("PL_GLOBAL_SEED", str(run_seed))
    dm = ContinualDataModule(**kw)
    dm.setup()
    return dm


def test_the_run_seed_draws_another_split_and_class_order_of_the_same_data(monkeypatch):
    a, b = _setup(monkeypatch, 0), _setup(monkeypatch, 1)
    assert sum(len(s[1]) for s in b.train_sets) == 1257 and sum(len(s[1]) for s in b.test_sets) == 540
    assert not torch.equal(a.train_sets[0][0], b.train_sets[0][0])  # another train-test split
    assert torch.equal(_setup(monkeypatch, 1).train_sets[0][0], b.train_sets[0][0])  # the same seed, the same
    orders = {s: _setup(monkeypatch, s, class_order="shuffled").task_classes for s in (0, 1)}
    assert orders[0] != orders[1] and orders[1] == _setup(monkeypatch, 1, class_order="shuffled").task_classes


def test_every_stream_the_data_draws_is_in_the_seed_ledger(monkeypatch):
    from litlab.lit_modules.core.seeding import reset_ledger, seed_ledger

    reset_ledger(3)
    dm = _setup(monkeypatch, 3, class_order="shuffled")
    dm.train_dataloader()
    assert {"data.split", "data.class_order", "data.order"} <= set(seed_ledger()["components"])


def test_backbone_seed_picks_another_member_of_the_pretrained_family(tmp_path, monkeypatch):
    from litlab.lit_modules.continual import backbones

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))
    x = torch.rand(64, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    w = {s: backbones.pretrained_backbone(x, "image", epochs=1, seed=s).state_dict() for s in (0, 1)}
    again = backbones.pretrained_backbone(x, "image", epochs=1, seed=1).state_dict()  # from the cache
    assert any(not torch.equal(w[0][k], w[1][k]) for k in w[0])
    assert all(torch.equal(w[1][k], again[k]) for k in again)
    assert len(list(tmp_path.glob("cl_backbone-*.safetensors"))) == 2


def test_the_harness_draws_its_backbone_from_the_run_seed(monkeypatch):
    from litlab.lit_modules.core.seeding import derive_seed, reset_ledger, seed_ledger

    dm = _setup(monkeypatch, 5)
    reset_ledger(5)
    module = SequentialLoRA(**FAST)
    module.build(dm)
    ledger = seed_ledger()
    assert (
        ledger["components"]["backbone"] == derive_seed("backbone") and "cl_backbone" in ledger["artefacts"]
    )
