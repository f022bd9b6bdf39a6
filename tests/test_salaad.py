"""SALAAD (arXiv 2602.00942): the acceptance checks of the platform spec (§7.1–7.6 on hand-made tensors, §7.7 as a
slow effect test trained in tmp_path), the callback on a plain LightningModule, checkpoint/resume of the ADMM
state, and ``litlab export`` into a Hugging Face-loadable model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from litlab.callbacks.exact_resume import ExactResume
from litlab.datamodules.text import LocalTextDataModule
from litlab.lit_modules.structured.capacity import CapacitySweep, deploy, eval_loss, swapped
from litlab.lit_modules.structured.footprint import FactoredLinear, load_factored
from litlab.lit_modules.structured.lm import BLOCKS, AdamWSchedule, DecoderLM, DecoderShape, find_blocks
from litlab.lit_modules.structured.salaad import SALAAD, SALAADLM, SALAADSchedule
from litlab.lit_modules.structured.sparse_lowrank import (
    ADMMConfig,
    BlockADMM,
    controller_update,
    effective_rank,
    factorize,
    hard_cut_threshold,
    hpa_shrink,
    hpa_surrogates,
    penalty,
    penalty_grad,
    posthoc_surrogates,
    project_rank,
    soft_threshold,
    svt,
)

ROOT = Path(__file__).resolve().parent.parent


# ---- 7.1 prox operators ------------------------------------------------------------------------------------------
def test_svt_is_the_closed_form_and_the_nuclear_prox_minimiser():
    g = torch.Generator().manual_seed(0)
    Z = torch.randn(12, 9, generator=g, dtype=torch.float64)
    tau = 0.8
    L_, q, s_shr = svt(Z, tau)
    U, s, Vh = torch.linalg.svd(Z, full_matrices=False)
    assert torch.allclose(L_, U @ torch.diag(torch.clamp(s - tau, min=0)) @ Vh, atol=1e-12)
    assert q == effective_rank(s_shr)

    def objective(X):
        return tau * torch.linalg.svdvals(X).sum() + 0.5 * (X - Z).square().sum()

    best = objective(L_)
    for _ in range(50):
        D = torch.randn(12, 9, generator=g, dtype=torch.float64)
        assert objective(L_ + 1e-3 * D / D.norm()) >= best - 1e-12


def test_soft_threshold_matches_the_formula():
    z = torch.randn(200)
    expected = torch.sign(z) * torch.clamp(z.abs() - 0.3, min=0)
    assert (soft_threshold(z, 0.3) - expected).abs().max() < 1e-7
    assert torch.equal(soft_threshold(z, -1.0), z)  # a negative threshold is clamped to 0 (spec §8)


# ---- 7.2 effective rank, hard cut --------------------------------------------------------------------------------
def test_effective_rank_and_hard_cut_density():
    sigma = torch.tensor([4.0, 3.0, 0.0, 0.0])
    assert effective_rank(sigma, 0.999) == 2  # energies 16, 9
    assert effective_rank(sigma, 0.6) == 1
    assert effective_rank(torch.zeros(5), 0.999) == 0
    Z = torch.randn(64, 48, generator=torch.Generator().manual_seed(1))
    for d in (0.05, 0.2, 0.0):
        S = soft_threshold(Z, hard_cut_threshold(Z, d))
        assert abs(int((S != 0).sum()) - d * Z.numel()) <= 1


def test_rank_projection_is_the_unshrunk_truncated_svd():
    Z = torch.randn(64, 128, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    s = torch.linalg.svdvals(Z)
    for k in (0, 4, 11):
        L_ = project_rank(Z, k)
        assert torch.linalg.matrix_rank(L_) == k
        assert torch.allclose(torch.linalg.svdvals(L_)[:k], s[:k])  # not shrunk, unlike SVT
        assert torch.allclose(
            (Z - L_).norm().square(), s[k:].square().sum()
        )  # Eckart-Young: the best rank-k fit
    with pytest.raises(ValueError, match="alpha_mode='hardcut'"):
        ADMMConfig(alpha_mode="hardcut")  # type: ignore[arg-type]


# ---- 7.3 ADMM on robust PCA ----------------------------------------------------------------------------------------
def _rpca(flip_dual: bool) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    m = n = 64
    L_star = torch.randn(m, 3, generator=g) @ torch.randn(3, n, generator=g)
    mask = torch.rand(m, n, generator=g) < 0.02
    S_star = torch.where(mask, torch.rand(m, n, generator=g) * 20 - 10, torch.zeros(m, n))
    X = L_star + S_star
    rho = m * n / (4 * float(X.abs().sum()))
    cfg = ADMMConfig(rho=rho, alpha_mode="fixed", beta_mode="fixed", alpha0=1.0, beta0=1 / math.sqrt(64))
    block = BlockADMM((m, n), cfg)
    for _ in range(100):
        Y_before = block.Y.clone()
        block.update(X)
        if flip_dual:
            block.Y = Y_before - rho * (X - block.L - block.S)
    return float((block.L - L_star).norm() / L_star.norm()), float((block.S - S_star).norm() / S_star.norm())


def test_admm_recovers_rpca_and_a_flipped_dual_sign_does_not():
    err_l, err_s = _rpca(flip_dual=False)
    assert err_l < 1e-4 and err_s < 1e-4, (err_l, err_s)
    err_l, err_s = _rpca(flip_dual=True)
    assert not (err_l < 1e-4 and err_s < 1e-4)  # nan/inf or large: the test would fail


# ---- 7.4 penalty gradient, coupled = decoupled ---------------------------------------------------------------------
def test_penalty_gradient_is_the_formula():
    g = torch.Generator().manual_seed(2)
    X, L_, S, Y = (torch.randn(7, 5, generator=g, dtype=torch.float64) for _ in range(4))
    X.requires_grad_(True)
    penalty(X, L_, S, Y, 0.3).backward()
    assert (X.grad - penalty_grad(X.detach(), L_, S, Y, 0.3)).abs().max() < 1e-6
    assert torch.allclose(penalty_grad(X.detach(), L_, S, Y, 0.3), 0.3 * (X.detach() - L_ - S + Y / 0.3))


class _Tiny(L.LightningModule):
    """A plain LightningModule: two linear layers, plain SGD, no clipping (also test_salaad_schedule's)."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        torch.manual_seed(0)
        self.up_proj, self.down_proj = nn.Linear(6, 8, bias=False), nn.Linear(8, 6, bias=False)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.down_proj(torch.tanh(self.up_proj(x))).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def _one_sgd_step(quiet_trainer, mode: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 6)), batch_size=4)
    module = _Tiny()
    schedule = SALAADSchedule(blocks=r"_proj$", num_freq=100, gradient_mode=mode, log_blocks=False)
    cb = SALAAD(ADMMConfig(rate_rank=0.5, rho=0.7), schedule)
    g = torch.Generator().manual_seed(3)
    trainer = quiet_trainer(max_steps=1, callbacks=[cb])
    cb.attach(module)
    for b in cb.state.values():  # a nonzero surrogate and dual, so both terms of the correction matter
        b.L, b.S, b.Y = (torch.randn(b.m, b.n, generator=g) for _ in range(3))
    trainer.fit(module, data)
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def test_coupled_and_decoupled_give_the_same_sgd_step(quiet_trainer):
    coupled, decoupled = _one_sgd_step(quiet_trainer, "coupled"), _one_sgd_step(quiet_trainer, "decoupled")
    for name in coupled:
        assert (coupled[name] - decoupled[name]).abs().max() < 1e-6, name
    torch.manual_seed(0)
    plain = _Tiny()
    assert (plain.up_proj.weight - coupled["up_proj.weight"]).abs().max() > 1e-3  # the step did move X


