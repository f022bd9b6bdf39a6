"""SFDA regression (discretised-density-guided source-free adaptation): the spec's §7 checks.

1-5 are pure functions against hand computations and exhaustive random tests, 6-7 a tiny adaptation run
(200 renders per domain, one source epoch), 8 the effect on the toy (``slow``; fits in tmp_path).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from litlab.datamodules.domain import RegressionDomainsDataModule, render_dsprites_like
from litlab.lit_modules.core.errors import DatasetUnavailableError, ModelUnavailableError
from litlab.lit_modules.domain import binning
from litlab.lit_modules.domain.banks import IndexedBank
from litlab.lit_modules.domain.sfda_regression import (
    DensityTarget,
    SFDARegression,
    ddg_losses,
    density_targets,
)

ROOT = Path(__file__).resolve().parent.parent


# ---- 1. binning -------------------------------------------------------------------------------------------------
def test_soft_bin_rows_sum_to_one_and_hard_bin_is_floor():
    v = torch.rand(50, 3, dtype=torch.float64)
    assert torch.allclose(
        binning.soft_bin(v, 20, 0.05).sum(-1), torch.ones(50, 3, dtype=torch.float64), atol=1e-6
    )
    vals = torch.tensor([0.0, 0.049, 0.05, 0.51, 0.999, 1.0], dtype=torch.float64)
    hard = binning.hard_bin(vals, 20)
    assert hard.argmax(-1).tolist() == [0, 0, 1, 10, 19, 19]  # floor(v·B); v = 1 in the last bin
    assert torch.equal(hard.sum(-1), torch.ones(6, dtype=torch.float64))
    assert torch.equal(binning.soft_bin(vals, 20, 0.0), hard)  # σ = 0 is the hard histogram
    # σ → 0: the soft bin tends to the one-hot of the nearest centre (away from bin edges)
    away = torch.tensor([0.12, 0.47, 0.83], dtype=torch.float64)
    assert torch.allclose(binning.soft_bin(away, 20, 1e-3), binning.hard_bin(away, 20), atol=1e-6)
    h = binning.histogram(torch.rand(7, 12, dtype=torch.float64), 20, 0.05)  # 12 = K + 2 members
    assert h.shape == (7, 20) and torch.allclose(h.sum(-1), torch.ones(7, dtype=torch.float64), atol=1e-6)


def test_density_targets_by_hand():
    # B = 4 (centres 0.125, 0.375, 0.625, 0.875), hard bins, members 0.1, 0.15, 0.6, 0.9 -> bins 0, 0, 2, 3
    members = torch.tensor([[[0.1], [0.15], [0.6], [0.9]]], dtype=torch.float64)  # (b=1, n=4, T=1)
    h, u, y_ref, lo, hi = density_targets(members, num_bins=4, sigma=0.0, window=1)
    assert torch.allclose(h[0, 0], torch.tensor([0.5, 0.0, 0.25, 0.25], dtype=torch.float64))
    expected_u = (0.5 * math.log(2) + 2 * 0.25 * math.log(4)) / math.log(4)  # 0.75
    assert u.item() == pytest.approx(expected_u, abs=1e-12)
    assert y_ref.item() == pytest.approx(0.125, abs=1e-12)  # b* = 0, window {0, 1}: only bin 0 has mass
    # support at ε = 0.5/B = 0.125: bins 0, 2, 3 -> [0.125 − 0.125, 0.875 + 0.125]
    assert (lo.item(), hi.item()) == pytest.approx((0.0, 1.0), abs=1e-12)
    # kNN-mean would target the plain mean 0.4375: the windowed mode ignores the far members
    assert members.mean(1).item() == pytest.approx(0.4375)


# ---- 2. replacement bound --------------------------------------------------------------------------------------
def test_hard_histogram_replacement_bound_exhaustive():
    gen = torch.Generator().manual_seed(0)
    B, n = 10, 6
    for _ in range(200):
        P = torch.rand(n, generator=gen, dtype=torch.float64)
        h = binning.histogram(P, B, 0.0, dim=0)
        for m in range(n + 1):
            for which in itertools.combinations(range(n), m):
                Q = P.clone()
                Q[list(which)] = torch.rand(m, generator=gen, dtype=torch.float64)
                diff = (binning.histogram(Q, B, 0.0, dim=0) - h).abs().sum()
                assert diff <= 2 * m / n + 1e-6


# ---- 3. Lipschitz bound of the soft histogram -----------------------------------------------------------------
@pytest.mark.parametrize("B", [10, 20, 50])
def test_soft_histogram_lipschitz_bound(B):
    gen = torch.Generator().manual_seed(B)
    sigma = 1.0 / B
    c = binning.bin_centres(B)
    lip = (c.max() - c.min()) / sigma**2
    for eps in (1e-4, 1e-3, 1e-2):
        P = torch.rand(500, 12, generator=gen, dtype=torch.float64)
        delta = (torch.rand(500, 12, generator=gen, dtype=torch.float64) * 2 - 1) * eps
        diff = (binning.histogram(P + delta, B, sigma) - binning.histogram(P, B, sigma)).abs().sum(-1)
        assert float(diff.max()) <= eps * lip + 1e-6
        assert float(diff.max()) > 0  # the bound is not met trivially


def test_hard_histogram_unchanged_by_moves_inside_bins():
    """spec §3.6: members that stay inside their bins leave h, b*, the support and ỹ unchanged."""
    gen = torch.Generator().manual_seed(1)
    B = 20
    P = torch.rand(100, 12, 1, generator=gen, dtype=torch.float64)
    edge_dist = torch.minimum(P * B - (P * B).floor(), (P * B).floor() + 1 - P * B) / B
    Q = P + (torch.rand_like(P) * 2 - 1) * edge_dist * 0.99
    a, b = density_targets(P, B, 0.0, 1), density_targets(Q, B, 0.0, 1)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


# ---- 4. windowed mode and the interval loss --------------------------------------------------------------------
def test_windowed_mode_point_mass_and_window_bounds():
    B = 20
    c = binning.bin_centres(B)
    for b in range(B):
        h = torch.zeros(B, dtype=torch.float64)
        h[b] = 1.0
        assert binning.windowed_mode(h, 1).item() == c[b].item()
    gen = torch.Generator().manual_seed(2)
    h = torch.rand(300, B, generator=gen, dtype=torch.float64) ** 4
    h = h / h.sum(-1, keepdim=True)
    for w in (0, 1, 3):
        y = binning.windowed_mode(h, w)
        b_star = h.argmax(-1)
        lo = c[(b_star - w).clamp(0, B - 1)]
        hi = c[(b_star + w).clamp(0, B - 1)]
        assert bool(((y >= lo - 1e-12) & (y <= hi + 1e-12)).all())


def test_interval_loss_zero_inside_positive_outside():
    lo, hi = torch.tensor(0.3), torch.tensor(0.6)
    for y in (0.3, 0.45, 0.6):
        assert binning.interval_loss(torch.tensor(y), lo, hi).item() == 0.0
    assert binning.interval_loss(torch.tensor(0.2), lo, hi).item() == pytest.approx(0.01)
    assert binning.interval_loss(torch.tensor(0.8), lo, hi).item() == pytest.approx(0.04)


# ---- 5. uncertainty ----------------------------------------------------------------------------------------------
def test_normalised_entropy_extremes():
    B = 20
    assert binning.normalised_entropy(binning.hard_bin(torch.tensor([0.33]), B)).item() == 0.0
    assert binning.normalised_entropy(torch.full((B,), 1.0 / B)).item() == pytest.approx(1.0, abs=1e-6)


def test_ddg_losses_split_by_threshold_by_hand():
    pred = torch.tensor([[0.2], [0.9]])
    y_ref = torch.tensor([[0.25], [0.5]])
    u = torch.tensor([[0.1], [0.8]])
    lo, hi = torch.tensor([[0.1], [0.4]]), torch.tensor([[0.4], [0.7]])
    h = torch.full((2, 1, 4), 0.25)
    logits = torch.zeros(2, 1, 4)
    out = ddg_losses(pred, logits, h, u, y_ref, lo, hi, tau=torch.tensor([0.5]))
    assert out["reg"].item() == pytest.approx(0.05**2)  # only sample 0 is confident
    assert out["int"].item() == pytest.approx(0.2**2)  # sample 1: 0.2 above its interval
    assert out["aux"].item() == pytest.approx(math.log(4))  # CE of a uniform h against uniform logits
    assert out["confident"].item() == 0.5


# ---- data ---------------------------------------------------------------------------------------------------------
def test_renderer_is_seeded_and_styles_share_geometry():
    a = render_dsprites_like("C", 16, np.random.default_rng(3))
    b = render_dsprites_like("C", 16, np.random.default_rng(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    x, y = render_dsprites_like("N", 16, np.random.default_rng(3))
    assert torch.equal(y, a[1])  # the same factor draws under the same generator: labels agree
    assert x.shape == (16, 3, 32, 32) and float(x.min()) >= 0 and float(x.max()) <= 1
    assert float(y.min()) >= 0 and float(y.max()) <= 1
    # white shape on noise: exactly the shape's pixels are 1 in every channel (noise rarely is)
    assert float((x == 1).all(1).float().mean()) > 0.02


def test_full_scale_data_fails_at_once_naming_folder_and_layout(tmp_path):
    with pytest.raises(DatasetUnavailableError, match=r"image_list/<domain>\.txt"):
        RegressionDomainsDataModule(benchmark="dsprites", source="color", target="noisy")
    with pytest.raises(DatasetUnavailableError, match=str(tmp_path / "image_list" / "color.txt")):
        RegressionDomainsDataModule(
            benchmark="dsprites", source="color", target="noisy", data_root=str(tmp_path)
        )


def test_full_config_stops_at_once_offline(tmp_path, monkeypatch):
    """torchvision or the ResNet-18 weights file first (the model is built first), then, with the toy's
    backbone, the data folder."""
    from litlab.cli import LitlabCLI

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))  # an empty hub cache
    args = ["fit", f"--config={ROOT / 'configs/sfda_regression/full.yaml'}", f"--runs_dir={tmp_path}"]
    with pytest.raises(ModelUnavailableError, match=r"torchvision|resnet18-[0-9a-f]+\.pth"):
        LitlabCLI(args=args)
    with pytest.raises(DatasetUnavailableError, match="data_root"):
        LitlabCLI(args=[*args, "--model.init_args.net.backbone=small"])


def test_image_list_layout_loads(tmp_path):
    from PIL import Image

    (tmp_path / "image_list").mkdir()
    rng = np.random.default_rng(0)
    for dom in ("color", "noisy"):
        lines = []
        for i in range(12):
            Image.fromarray((rng.random((40, 40, 3)) * 255).astype(np.uint8)).save(tmp_path / f"{dom}{i}.png")
            lines.append(f"{dom}{i}.png {rng.random():.3f} {rng.random():.3f} {rng.random():.3f}")
        (tmp_path / "image_list" / f"{dom}.txt").write_text("\n".join(lines))
    dm = RegressionDomainsDataModule(
        benchmark="dsprites", source="color", target="noisy", data_root=str(tmp_path), size=32
    )
    dm.setup("fit")
    x, y = next(iter(dm.source_train_loader(4)))
    assert x.shape == (4, 3, 32, 32) and y.shape == (4, 3)
    assert (
        float(dm.source_dataset.tensors[1].min()) == 0.0 and float(dm.source_dataset.tensors[1].max()) == 1.0
    )


def test_renders_are_drawn_from_the_run_seed(monkeypatch):
    """No seed argument: the renders come from the run seed's "data" stream, and the source model's cache key
    (data_key) names it."""
    from litlab.lit_modules.core.seeding import reset_ledger, seed_ledger

    def renders(run_seed):
        monkeypatch.setenv("PL_GLOBAL_SEED", str(run_seed))
        reset_ledger(run_seed)
        dm = tiny_dm()
        dm.setup("fit")
        return dm, seed_ledger()

    a, ledger = renders(2)
    b, _ = renders(2)
    c, other = renders(3)
    assert torch.equal(a.source_dataset.tensors[0], b.source_dataset.tensors[0])
    assert not torch.equal(a.source_dataset.tensors[0], c.source_dataset.tensors[0])
    assert a.data_key()["data_seed"] == ledger["components"]["data"] != other["components"]["data"]


def test_config_groups_build_from_mappings_and_refuse_unknown_keys():
    module = SFDARegression(density={"num_bins": 10, "k": 3}, objective={"lambda_aux": 0.05})
    assert module.density == DensityTarget(num_bins=10, k=3) and module.sigma == 0.1
    assert module.objective.lambda_aux == 0.05 and module.baselines.teacher_eval == "student"
    with pytest.raises(ValueError, match="SFDARegression.density: unknown keys \\['bins'\\]"):
        SFDARegression(density={"bins": 10})
    with pytest.raises(ValueError, match="density.quantile must be in"):
        SFDARegression(density={"quantile": 0.0})


# ---- 6-7. a tiny adaptation run ----------------------------------------------------------------------------------
def tiny_dm(target="N"):
    return RegressionDomainsDataModule(
        source="C", target=target, n_per_domain=200, n_target_train=128, batch_size=32
    )


def tiny_module(method="ddg", **kw):
    return SFDARegression(
        method=method,
        source_stage={"epochs": 1, "batch_size": 64, "lr": 1e-3},
        density={"k": 5, **kw.pop("density", {})},
        lr=1e-3,
        **kw,
    )


def fit(module, dm, quiet_trainer, epochs=2):
    L.seed_everything(0)
    trainer = quiet_trainer(max_epochs=epochs, num_sanity_val_steps=0, reload_dataloaders_every_n_epochs=1)
    trainer.fit(module, datamodule=dm)
    return trainer


def test_adaptation_freezes_regressor_trains_g_and_a_and_never_sees_source(quiet_trainer):
    L.seed_everything(0)  # the run seed: renders and source model
    dm = tiny_dm()
    module = tiny_module("ddg", objective={"lambda_aux": 0.05})
    seen = []

    class Spy(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            seen.append(trainer.train_dataloader.dataset)

    fit_trainer = quiet_trainer(
        max_epochs=2, num_sanity_val_steps=0, reload_dataloaders_every_n_epochs=1, callbacks=[Spy()]
    )
    dm.setup("fit")
    # the source model exactly as the source stage left it (cached, reloaded by a fresh module)
    source = tiny_module("source_only")
    source.trainer = fit_trainer
    fit_trainer.datamodule = dm
    source.setup("fit")
    L.seed_everything(0)
    fit_trainer.fit(module, datamodule=dm)
    for name, p in source.net.r.state_dict().items():
        assert torch.equal(module.net.r.state_dict()[name], p), name  # bit-identical
    assert not torch.equal(module.net.g.convs[0].weight, source.net.g.convs[0].weight)
    assert not torch.equal(module.net.a.weight, source.net.a.weight)
    assert fit_trainer.callback_metrics["adapt/regressor_drift"].item() == 0.0
    assert seen and all(d is dm.target_train_dataset for d in seen)
    assert all(d is not dm.source_dataset for d in seen)
    src_ptr = dm.source_dataset.tensors[0].untyped_storage().data_ptr()
    assert dm.target_train_dataset.x.untyped_storage().data_ptr() != src_ptr


def test_bank_excludes_self_and_holds_batch_outputs():
    bank = IndexedBank(6, 3, 1)
    feats = torch.eye(3).repeat(2, 1)  # rows i and i + 3 identical
    bank.update(torch.arange(6), feats, torch.arange(6.0)[:, None])
    nb = bank.neighbours(feats[:3], k=1, self_idx=torch.arange(3))
    assert nb[:, 0].tolist() == [3, 4, 5]  # self (similarity 1) excluded, the twin found
    allnb = bank.all_neighbours(k=2)
    assert all(i not in row for i, row in enumerate(allnb.tolist()))
    # inside a training step: after the update the batch rows equal the batch outputs
    module = tiny_module("ddg", density={"k": 2})
    module.bank = IndexedBank(6, 3, 1)
    module.bank.update(torch.arange(6), torch.randn(6, 3), torch.rand(6, 1))
    z, pred, pred2 = torch.randn(2, 3), torch.rand(2, 1), torch.rand(2, 1)
    idx = torch.tensor([4, 1])
    members = module.members(z, pred, pred2, idx)
    assert torch.allclose(module.bank.feat[idx], torch.nn.functional.normalize(z, dim=1))
    assert torch.equal(module.bank.pred[idx], pred)
    assert (
        members.shape == (2, 4, 1) and torch.equal(members[:, 0], pred) and torch.equal(members[:, 1], pred2)
    )


def test_confident_fraction_of_the_bank_is_the_quantile(quiet_trainer):
    dm = tiny_dm()
    module = tiny_module("ddg", density={"quantile": 0.7})
    fit(module, dm, quiet_trainer, epochs=1)
    tau, u = module.bank_threshold()
    frac = (u <= tau).float().mean(0)  # per factor
    n = u.shape[0]
    ties = max(int((u[:, t] == tau[t]).sum()) for t in range(u.shape[1]))
    assert bool(((frac - 0.7).abs() <= (ties + 1) / n).all()), (frac, ties)


def test_source_stage_is_cached_and_shared_across_methods(tmp_path, monkeypatch):
    import litlab.lit_modules.domain.source as source_mod

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path / "cache"))
    calls = []
    real = source_mod.train_and_cache

    def spy(name, args, seed, build, train, threads, **kw):
        def counted(model):
            calls.append(name)
            train(model)

        return real(name, args, seed, build, counted, threads, **kw)

    monkeypatch.setattr(source_mod, "train_and_cache", spy)
    dm = tiny_dm()
    dm.setup("fit")
    nets = []
    for method in ("source_only", "knn_pl", "ddg"):
        m = tiny_module(method)

        class T:  # the module only reads trainer.datamodule in setup
            datamodule = dm

        m._trainer = T()  # noqa: SLF001
        m.setup("fit")
        nets.append(m.net.state_dict())
    assert calls == ["domain_source"]  # trained once, loaded twice
    assert all(torch.equal(nets[0][k], other[k]) for other in nets[1:] for k in nets[0])
    assert len(list((tmp_path / "cache").glob("domain_source-*.safetensors"))) == 1


# ---- 8. the effect (slow) -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_effect_on_the_toy(quiet_trainer):
    """spec §7.8 on seeds 0-2, trained in tmp_path with the quick config's sizes."""
    res: dict[tuple[str, str], list[float]] = {}
    for seed in (0, 1, 2):
        for target, methods in (("N", ("source_only", "knn_pl", "ddg")), ("S", ("source_only", "ddg"))):
            for method in methods:
                L.seed_everything(seed)  # the run seed: renders, source model, target order
                dm = RegressionDomainsDataModule(source="C", target=target)
                module = SFDARegression(method=method)
                trainer = quiet_trainer(
                    max_epochs=6,
                    num_sanity_val_steps=0,
                    reload_dataloaders_every_n_epochs=1,
                    deterministic=True,
                )
                trainer.fit(module, datamodule=dm)
                res.setdefault((target, method), []).append(float(trainer.callback_metrics["val/mae_sum"]))
    mean = {k: float(np.mean(v)) for k, v in res.items()}
    assert mean[("N", "ddg")] <= 0.7 * mean[("N", "source_only")], mean
    assert mean[("N", "ddg")] <= 0.97 * mean[("N", "knn_pl")], mean
    assert mean[("S", "ddg")] < mean[("S", "source_only")], mean
