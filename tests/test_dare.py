"""DARE (arXiv 2511.03828) checks: the alignment score, posterior and exchange, the reductions to the two
baselines, freezing, and (slow) the mechanism and effect on Pendulum."""

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from scipy.stats import norm
from torch.distributions import Normal, kl_divergence

from litlab.lit_modules.rl.dare import (
    DARE,
    BehaviorModel,
    Networks,
    Optim,
    Relaxation,
    align,
    exchange,
    fit_gaussians,
    posterior_online,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _run_seed_restored(monkeypatch):
    """``seed_everything`` exports the run seed (``PL_GLOBAL_SEED``); each test gets back the one it found."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")


# ---- alignment closed form -----------------------------------------------------------------
def test_alignment_closed_form_and_k_average():
    torch.manual_seed(0)
    a, ref, sigma = torch.randn(32, 6), torch.randn(3, 32, 6), 0.7
    single = [align(a, ref[k : k + 1], "gaussian_kl", sigma) for k in range(3)]
    kl = kl_divergence(Normal(a, sigma), Normal(ref[0], sigma)).sum(-1)
    assert torch.allclose(single[0], kl, atol=1e-5)
    assert torch.allclose(single[0], (a - ref[0]).pow(2).sum(-1) / (2 * sigma**2), atol=1e-5)
    assert torch.allclose(align(a, ref, "gaussian_kl", sigma), torch.stack(single).mean(0), atol=1e-5)
    assert (align(a, ref, "softmax_kl") >= -1e-6).all()
    with pytest.raises(ValueError, match="nll"):
        align(a, ref, "nll")


# ---- posterior -----------------------------------------------------------------------------
def test_posterior_matches_bayes_formula_and_is_finite_in_the_tails():
    fits = torch.tensor([0.5, 0.3, 2.0, 0.9], dtype=torch.float64)
    d = torch.tensor([-2.0, 0.0, 0.5, 1.2, 2.0, 4.0, 0.5 + 30 * 0.3, 2.0 - 30 * 0.9], dtype=torch.float64)
    p = posterior_online(d, fits, prior_online=0.4)
    on = 0.4 * norm.pdf(d.numpy(), 2.0, 0.9)
    off = 0.6 * norm.pdf(d.numpy(), 0.5, 0.3)
    assert np.allclose(p.numpy(), on / (on + off), atol=1e-6)
    far = posterior_online(torch.tensor([1e4, -1e4], dtype=torch.float64), fits, 0.5)
    assert torch.isfinite(far).all()  # both densities underflow; log space keeps the ratio


# ---- exchange invariants and separation ------------------------------------------------------
def _mask(d, online, tau=0.5):
    fits = fit_gaussians(d, online)
    return exchange(d, online, posterior_online(d, fits, float(online.float().mean())), fits, tau), fits


def test_exchange_invariants():
    g = torch.Generator().manual_seed(1)
    d = torch.rand(200, generator=g)
    online = torch.arange(200) >= 100
    same = torch.cat([d[:100], d[:100]])  # identical fits
    m, _ = _mask(same, online)
    assert m.shape == (200,) and torch.equal(m, (~online).float())
    lower = torch.cat([d[:100] + 1.0, d[100:]])  # μ_on <= μ_off: no exchange
    m, fits = _mask(lower, online)
    assert fits[2] <= fits[0] and torch.equal(m, (~online).float())
    shifted = torch.cat([d[:100], d[100:] + 0.6])
    m, fits = _mask(shifted, online)
    moved_off = ~online & (m == 0)
    moved_on = online & (m == 1)
    assert moved_off.any() and moved_on.any()
    assert (shifted[moved_off] > fits[0]).all() and (shifted[moved_on] < fits[2]).all()
    m1, _ = _mask(shifted, online, tau=1.0)  # τ_x = 1: the origin split
    assert torch.equal(m1, (~online).float())


def test_exchange_separates_latent_components_better_than_origin():
    rng = np.random.default_rng(0)
    n = 4096
    latent_b = np.r_[rng.random(n) < 0.1, rng.random(n) < 0.5]  # B = behaviour-inconsistent
    d = torch.tensor(
        np.where(latent_b, rng.normal(3, 1, 2 * n), rng.normal(0, 1, 2 * n)), dtype=torch.float32
    )
    online = torch.arange(2 * n) >= n
    m, _ = _mask(d, online)
    b = torch.tensor(latent_b)

    def mislabel(mask):  # constrained should be A, relaxed should be B
        return float(((mask == 1) & b).float().mean() + ((mask == 0) & ~b).float().mean())

    def fisher(mask):
        c, r = d[mask == 1], d[mask == 0]
        return float((r.mean() - c.mean()) ** 2 / (r.var() + c.var()))

    origin = (~online).float()
    assert mislabel(origin) == pytest.approx(0.30, abs=0.02)
    assert mislabel(m) < 0.12 < mislabel(origin)  # NumPy reference of the rule: 30.7 % -> 6.9 %
    assert fisher(m) > 3.0 > 0.5 > fisher(origin)  # reference: 0.25 -> 5.4


# ---- reductions, per-sample isolation -------------------------------------------------
def _module_and_batch(**kw):
    torch.manual_seed(0)
    model = DARE(networks=Networks(hidden=(32, 32)), obs_dim=3, act_dim=2, **kw)
    n = 16
    batch = {
        "obs": torch.randn(n, 3),
        "act": torch.rand(n, 2) * 2 - 1,
        "rew": torch.randn(n),
        "next_obs": torch.randn(n, 3),
        "terminal": torch.zeros(n),
    }
    online = torch.arange(n) >= n // 2
    return model, batch, online


def test_reductions_constrained_is_iql_and_tau_one_is_origin_split():
    from litlab.lit_modules.rl import iql
    from litlab.lit_modules.rl.sac import actor_loss_per_sample

    model, batch, online = _module_and_batch(mask_mode="constrained")
    mask, _ = model.sample_mask(batch, online)
    plain_iql = iql.awr_loss_per_sample(model.actor, model.critic_target, model.value, batch, 3.0).mean()
    assert torch.allclose(model.actor_loss(batch, mask), plain_iql, atol=1e-6)

    model, batch, online = _module_and_batch(mask_mode="dare", relaxation=Relaxation(exchange_tau=1.0))
    mask, _ = model.sample_mask(batch, online)
    assert torch.equal(mask, (~online).float())
    torch.manual_seed(5)
    loss = model.actor_loss(batch, mask)
    torch.manual_seed(5)
    con = iql.awr_loss_per_sample(model.actor, model.critic_target, model.value, batch, 3.0)
    rel, _ = actor_loss_per_sample(model.actor, model.critic, batch["obs"], 0.2)
    hand = (con[~online].sum() + rel[online].sum()) / len(online)
    assert torch.allclose(loss, hand, atol=1e-6)


def test_relaxed_ceiling_is_the_sac_actor_loss_on_every_sample():
    from litlab.lit_modules.rl.sac import actor_loss_per_sample

    model, batch, online = _module_and_batch(mask_mode="relaxed")
    mask, stats = model.sample_mask(batch, online)
    assert torch.equal(mask, torch.zeros(len(online))) and stats == {}
    torch.manual_seed(5)
    loss = model.actor_loss(batch, mask)
    torch.manual_seed(5)
    rel, _ = actor_loss_per_sample(model.actor, model.critic, batch["obs"], 0.2)
    assert torch.allclose(loss, rel.mean(), atol=1e-6)


def test_awr_term_gives_no_gradient_through_relaxed_rows():
    model, batch, online = _module_and_batch()
    mask = (~online).float()
    perturbed = {**batch, "act": batch["act"].clone()}
    perturbed["act"][online] = -batch["act"][online]  # relaxed rows: their dataset actions must not matter

    def grads(b):
        model.zero_grad()
        torch.manual_seed(7)
        model.actor_loss(b, mask).backward()
        return [p.grad.clone() for p in model.actor.parameters()]

    assert all(torch.allclose(x, y, atol=1e-7) for x, y in zip(grads(batch), grads(perturbed)))
    perturbed["act"][~online] = -batch["act"][~online]  # constrained rows do matter
    assert not all(torch.allclose(x, y, atol=1e-7) for x, y in zip(grads(batch), grads(perturbed)))


# ---- freezing ------------------------------------------------------------------------------
@pytest.mark.parametrize("behavior", ["gaussian", "diffusion"])
def test_behaviour_model_frozen_online_while_actor_and_critic_learn(behavior, quiet_trainer):
    from litlab.datamodules.rl import OfflineData, RLDataModule, Scaling

    L.seed_everything(0, verbose=False)
    dm = RLDataModule(
        env_id="Pendulum-v1",
        offline=OfflineData(level="medium"),
        scaling=Scaling(obs_scale=(1.0, 1.0, 8.0), reward_scale=0.1),
    )
    model = DARE(
        offline_steps=30,  # the phase switch is the method's: Stage B starts at iteration 30
        online_steps=66,
        networks=Networks(hidden=(32, 32)),
        behavior_model=BehaviorModel(kind=behavior),
        optim=Optim(batch_offline=16, batch_online=16),
    )
    snapshots = {}

    class Snap(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.datamodule.iteration == 46:  # online and warm (16 online rows) from here on
                snapshots.update(
                    {
                        name: {k: v.clone() for k, v in getattr(pl_module, name).state_dict().items()}
                        for name in ("behavior", "actor", "critic")
                    }
                )

    trainer = quiet_trainer(max_epochs=1, callbacks=[Snap()])
    trainer.fit(model, dm)
    assert (
        dm.iteration == dm.total_iterations == 96 and dm.env_steps == 66 and len(model.mechanism) == 66 - 15
    )
    after = {name: getattr(model, name).state_dict() for name in ("behavior", "actor", "critic")}
    assert all(torch.equal(v, after["behavior"][k]) for k, v in snapshots["behavior"].items())
    assert not any(p.requires_grad for p in model.behavior.parameters()) and not model.behavior.training
    for name in ("actor", "critic"):
        assert any(not torch.equal(v, after[name][k]) for k, v in snapshots[name].items()), name


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="calql"):
        DARE(base_algo="calql")
    with pytest.raises(ValueError, match="energy_guidance"):
        DARE(behavior_model=BehaviorModel(energy_guidance=True))
    with pytest.raises(ValueError, match="exchange_tau"):
        DARE(relaxation=Relaxation(exchange_tau=1.5))
    with pytest.raises(ValueError, match="step counts"):
        DARE(offline_steps=-1)
    with pytest.raises(ValueError, match="unknown keys"):
        DARE(relaxation={"exchange_tau": 0.5, "tau": 0.5})  # a mapping (LightningCLI, hparams) is checked


def test_networks_and_behaviour_model_draw_from_their_own_streams(monkeypatch):
    """Actor/critic/value come from the run's ``init`` stream and the behaviour model from ``behavior``
    (``derive_seed``): the same run seed builds the same nets whatever torch's global generator holds, another
    seed other nets, and building leaves the global generator (the learner's stream) where it was."""
    from litlab.lit_modules.core.seeding import reset_ledger, seed_ledger

    def build(seed, global_draws):
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        reset_ledger(seed)
        torch.manual_seed(123)
        torch.rand(global_draws)
        before = torch.get_rng_state()
        model = DARE(networks=Networks(hidden=(8, 8)), obs_dim=3, act_dim=1)
        assert torch.equal(torch.get_rng_state(), before)
        return model.state_dict(), seed_ledger()["components"]

    (a, ledger_a), (b, _), (c, ledger_c) = build(0, 1), build(0, 7), build(1, 1)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["actor.net.0.weight"], c["actor.net.0.weight"])
    assert set(ledger_a) == {"init", "behavior"} and ledger_a["init"] != ledger_c["init"]


# ---- mechanism, effect (LowTorquePendulum-v0, minutes) ----------------------------------------
@pytest.fixture(scope="module")
def mechanism_summary(tmp_path_factory):
    """§7.7 numbers of the quick config, seed 0, trained here (one torch thread, as ``litlab repro`` runs it,
    so they equal the card's ``dare`` seed-0 run)."""
    from litlab.cli import LitlabCLI

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cli = LitlabCLI(
            args=[
                "fit",
                f"--config={ROOT / 'configs/dare/quick.yaml'}",
                "--seed_everything=0",
                f"--runs_dir={tmp_path_factory.mktemp('dare_mech')}",
                "--trainer.enable_progress_bar=false",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    summary = cli.model.mechanism_summary()
    assert summary == {k: pytest.approx(float(cli.trainer.callback_metrics[k])) for k in summary}
    return summary


@pytest.mark.slow
def test_mechanism_no_exchange_while_gap_nonpositive_and_both_directions(mechanism_summary):
    m = mechanism_summary
    assert m["dare/moves_while_gap_nonpositive"] == 0  # (i)
    assert m["dare/moves_off_to_relaxed_total"] >= 1 and m["dare/moves_on_to_constrained_total"] >= 1  # (iii)
    assert 0 < m["dare/online_constrained_share_last"] < 1  # a real mix, not the origin split


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,  # was the card claim policy_drifts_from_behaviour (recorded fail, moved here by the issue-28
    # amendment of seeds/dare.yaml; its status_note tells it): a pass here means the card's note must change
    reason="not reproduced on LowTorquePendulum-v0: offline IQL ends weak (score ≈ 15, the data set's level), so "
    "the online policy starts *less* behaviour-consistent than the data (gap ≈ +0.03..+0.06 in the first 1.5k "
    "steps) and moves toward it (gap ≈ +0.01 at the end): the drift is negative on every seed of the card",
)
def test_mechanism_gap_drift(mechanism_summary):
    """(ii) the policy drifts away from the behaviour model: the mean gap μ_on − μ_off over the last 1.5k
    online steps exceeds its mean over the first 1.5k (spec's validation run: −0.04 -> +0.006)."""
    assert mechanism_summary["dare/gap_drift"] > 0


@pytest.mark.slow
def test_mechanism_relaxed_majority_at_the_end(mechanism_summary):
    """(iv) over the last 1000 online steps fewer than half of the online-origin samples are labelled
    offline-like (spec's validation run: ≈ 0.35)."""
    assert mechanism_summary["dare/online_constrained_share_last"] < 0.5


@pytest.mark.slow
def test_effect_no_collapse_and_not_worse_than_iql_o2o(tmp_path):
    """Spec §7.8 on the card's design (its medium scale, seeds 0-2), trained here: DARE's final score >= its
    own offline-end score − 5 and >= IQL-O2O's − 5 (means over seeds). The card's claims (margins, intervals)
    are judged by tests/test_cards_slow.py."""
    from litlab.cards import load_card
    from litlab.repro import reproduce

    result = reproduce(
        load_card(ROOT / "seeds/dare.yaml"),
        "medium",
        seeds=[0, 1, 2],
        only=["dare", "iql_o2o"],
        out_root=tmp_path,
        jobs=2,
    )
    mean = {name: run.mean for name, run in result.runs.items()}
    mean["dare_offline_end"] = float(np.mean(result.runs["dare"].metrics["eval/score_offline_end"]))
    assert mean["dare"] >= mean["dare_offline_end"] - 5, mean
    assert mean["dare"] >= mean["iql_o2o"] - 5, mean


# ---- mutation test of the card's mechanism claim relaxed_majority_at_end (seeds/dare.yaml) ----------
def _online_constrained_share(model, n_batches=20, n=128, consistent_share=0.3):
    """Mean over batches of the share of online-origin samples the module labels constrained (what
    ``mechanism_summary`` averages into dare/online_constrained_share_last), on batches whose offline half
    follows the behaviour model and whose online half does only for ``consistent_share`` of its rows (the
    rest uniform actions: the online policy has left the behaviour)."""
    g = torch.Generator().manual_seed(0)
    shares = []
    for _ in range(n_batches):
        obs = torch.randn(2 * n, 3, generator=g)
        mode = model.behavior.sample(obs, 1)[0]
        act = (mode + 0.05 * torch.randn(2 * n, 2, generator=g)).clamp(-1, 1)
        online = torch.arange(2 * n) >= n
        far = online & (torch.rand(2 * n, generator=g) >= consistent_share)
        act[far] = torch.rand(int(far.sum()), 2, generator=g) * 2 - 1
        mask, _ = model.sample_mask({"obs": obs, "act": act}, online)
        shares.append(float(mask[online].mean()))
    return float(np.mean(shares))


def test_mutation_relaxed_share_fails_with_inverted_or_constant_mask(monkeypatch):
    """seeds/dare.yaml relaxed_majority_at_end (dare/online_constrained_share_last < 0.5) fails_if the mask's
    polarity is inverted or every sample stays constrained: the real rule leaves behaviour-inconsistent online
    samples relaxed (share < 0.5); the inverted mask and m ≡ 1 do not."""
    import litlab.lit_modules.rl.dare as dare_mod

    torch.manual_seed(0)
    model = DARE(networks=Networks(hidden=(32, 32)), obs_dim=3, act_dim=2)
    real = _online_constrained_share(model)
    # the consistent online rows are moved to the constrained subset, the rest stay relaxed
    assert 0.0 < real < 0.5, real
    constant = DARE(networks=Networks(hidden=(32, 32)), obs_dim=3, act_dim=2, mask_mode="constrained")
    constant.behavior.load_state_dict(model.behavior.state_dict())
    assert _online_constrained_share(constant) == 1.0 >= 0.5
    real_exchange = dare_mod.exchange
    # the mutation: the mask's polarity inverted (m = 1 read as relaxed)
    monkeypatch.setattr(dare_mod, "exchange", lambda *a, **k: 1.0 - real_exchange(*a, **k))
    inverted = _online_constrained_share(model)
    assert inverted >= 0.5, inverted