# ---- 7.5 controller direction ---------------------------------------------------------------------------------------
def test_controller_direction():
    assert controller_update(1.0, rate=0.5, prev_rate=0.5, target=0.15, rho=0.02, gain=0.005) > 1.0
    assert controller_update(1.0, rate=0.05, prev_rate=0.05, target=0.15, rho=0.02, gain=0.005) < 1.0
    assert controller_update(1.0, rate=0.9, prev_rate=0.1, target=0.15, rho=0.02, gain=0.0) == 1.0
    # the damping term only after pd_after updates, and only on a rate increase
    base = controller_update(1.0, 0.5, 0.1, 0.15, 0.02, 0.005, gain_d=0.01, count=0, pd_after=10)
    damped = controller_update(1.0, 0.5, 0.1, 0.15, 0.02, 0.005, gain_d=0.01, count=10, pd_after=10)
    assert damped > base
    # in a block: rank ratio above target -> tau_L grows
    X = torch.randn(32, 32, generator=torch.Generator().manual_seed(4))
    block = BlockADMM((32, 32), ADMMConfig(rate_rank=0.15, rho=0.02, k_alpha=0.005, alpha0=1e-4))
    tau_before = block.tau_L
    block.update(X)
    assert block.rate > 0.15 and block.tau_L > tau_before


