"""LoKRA / LoKRA+ checks ("LoKRA / LoKRA+: Low Kruskal-Rank Adaptation", ICML 2026): identity at init, the
Khatri–Rao product and its Kruskal lemma, the (reconstructed) penalty's invariants, its effect against LoRA."""

import math

import lightning as L
import pytest
import torch

from litlab.datamodules.matrix_approx import MatrixApproxDataModule, make_target
from litlab.lit_modules.core.kruskal import (
    khatri_rao,
    kruskal_rank_exact,
    sampled_logvol,
    sampled_sigma_min,
)
from litlab.lit_modules.peft.lokra import (
    AdapterPlan,
    KruskalPenalty,
    LoKRALanguageModel,
    LoKRAMatrixApprox,
    blockwise_logdet_penalty,
    inject_lokra,
)


@pytest.fixture(autouse=True)
def run_seed_restored(monkeypatch):
    """Run seed 0 (what ``derive_seed`` reads) unless a test seeds another; restored after each test."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")


# ---- zero-init identity + freezing, for all three modes ---------------------------------------
@pytest.mark.parametrize("mode", ["lora", "lokra", "lokra_plus"])
def test_modes_start_as_identity_and_train_only_factors(mode):
    from litlab.lit_modules.core.models import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT(d_model=32, n_layers=1, n_heads=4, block_size=8).eval()
    x = torch.randint(0, 97, (2, 8))
    before = model(x)
    adapted = inject_lokra(
        model, mode, AdapterPlan(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "up_proj"))
    )
    assert torch.allclose(model(x), before, atol=1e-6, rtol=0)
    names = {n.rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad}
    assert names == ({"D", "C"} if mode == "lokra_plus" else {"A", "B"})
    assert len(adapted) == 3


# ---- Khatri–Rao correctness ------------------------------------------------------------------
def test_khatri_rao_matches_kron_columns_and_factored_forward():
    g = torch.Generator().manual_seed(0)
    D, C = torch.randn(3, 7, generator=g), torch.randn(4, 7, generator=g)
    KR = khatri_rao(D, C)
    for j in range(7):
        assert torch.allclose(KR[:, j], torch.kron(D[:, j], C[:, j]), atol=1e-6)
    from torch import nn

    from litlab.lit_modules.core.adapters import AdapterLinear

    layer = AdapterLinear(nn.Linear(7, 10))
    branch = layer.add_branch("default", kind="khatri_rao", rank=3, alpha=3.0)  # r2 = ceil(10/3) = 4
    with torch.no_grad():
        branch.C.normal_()
    x = torch.randn(5, 2, 7)
    materialised = layer(x)
    branch.factored = True
    assert torch.allclose(layer(x), materialised, atol=1e-5)
    layer.merge()
    assert torch.allclose(layer(x), materialised, atol=1e-5)


# ---- the Kruskal lemma -----------------------------------------------------------------------
def test_kruskal_lemma_for_khatri_rao_products():
    for seed in range(20):
        g = torch.Generator().manual_seed(seed)
        D, C = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
        kD, kC = kruskal_rank_exact(D), kruskal_rank_exact(C)
        assert kruskal_rank_exact(khatri_rao(D, C)) >= min(kD + kC - 1, 6)


def test_duplicated_column_collapses_kruskal_rank_not_rank():
    A = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    A[:, 5] = A[:, 2]
    assert kruskal_rank_exact(A) == 1 and torch.linalg.matrix_rank(A) == 4


# ---- penalty invariants ----------------------------------------------------------------------
def test_penalty_of_orthogonal_blocks_is_its_floor():
    eps = 1e-4
    blocks = [
        torch.linalg.qr(torch.randn(8, 8, generator=torch.Generator().manual_seed(i)))[0] for i in range(8)
    ]
    M = torch.cat(blocks, dim=1).double()
    P = blockwise_logdet_penalty(M, eps=eps, block_mode="fixed")
    assert abs(float(P) + 8 * math.log(1 + eps)) < 1e-5
    assert (
        float(
            blockwise_logdet_penalty(
                M, eps=eps, block_mode="random", generator=torch.Generator().manual_seed(0)
            )
        )
        > 1
    )


def test_penalty_is_scale_free_and_punishes_parallel_columns():
    M = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)).double()
    P = blockwise_logdet_penalty(M, generator=torch.Generator().manual_seed(3))
    for c in (0.1, 10.0):
        assert (
            abs(float(blockwise_logdet_penalty(c * M, generator=torch.Generator().manual_seed(3)) - P)) < 1e-5
        )
    # One 8-column block: a pair at cosine 0.999 costs log(1 - 0.999²) ≈ -6.2 of log-det.
    # Over nb blocks the mean dilutes that by 1/nb, so the check is made on the block itself.
    block = M[:, :8].clone()
    v = block[:, 1] / block[:, 1].norm()
    w = torch.randn(8, generator=torch.Generator().manual_seed(9)).double()
    w = w - (w @ v) * v
    near = block.clone()
    near[:, 0] = 0.999 * v + math.sqrt(1 - 0.999**2) * w / w.norm()
    assert torch.allclose(near[:, 0] @ v, torch.tensor(0.999, dtype=torch.float64))
    assert (
        float(
            blockwise_logdet_penalty(near, block_mode="fixed")
            - blockwise_logdet_penalty(block, block_mode="fixed")
        )
        > 1
    )


def test_penalty_rejects_bad_block_settings():
    with pytest.raises(ValueError, match="q=9 is larger than the number of columns n=4"):
        blockwise_logdet_penalty(torch.randn(9, 4))
    with pytest.raises(ValueError, match="'diagonal'"):
        blockwise_logdet_penalty(torch.randn(2, 4), block_mode="diagonal")


# ---- the penalty drives the Kruskal rank up --------------------------------------------------
def test_penalty_alone_raises_sampled_sigma_min():
    g = torch.Generator().manual_seed(0)
    A0 = torch.randn(8, 64, generator=g)
    A0[4:] *= 1e-3
    sig0 = sampled_sigma_min(A0, 8, 500, torch.Generator().manual_seed(1))
    assert sig0.median() < 1e-3
    A = A0.clone().requires_grad_(True)
    opt = torch.optim.Adam([A], lr=1e-2)
    for step in range(300):
        loss = blockwise_logdet_penalty(A, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    sig = sampled_sigma_min(A.detach(), 8, 500, torch.Generator().manual_seed(1))
    gauss = sampled_sigma_min(
        torch.randn(8, 64, generator=torch.Generator().manual_seed(2)),
        8,
        500,
        torch.Generator().manual_seed(1),
    )
    assert sig.median() > 0.05
    assert (sig > 0.05).float().mean() >= (gauss > 0.05).float().mean()


# ---- the effect against LoRA on the matrix benchmark (run seed 0: its target, init and blocks) --------
class _SteppedMatrixApprox(LoKRAMatrixApprox):
    step = 0

    @property
    def global_step(self) -> int:
        return self.step


def _fit_matrix(mode: str, target: str, lam: float = 0.0, steps: int = 2000) -> LoKRAMatrixApprox:
    """The module's own training_step and optimizer, in a bare loop: the Trainer path of the same
    experiment is exercised by `litlab repro lokra` and the CLI tests; here we want seconds."""
    L.seed_everything(0, verbose=False)
    module = _SteppedMatrixApprox(mode=mode, penalty=KruskalPenalty(lam=lam))
    batch = next(iter(MatrixApproxDataModule(target=target).train_dataloader()))
    assert torch.equal(batch["target"], _target(target))
    opt = module.configure_optimizers()
    module.log = lambda *args, **kwargs: None  # no Trainer attached
    for step in range(steps):
        module.step = step  # fresh penalty blocks each step, as under the Trainer
        loss = module.training_step(batch, step)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return module


def _target(kind: str) -> torch.Tensor:
    """The target the DataModule draws at run seed 0 (its ``"target"`` stream)."""
    from litlab.lit_modules.core.seeding import derive_seed

    return make_target(kind, seed=derive_seed("target"))


def _rel_err(module: LoKRAMatrixApprox, target: str) -> float:
    T = _target(target)
    delta = module.adapted["layer"].delta_weight().detach()
    return float(torch.linalg.matrix_norm(delta - T) / torch.linalg.matrix_norm(T))


def _eckart_young(target: str, r: int = 8) -> float:
    s = torch.linalg.svdvals(_target(target))
    return float(s[r:].pow(2).sum().sqrt() / s.pow(2).sum().sqrt())


def _kr_optimum(target: str) -> float:
    T = _target(target)
    residual = sum(torch.linalg.svdvals(T[:, j].reshape(8, 8))[1:].pow(2).sum() for j in range(T.shape[1]))
    return float((residual / T.pow(2).sum()).sqrt())


def _delta_rank(module) -> int:
    return int(torch.linalg.matrix_rank(module.adapted["layer"].delta_weight().detach(), rtol=1e-5))


def test_effect_vs_lora_diag_target():
    lora, plus = _fit_matrix("lora", "diag"), _fit_matrix("lokra_plus", "diag")
    assert _rel_err(plus, "diag") < 0.01
    assert abs(_rel_err(lora, "diag") - _eckart_young("diag")) <= 0.005
    assert _delta_rank(lora) <= 8 and _delta_rank(plus) == 64


def test_effect_vs_lora_flat_target_and_lokra_raises_log_volume():
    lora, plus = _fit_matrix("lora", "flat"), _fit_matrix("lokra_plus", "flat")
    assert abs(_rel_err(lora, "flat") - _eckart_young("flat")) <= 0.01
    assert abs(_rel_err(plus, "flat") - _kr_optimum("flat")) <= 0.01
    assert _delta_rank(plus) == 64
    # λ = 1e-2 raises the sampled log-volume of the factors (the mean over A and Bᵀ, as the card's
    # adapters/kruskal_logvol), at <= 0.03 extra error. The size of the rise is the card's claim
    # (penalty_raises_logvol, margin 0.2 over its seeds), not this test's: per factor it varies with the run seed
    # (A -0.10, Bᵀ +0.36 at run seed 0; +0.18 / +0.19 at 1; +0.73 / +0.40 at 2, measured 2026-12-06)
    lokra = _fit_matrix("lokra", "flat", lam=1e-2)
    assert _rel_err(lokra, "flat") <= _rel_err(lora, "flat") + 0.03
    gains = []
    for get in (lambda m: m.A, lambda m: m.B.T):
        vol_lora, vol_lokra = (
            sampled_logvol(
                get(m.adapted["layer"].branches["default"]).detach(), 8, 500, torch.Generator().manual_seed(0)
            )
            for m in (lora, lokra)
        )
        gains.append(float(vol_lokra - vol_lora))
    assert sum(gains) / 2 > 0, gains


def test_effect_vs_lora_lowrank_target():
    lora, plus = _fit_matrix("lora", "lowrank"), _fit_matrix("lokra_plus", "lowrank")
    assert _rel_err(lora, "lowrank") < 0.01
    assert _rel_err(plus, "lowrank") > 0.5


def test_lora_mode_ignores_lambda_and_bad_mode_is_named():
    assert LoKRAMatrixApprox(mode="lora", penalty=KruskalPenalty(lam=1.0)).current_lam() == 0.0
    with pytest.raises(ValueError, match="'loha'"):
        LoKRAMatrixApprox(mode="loha")


# ---- the typed argument groups --------------------------------------------------------------------
def test_penalty_group_is_declared_once_and_checks_its_values():
    import inspect

    for cls in (LoKRAMatrixApprox, LoKRALanguageModel):
        params = inspect.signature(cls.__init__).parameters
        assert params["penalty"].annotation in (KruskalPenalty, "KruskalPenalty")
        assert not {"lam", "penalty_eps", "block_mode", "penalty_seed", "rank"} & set(params)
    for bad, name in (
        ({"lam": -1.0}, "lam"),
        ({"block_mode": "diag"}, "block_mode"),
        ({"every": 0}, "every"),
    ):
        with pytest.raises(ValueError, match=f"penalty.{name}"):
            KruskalPenalty(**bad)


def test_warmup_ramps_lambda_and_every_skips_steps():
    module = _SteppedMatrixApprox(penalty=KruskalPenalty(lam=1e-2, warmup_steps=4, every=2))
    module.log = lambda *args, **kwargs: None
    module.step = 1
    assert module.current_lam() == pytest.approx(1e-2 * 2 / 4)
    batch = next(iter(MatrixApproxDataModule(target="diag").train_dataloader()))
    assert torch.equal(module.training_step(batch, 0), module.task_loss(batch))  # step 1: no penalty


# ---- the tiny LM's base is a seeded family ---------------------------------------------------------
def test_tiny_base_follows_the_run_seed(monkeypatch, tmp_path):
    """The run seed (a card's seed) picks another locally pre-trained base through its ``"backbone"`` stream;
    the same run seed, the same base (the cache, or a second build, gives the same weights)."""
    from litlab.lit_modules.peft.lokra import TinyBase

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))

    def base_weights(seed: int) -> torch.Tensor:
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        lm = LoKRALanguageModel(mode="lora", base=TinyBase(pretrain_steps=2))
        return torch.cat([p.detach().flatten() for p in lm.model.parameters() if not p.requires_grad])

    w0, w1 = base_weights(0), base_weights(1)
    assert not torch.equal(w0, w1)
    assert torch.equal(base_weights(0), w0)
