"""The domain family's report pieces: the PCA feature figure on fake features, the hook's bookkeeping (runs
chosen by role and claim), and a U³CF / SFDA run's features read back from its checkpoint (a tiny run)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from litlab.cards import load_card
from litlab.lit_modules.core.results import CardResult, ReportExtras, RunResult, SeedRun
from litlab.lit_modules.domain.report import (
    card_design,
    feature_panels,
    feature_pca_figure,
    feature_report,
    merge_extras,
    pca_2d,
    per_target_keys,
    run_checkpoint,
)
from litlab.repro import card_design as design_of_card

ROOT = Path(__file__).resolve().parent.parent


def test_pca_2d_finds_the_long_axes():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5)) * np.array([10.0, 3.0, 0.1, 0.1, 0.1])
    xy, ratio = pca_2d(x)
    assert xy.shape == (200, 2)
    assert ratio[0] > 0.85 and ratio[1] > 0.05 and sum(ratio) <= 1.0 + 1e-12
    # the projection is the centred data on the first two axes (up to sign)
    assert np.allclose(np.abs(xy[:, 0]), np.abs(x[:, 0] - x[:, 0].mean()), atol=0.5)


def test_feature_pca_figure_writes_one_panel_per_model(tmp_path):
    rng = np.random.default_rng(1)
    panels = {
        "before": (rng.normal(size=(30, 8)), np.repeat([0, 1, 2], 10), rng.integers(0, 3, 30)),
        "after": (rng.normal(size=(30, 8)), np.repeat([0, 1, 2], 10), rng.integers(0, 3, 30)),
    }
    path = tmp_path / "f.png"
    ratios = feature_pca_figure(panels, ["source", "T1", "T2"], path, "fake", ["a", "b", "c"])
    assert path.stat().st_size > 1000 and set(ratios) == {"before", "after"}
    no_classes = {k: (f, d, None) for k, (f, d, _) in panels.items()}
    feature_pca_figure(no_classes, ["source", "T1", "T2"], tmp_path / "g.png")
    assert (tmp_path / "g.png").is_file()


def _result(tmp_path, runs, slug="toy"):
    """A CardResult as `litlab repro` hands it to a hook (for a shipped card: with its roles and claims)."""
    rr = {
        name: RunResult(
            name,
            "m",
            [0, 1],
            [0.0, 0.0],
            0.0,
            0.0,
            [SeedRun(s, 0.0, tmp_path / f"{name}{s}") for s in (0, 1)],
        )
        for name in runs
    }
    result = CardResult(slug, "t", "c", "quick", [0, 1], "m", "max", rr, "d", 1.0)
    if slug != "toy":
        result.roles, result.design_claims = design_of_card(load_card(ROOT / "seeds" / f"{slug}.yaml"))
    return result


def test_feature_report_reads_the_first_seed_and_names_what_is_missing(tmp_path):
    seen = []

    def features(run_dir):
        seen.append(Path(run_dir).name)
        if Path(run_dir).name.startswith("broken"):
            raise FileNotFoundError(f"{run_dir}/checkpoints/last.ckpt does not exist")
        dom = np.repeat([0, 1], 500)
        return np.random.default_rng(0).normal(size=(1000, 4)), dom, ["src", "tgt"], None, None

    result = _result(tmp_path, ["before", "after", "broken"])
    extras = feature_report(
        result, tmp_path, "toy", {"B": "before", "A": "after", "X": "broken", "Y": "absent"}, features, 300
    )
    assert seen == ["before0", "after0", "broken0"]  # the card's first seed only
    assert extras.figures == [tmp_path / "toy_features_pca.png"] and extras.figures[0].is_file()
    assert "broken (" in extras.markdown and "absent (not measured)" in extras.markdown
    assert "| B | before |" in extras.markdown and "at most 300 images per domain" in extras.markdown
    nothing = feature_report(_result(tmp_path, []), tmp_path, "toy", {"B": "before"}, features)
    assert nothing.figures == [] and "No checkpoint" in nothing.markdown
    both = merge_extras(ReportExtras(markdown="a", numbers={"x": 1.0}), extras)
    assert both.figures == extras.figures and both.numbers == {"x": 1.0} and both.markdown.startswith("a\n")


def test_the_hooks_pick_runs_by_role_and_claim(tmp_path):
    """Before: the floor the positive control reads; after: the runs the headline's method is compared with, the
    method, and the ablations no claim reads (both cards as written)."""
    roles, claims = card_design(_result(tmp_path, [], slug="u3cf"))
    assert feature_panels(roles, claims) == {
        "before: source_only (floor)": "source_only",
        "after: shot (baseline)": "shot",
        "after: prototype_only (ablation)": "prototype_only",
        "after: u3cf (method)": "u3cf",
        "after: u3cf_gnn (ablation)": "u3cf_gnn",
    }
    roles, claims = card_design(_result(tmp_path, [], slug="sfda_regression"))
    assert list(feature_panels(roles, claims).values()) == [
        "src_only_cn",
        "knn_cn",
        "adabn_cn",
        "mt_cn",
        "ddg_cn",
        "ddg_aux_cn",
    ]
    toy_claims = [
        {"id": "h", "method": "m:acc", "against": ["b"], "headline": True},
        {"id": "c", "method": "b", "against": ["f"], "control": True},
    ]
    toy_roles = {"m": "method", "b": "baseline", "f": "floor", "x": "ablation", "y": "ablation"}
    toy_claims.append({"id": "s", "method": "y", "against": ["b"]})  # y is claimed: not an unclaimed ablation
    assert list(feature_panels(toy_roles, toy_claims).values()) == ["f", "b", "m", "x"]


def test_per_target_keys_follow_what_the_runs_logged(tmp_path):
    result = _result(tmp_path, ["a"])
    for s in (0, 1):
        (tmp_path / f"a{s}").mkdir()
        metrics = {"val/acc_T2": 0.5, "val/acc_mean": 0.5, "val/acc_gnn_T2": 0.4, "val/acc_T9": 0.1, "x": 1}
        (tmp_path / f"a{s}" / "summary.json").write_text(json.dumps({"metrics": metrics}))
    assert per_target_keys(result, "val/acc_", ("val/acc_mean", "val/acc_gnn_")) == [
        "val/acc_T2",
        "val/acc_T9",
    ]
    assert per_target_keys(_result(tmp_path, []), "val/acc_") == []


def fitted_with_a_ledger(module, dm, quiet_trainer, run_dir, seed):
    """A fit under run seed ``seed`` keeping ``checkpoints/last.ckpt`` and a summary.json with the seed ledger,
    as a ``litlab fit`` run folder holds them."""
    L.seed_everything(seed)
    trainer = quiet_trainer(
        max_epochs=1,
        num_sanity_val_steps=0,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=run_dir / "checkpoints", save_last=True)],
    )
    trainer.fit(module, datamodule=dm)
    (run_dir / "summary.json").write_text(json.dumps({"metrics": {}, "seed_ledger": {"run_seed": seed}}))
    L.seed_everything(seed + 100)  # the report runs under another seed: the run's own must be read back
    return trainer


def test_u3cf_features_from_a_run_checkpoint(tmp_path, quiet_trainer):
    from litlab.datamodules.domain import MultiTargetDigitsDataModule
    from litlab.lit_modules.domain.u3cf import U3CF, run_features

    with pytest.raises(FileNotFoundError, match="last.ckpt"):
        run_checkpoint(tmp_path)
    module = U3CF(
        method="source_only", source_stage={"optimizer": "sgd", "lr": 0.01, "iters": 5, "batch_size": 32}
    )
    fitted_with_a_ledger(module, MultiTargetDigitsDataModule(), quiet_trainer, tmp_path, seed=3)
    feat, dom, names, labels, classes = run_features(tmp_path)
    assert names == ["source", "T1", "T2", "T3"] and len(classes) == 10
    assert feat.shape == (1797, 64) and torch.bincount(dom).tolist() == [800, 330, 330, 337]
    module.net.eval()
    with torch.no_grad():
        assert torch.allclose(feat[:800], module.net.features(module.source_x), atol=1e-6)
    L.seed_everything(3)
    dm = MultiTargetDigitsDataModule()
    dm.setup()
    assert torch.equal(labels[:800], dm.source_y)
    assert torch.equal(labels[800:], torch.cat([y for _, y, _ in dm.val_dataloader()]))


def test_sfda_features_from_a_run_checkpoint(tmp_path, quiet_trainer):
    from litlab.datamodules.domain import RegressionDomainsDataModule
    from litlab.lit_modules.domain.sfda_regression import SFDARegression, run_features

    module = SFDARegression(method="adabn", source_stage={"epochs": 1, "batch_size": 64}, density={"k": 5})
    dm = RegressionDomainsDataModule(n_per_domain=120, n_target_train=80, batch_size=40)
    fitted_with_a_ledger(module, dm, quiet_trainer, tmp_path, seed=2)
    feat, dom, names, labels, classes = run_features(tmp_path)
    assert names == ["source C", "target N"] and labels is None and classes is None
    assert feat.shape == (200, 128) and torch.bincount(dom).tolist() == [120, 80]
    module.net.eval()
    with torch.no_grad():  # AdaBN's target statistics came back with the checkpoint
        assert torch.allclose(feat[120:], module.net.g(dm.target_train_dataset.x), atol=1e-5)