# ---- 7.6 HPA budget -------------------------------------------------------------------------------------------------
def test_hpa_budget_bounds_and_one_shrink_factor():
    g = torch.Generator().manual_seed(5)
    dims = [(64, 64), (128, 64), (64, 128), (32, 96)]
    ks, nnzs = [12, 30, 25, 9], [200, 410, 390, 150]
    n_rest = 1000
    full = n_rest + sum(k * (m + n) for k, (m, n) in zip(ks, dims)) + sum(nnzs)
    assert hpa_shrink(ks, dims, nnzs, full + 5, n_rest) == (ks, 1.0)
    low = n_rest + sum(nnzs)
    for budget in torch.linspace(low, full, 23).tolist():
        new, c = hpa_shrink(ks, dims, nnzs, budget, n_rest)
        count = n_rest + sum(k * (m + n) for k, (m, n) in zip(new, dims)) + sum(nnzs)
        assert budget - sum(m + n for m, n in dims) <= count <= budget + 1e-9
        assert new == [math.floor(c * k) for k in ks]  # the same c for every block
    # through the surrogates: counted parameters within the same bounds, energy ranks unchanged at B >= N_full
    factors = {}
    for i, (m, n) in enumerate(dims):
        L_ = torch.randn(m, 6, generator=g) @ torch.randn(6, n, generator=g)
        S = soft_threshold(torch.randn(m, n, generator=g), 2.5)
        factors[f"b{i}"] = factorize(L_, S)
    f_full = sum(f.k * sum(f.shape) + f.nnz for f in factors.values())
    _, ranks, count, _ = hpa_surrogates(factors, f_full)
    assert ranks == {n: f.k for n, f in factors.items()} and count == f_full
    _, ranks, count, _ = hpa_surrogates(factors, 0.6 * f_full)
    assert 0.6 * f_full - sum(sum(f.shape) for f in factors.values()) <= count <= 0.6 * f_full
    # below Σ nnz: S re-sparsified to meet the budget
    _, _, count, _ = hpa_surrogates(factors, 0.5 * sum(f.nnz for f in factors.values()))
    assert count <= 0.5 * sum(f.nnz for f in factors.values())


def test_posthoc_compression_meets_the_budget_and_is_exact_at_full_rank():
    g = torch.Generator().manual_seed(6)
    weights = {"a": torch.randn(16, 16, generator=g), "b": torch.randn(24, 16, generator=g)}
    dense = sum(w.numel() for w in weights.values())
    for f in (0.6, 0.25, 0.15):
        _, _, count, _ = posthoc_surrogates(weights, f * dense)
        assert count <= f * dense
    out, _, _, _ = posthoc_surrogates(weights, 10 * dense, energy=1.0 + 1e-9)
    for n, w in weights.items():
        assert torch.allclose(out[n], w, atol=1e-5)


# ---- the callback on a Llama; checkpoint and resume; export ---------------------------------------------------------
TINY = dict(
    net=DecoderShape(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, max_positions=32),
    optim=AdamWSchedule(warmup_steps=2),
)


def _dm(windows: int = 48) -> LocalTextDataModule:
    return LocalTextDataModule(block_size=32, batch_size=4, train_windows_per_epoch=windows, val_windows=8)


def _trainer(quiet_trainer, tmp: Path, max_steps: int, extra=()) -> L.Trainer:
    return quiet_trainer(
        max_steps=max_steps, default_root_dir=tmp, num_sanity_val_steps=0, gradient_clip_val=1.0,
        deterministic=True, limit_val_batches=2, enable_checkpointing=True,
        callbacks=[ExactResume(), ModelCheckpoint(dirpath=tmp, every_n_train_steps=5, save_last=True), *extra],
    )  # fmt: skip


class _StopAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def _salaad_lm() -> SALAADLM:
    L.seed_everything(0)  # the run seed: the model's init and the data module's "data" stream
    return SALAADLM(**TINY, schedule=SALAADSchedule(num_freq=2, log_blocks=False))


def _state(trainer: L.Trainer, module) -> dict[str, torch.Tensor]:
    cb = next(c for c in trainer.callbacks if isinstance(c, SALAAD))
    out = {f"w.{k}": v.detach().clone() for k, v in module.state_dict().items()}
    for name, b in cb.state.items():
        out.update({f"{name}.{k}": getattr(b, k).clone() for k in ("L", "S", "Y")})
        out.update({f"{name}.{k}": torch.tensor(float(getattr(b, k))) for k in ("alpha", "beta", "count")})
    return out


def test_salaad_state_is_checkpointed_and_a_resumed_run_matches(tmp_path, quiet_trainer):
    torch.set_num_threads(1)
    module = _salaad_lm()
    full = _trainer(quiet_trainer, tmp_path / "full", 12)
    full.fit(module, _dm())
    expected = _state(full, module)
    assert (
        expected[next(k for k in expected if k.endswith(".count"))] == 6
    )  # refreshes at steps 2, 4, ..., 12

    first = _trainer(quiet_trainer, tmp_path / "cut", 12, [_StopAt(5)])
    first.fit(_salaad_lm(), _dm())
    ckpt = torch.load(tmp_path / "cut" / "last.ckpt", weights_only=True)
    saved = ckpt["callbacks"]["SALAAD"]["blocks"]
    assert len(saved) == 7 and all(b["count"] == 2 for b in saved.values())  # refreshes at 2 and 4
    resumed_module = _salaad_lm()
    resumed = _trainer(quiet_trainer, tmp_path / "cut", 12)
    resumed.fit(resumed_module, _dm(), ckpt_path=str(tmp_path / "cut" / "last.ckpt"))
    got = _state(resumed, resumed_module)
    for k, v in expected.items():
        assert torch.equal(v, got[k]), k


def test_dense_setup_has_no_admm_and_bad_settings_fail():
    assert SALAADLM(**TINY, admm=None).configure_callbacks() == []
    (callback,) = SALAADLM(
        **TINY, admm={"rho": 0.05}
    ).configure_callbacks()  # a CLI mapping becomes the dataclass
    assert callback.admm == ADMMConfig(rho=0.05) and callback.schedule == SALAADSchedule()
    with pytest.raises(ValueError, match="num_freq"):
        SALAADSchedule(num_freq=0)
    with pytest.raises(ValueError, match="rho"):
        ADMMConfig(rho=0.0)
    with pytest.raises(ValueError, match=r"unknown keys \['num_frq'\]"):
        SALAADLM(**TINY, schedule={"num_frq": 2})
    with pytest.raises(ValueError, match="matches no nn.Linear"):
        find_blocks(DecoderLM(**TINY), r"nothing_here$")


def test_export_loads_in_transformers_with_the_in_memory_loss(tmp_path, capsys, quiet_trainer):
    import transformers

    from litlab.__main__ import main

    torch.set_num_threads(1)
    module = _salaad_lm()
    dm = _dm(40)  # one epoch = 10 steps: checkpoint (step 10), then validation with the sweep
    trainer = _trainer(quiet_trainer, tmp_path / "run", 10, [CapacitySweep(fractions=[0.25])])
    trainer.fit(module, dm)
    ckpt = tmp_path / "run" / "last.ckpt"
    out = tmp_path / "model"
    assert main(["export", "--ckpt", str(ckpt), "--budget", "0.25,0.15", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    cb = next(c for c in trainer.callbacks if isinstance(c, SALAAD))
    loader = dm.val_dataloader()
    for f in (0.25, 0.15):
        record = json.loads((out / f"budget_{f:g}" / "deploy.json").read_text())
        dep = deploy(cb.structured_blocks(), f)
        assert record["block_params"] == dep.block_params <= f * dep.dense_block_params
        assert f"| {f:g} | hpa | {record['block_params']} " in printed
        with swapped({n: v[0] for n, v in cb.structured_blocks().items()}, dep.weights):
            in_memory = eval_loss(module, loader)
        hf = transformers.AutoModelForCausalLM.from_pretrained(out / f"budget_{f:g}")
        exported = DecoderLM(**TINY)
        exported.model = hf
        assert abs(eval_loss(exported, loader) - in_memory) < 1e-5
        assert sum(p.numel() for p in hf.parameters()) == record["dense_total_params"]  # stored dense (X̂)
        assert record["factored_bytes"] < record["dense_bytes"]
        # the factored model, run as factors (never densified), gives the same loss; its memory is measured
        exported.model = load_factored(out / f"budget_{f:g}")
        assert not any(
            isinstance(m, torch.nn.Linear) and re.search(BLOCKS, n) for n, m in exported.named_modules()
        )
        assert abs(eval_loss(exported, loader) - in_memory) < 1e-5
        held = sum(t.untyped_storage().nbytes() for t in exported.model.state_dict().values())
        assert record["factored_resident_bytes"] >= held  # every tensor it holds went through the allocator
        assert (
            record["factored_resident_bytes"] < record["dense_resident_bytes"] <= record["dense_peak_bytes"]
        )
        assert record["factored_resident_bytes"] <= record["factored_peak_bytes"]
        assert record["peak_ratio"] == record["factored_peak_bytes"] / record["dense_peak_bytes"]
    # CapacitySweep logged the same deployment's loss during the fit
    assert (
        abs(float(trainer.callback_metrics["val/loss@0.25"]) - _deployed_loss(module, cb, loader, 0.25))
        < 1e-6
    )


def test_factored_linear_equals_its_dense_weight():
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(6, 2, generator=g), torch.randn(2, 5, generator=g)
    S = torch.zeros(6, 5)
    S[1, 3], S[4, 0] = 0.7, -1.2
    csr = S.to_sparse_csr()
    lin = FactoredLinear(A, B, csr.crow_indices().int(), csr.col_indices().int(), csr.values(), torch.ones(6))
    x = torch.randn(3, 4, 5, generator=g)
    assert torch.allclose(lin(x), x @ (A @ B + S).T + 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="disagree on the rank"):
        FactoredLinear(A, B.T, csr.crow_indices(), csr.col_indices(), csr.values())


def _deployed_loss(module, cb, loader, f):
    dep = deploy(cb.structured_blocks(), f)
    with swapped({n: v[0] for n, v in cb.structured_blocks().items()}, dep.weights):
        return eval_loss(module, loader)


def test_salaad_card_and_configs_parse():
    from litlab.cards import load_card
    from litlab.cli import check_fit_args

    card = load_card(ROOT / "seeds" / "salaad.yaml")
    assert len(card.seeds["quick"]) >= 3
    check_fit_args(["fit", "--config", str(ROOT / "configs" / "salaad" / "quick.yaml")])


def test_full_config_fails_at_once_offline(monkeypatch, tmp_path, capsys):
    from litlab.__main__ import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = str(ROOT / "configs" / "salaad" / "full.yaml")
    assert main(["fit", "--config", config, "--runs_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "allenai/c4" in err or "t5-base" in err


# ---- 7.7 effect (CPU experiment of spec §6, seed 0) ----------------------------------------------------------------
@pytest.fixture(scope="module")
def effect_runs(tmp_path_factory) -> tuple[dict, dict]:
    """The quick config's SALAAD run and its dense baseline, seed 0 (the card's seed-0 fits), trained here."""
    from litlab.__main__ import main

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("salaad_effect")
    config = str(ROOT / "configs" / "salaad" / "quick.yaml")
    common = ["--runs_dir", str(out), "--trainer.enable_progress_bar=false"]
    assert main(["fit", "--config", config, "--run_id", "salaad", *common]) == 0
    assert (
        main(
            [
                "fit",
                "--config",
                config,
                "--run_id",
                "dense",
                "--model.init_args.admm=null",
                *common,
            ]
        )
        == 0
    )
    s = json.loads(next(out.glob("*/salaad/summary.json")).read_text())["metrics"]
    d = json.loads(next(out.glob("*/dense/summary.json")).read_text())["metrics"]
    return s, d


@pytest.mark.slow
def test_effect_surrogate_tracks_x_and_beats_posthoc_at_25_and_35(effect_runs):
    s, d = effect_runs
    assert s["salaad/residual_median"] < 0.1
    assert s["val/loss@0.25"] <= d["val/loss@0.25"] - 0.10
    assert s["val/loss@0.35"] <= d["val/loss@0.35"] - 0.03


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="not reproduced at our scale (card seeds/salaad.yaml, seed 0: SALAAD 2.784 at 25 % vs 2.123 full; "
    "dense X 2.124 vs dense baseline 1.904 = 1.12x)",
)
def test_effect_flat_continuum_and_dense_x_cost(effect_runs):
    s, d = effect_runs
    assert s["val/loss@0.25"] <= s["val/loss@1"] + 0.03
    assert s["val/loss"] <= 1.06 * d["val/loss"]


def test_report_tells_runs_apart_by_their_saved_structure(tmp_path):
    """The report hook reads what each run trained from its run folder's config.yaml (admm null: dense), never the
    card's run names: derived numbers for the SALAAD run, one loss-vs-budget curve per run."""
    from litlab.lit_modules.core.results import CardResult, RunResult, SeedRun
    from litlab.lit_modules.structured.report import report

    def entry(
        name: str, admm: dict | None, losses: list[tuple[float, float, float]], adhoc: dict | None = None
    ) -> RunResult:
        runs = []
        for seed, (full, at25, at1) in enumerate(losses):
            run_dir = tmp_path / f"{name}-s{seed}"
            run_dir.mkdir()
            metrics = {
                "val/loss": full,
                "val/loss@0.25": at25,
                "val/loss@1": at1,
                "capacity/full_fraction": 0.9,
            }
            (run_dir / "summary.json").write_text(json.dumps({"metrics": metrics}))
            init_args = {"admm": admm, "adhoc": adhoc}
            (run_dir / "config.yaml").write_text(json.dumps({"model": {"init_args": init_args}}))
            runs.append(SeedRun(seed=seed, value=full, run_dir=run_dir))
        return RunResult(name, "val/loss", [0, 1], [x[0] for x in losses], 0.0, 0.0, runs)

    result = CardResult(
        "salaad", "t", "c", "quick", [0, 1], "val/loss", "min",
        runs={"plain": entry("plain", None, [(2.0, 3.0, 2.1), (2.0, 3.2, 2.1)]),
              "ours": entry("ours", {"components": "both"}, [(2.2, 2.5, 2.2), (2.1, 2.8, 2.2)]),
              "lr_only": entry("lr_only", {"components": "low_rank"}, [(2.2, 2.4, 2.2), (2.2, 2.6, 2.2)]),
              "adhoc_25": entry("adhoc_25", None, [(2.3, 2.3, 2.3), (2.4, 2.4, 2.4)], {"components": "sparse"})},
        date="d", wall_time_s=0.0,
    )  # fmt: skip
    extras = report(result, tmp_path / "out")
    assert extras.numbers["ours_drop_25"] == pytest.approx(0.6)
    assert extras.numbers["val_ratio_ours_plain"] == pytest.approx(1.1)
    assert not any(k.startswith(("plain_", "lr_only_", "adhoc_25")) for k in extras.numbers)
    assert (
        "val_ratio_ours_adhoc_25" not in extras.numbers
    )  # an ad-hoc model (admm null) is not the dense baseline
    assert "| adhoc_25 (ad-hoc sparse, trained for one budget) |" in extras.markdown
    assert (
        "| plain (post-hoc compression) |" in extras.markdown and "| ours (SALAAD, HPA) |" in extras.markdown
    )
