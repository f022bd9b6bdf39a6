"""Diffract (analysis family): the spec's acceptance checks (§7) on closed forms and tiny models, the probe
callback, and ``litlab analyze diffract`` on checkpoints written by another card's runs (LoKRA)."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers

from litlab.lit_modules.analysis import checkpoints
from litlab.lit_modules.analysis import diffract as D
from litlab.lit_modules.analysis import heads as H
from litlab.lit_modules.analysis import spectral as S
from litlab.lit_modules.core.models import TinyGPT, tiny_llama


def _perturbed(state, scale=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {
        k: (v + scale * torch.randn(v.shape, generator=g) if v.is_floating_point() else v)
        for k, v in state.items()
    }


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=50, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg)


MODELS = {
    "tiny_gpt": (lambda: TinyGPT(vocab_size=97, d_model=32, n_layers=2, n_heads=4, block_size=16), 4, 4),
    "gpt2_conv1d": (_gpt2, 4, 4),
    "llama_gqa": (lambda: tiny_llama(hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=2), 8, 2),
}


# ---- §7.1 head slicing round trip ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_head_slicing_round_trip_is_bitwise(kind):
    build, n, n_kv = MODELS[kind]
    torch.manual_seed(0)
    state = {k: v.detach() for k, v in build().state_dict().items()}
    layers = H.find_attention(state, n, n_kv)
    assert len(layers) == 2
    for att in layers:
        blocks = H.split_heads(state, att)
        assert blocks["q"].shape[0] == n and blocks["k"].shape[0] == n_kv
        assert blocks["q"].shape[1:] == (att.head_dim, n * att.head_dim)  # [d_h, d]: PyTorch [out, in]
        rebuilt = H.merge_heads(state, att, blocks)
        for name, t in rebuilt.items():
            assert torch.equal(t, state[name]), name
    if kind == "gpt2_conv1d":  # Q_0 is the first d_h output columns of c_attn, transposed
        w = state["transformer.h.0.attn.c_attn.weight"]
        assert torch.equal(H.head_block(state, layers[0], "q", 0), w[:, :8].T)
        assert torch.equal(H.head_block(state, layers[0], "k", 1), w[:, 32 + 8 : 32 + 16].T)


# ---- §7.2 rewind identities ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_rewind_identities(kind):
    build, n, n_kv = MODELS[kind]
    torch.manual_seed(0)
    base = {k: v.detach() for k, v in build().state_dict().items()}
    tuned = _perturbed(base)
    layers = H.find_attention(base, n, n_kv)
    units = H.units(layers)
    assert len(units) == 2 * n_kv
    none = H.rewind(tuned, base, layers, [])
    assert all(torch.equal(none[k], tuned[k]) for k in tuned)
    full = H.rewind(tuned, base, layers, units)
    attn = {s.name for att in layers for s in [*att.weights.values(), *att.biases.values()]}
    for k in tuned:
        assert torch.equal(full[k], base[k] if k in attn else tuned[k]), k
    chosen = units[::2]
    part = H.rewind(tuned, base, layers, chosen)
    masks = H.rewind_mask(tuned, layers, chosen)
    for k in tuned:
        m = masks.get(k, torch.zeros_like(tuned[k]))
        assert torch.equal(part[k], torch.where(m.bool(), base[k], tuned[k]))
        formula = tuned[k].double() - m.double() * (tuned[k].double() - base[k].double())
        assert (part[k].double() - formula).abs().max() <= 1e-12
    # a GQA unit owns group_size query heads and one k/v head
    att = layers[0]
    q_rows = masks[att.weights["q"].name].any(dim=1).sum().item() if att.weights["q"].axis == 0 else None
    if q_rows is not None:
        n_groups_chosen = sum(1 for i, _ in chosen if i == 0)
        assert q_rows == n_groups_chosen * att.group_size * att.head_dim


# ---- §7.3 spectral identities on random pairs ------------------------------------------------------------
def test_spectral_identities_on_random_pairs():
    g = torch.Generator().manual_seed(0)
    for i in range(50):
        m, n = int(torch.randint(4, 24, (1,), generator=g)), int(torch.randint(4, 24, (1,), generator=g))
        W0 = torch.randn(m, n, generator=g, dtype=torch.float64)
        Wd = W0 + (0.01 + i / 50) * torch.randn(m, n, generator=g, dtype=torch.float64)
        s = torch.linalg.svdvals(W0)
        assert abs(float(s.norm()) - float(torch.linalg.matrix_norm(W0))) < 1e-10
        r = S.relative_changes(W0, Wd)
        assert 0.0 <= r["rho"] <= 1.0 + 1e-9
        assert abs(r["rS"] - r["rho"] * r["rW"]) < 1e-9
        f = S.svd(W0)
        a, b = S.alignment(f.U, f.U)
        assert torch.allclose(a, torch.ones_like(a), atol=1e-9) and torch.allclose(
            b, torch.ones_like(b), atol=1e-9
        )
        assert abs(S.subspace_overlap(f.U, f.U, 3) - 1.0) < 1e-9
    assert S.relative_changes(W0, W0) == {"rW": 0.0, "rS": 0.0, "rho": 0.0}
    m, k = 256, 16
    ovs = [
        S.subspace_overlap(
            torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))[0],
            torch.linalg.qr(torch.randn(m, k, generator=g, dtype=torch.float64))[0],
            k,
        )
        for _ in range(30)
    ]
    assert abs(sum(ovs) / len(ovs) - k / m) < 0.3 * k / m


def test_norms_and_ranks_closed_forms():
    W = torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
    out = S.norms_and_ranks(W)
    p = torch.tensor([3.0, 2.0, 1.0]) / 6
    assert out["spectral"] == pytest.approx(3.0) and out["fro"] == pytest.approx(math.sqrt(14))
    assert out["stable_rank"] == pytest.approx(14 / 9)
    assert out["effective_rank"] == pytest.approx(float(torch.exp(-(p * p.log()).sum())))
    assert torch.allclose(S.esd(W), torch.tensor([9.0, 4.0, 1.0], dtype=torch.float64) / 3)


# ---- §7.4 gauge invariance --------------------------------------------------------------------------------
def test_sign_flips_and_permutations_leave_alignment_and_rotation_unchanged():
    g = torch.Generator().manual_seed(3)
    W0 = torch.randn(12, 8, generator=g, dtype=torch.float64)
    Wd = W0 + 0.3 * torch.randn(12, 8, generator=g, dtype=torch.float64)
    f0, fd = S.svd(W0), S.svd(Wd)
    _, b = S.alignment(f0.U, fd.U)
    ref_rot, ref_ov = S.rotation_from_factors(f0, fd), S.subspace_overlap(f0.U, fd.U, 4)
    signs = torch.tensor([1.0, -1, -1, 1, -1, 1, 1, -1], dtype=torch.float64)
    flipped = S.SVD(fd.U * signs, fd.s, fd.V * signs)  # a sign-flipped pair of singular vectors: same matrix
    assert torch.allclose((flipped.U * flipped.s) @ flipped.V.T, Wd, atol=1e-12)
    _, b_flip = S.alignment(f0.U, flipped.U)
    assert torch.allclose(b_flip, b, atol=1e-9)
    assert abs(S.rotation_from_factors(f0, flipped) - ref_rot) < 1e-9
    assert abs(S.subspace_overlap(f0.U, flipped.U, 4) - ref_ov) < 1e-9
    perm = torch.tensor([1, 0, 3, 2, 4, 6, 5, 7])  # within the top-4 and outside it
    permuted = S.SVD(fd.U[:, perm], fd.s[perm], fd.V[:, perm])
    _, b_perm = S.alignment(f0.U, permuted.U)
    assert torch.allclose(b_perm, b, atol=1e-9) and abs(b_perm.mean() - b.mean()) < 1e-9
    assert abs(S.rotation_from_factors(f0, permuted) - ref_rot) < 1e-9
    assert abs(S.subspace_overlap(f0.U, permuted.U, 4) - ref_ov) < 1e-9
    assert abs(S.rotation_score(W0, W0)) < 1e-9 and S.rotation_score(W0, Wd) > 0.01


# ---- §7.5 randomized SVD -----------------------------------------------------------------------------------
def test_randomized_svd_recovers_a_decaying_spectrum():
    g = torch.Generator().manual_seed(0)
    U = torch.linalg.qr(torch.randn(512, 256, generator=g, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(256, 256, generator=g, dtype=torch.float64))[0]
    s = 0.8 ** torch.arange(256, dtype=torch.float64)
    W = (U * s) @ V.T
    state = torch.random.get_rng_state()
    top = S.randomized_top_k(W, 8, niter=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's generator is untouched
    assert ((top.s - s[:8]).abs() / s[:8]).max() < 1e-3
    assert S.subspace_overlap(top.U, U, 8) > 0.999


# ---- swap test closed forms --------------------------------------------------------------------------------
def test_swap_of_a_pure_rotation_keeps_the_spectrum():
    g = torch.Generator().manual_seed(0)
    W0 = torch.randn(10, 6, generator=g, dtype=torch.float64)
    Q = torch.linalg.qr(torch.randn(10, 10, generator=g, dtype=torch.float64))[0]
    Wd = Q @ W0  # rotated vectors, identical singular values
    assert S.relative_changes(W0, Wd)["rho"] < 1e-9
    assert torch.allclose(S.swap_vectors(W0, Wd), Wd, atol=1e-9)  # base values on tuned vectors = Wd
    assert torch.allclose(S.swap_values(W0, Wd), W0, atol=1e-9)  # tuned values on base vectors = W0
    assert S.gain_recovered(3.0, 2.0, 2.0) == 1.0 and S.gain_recovered(3.0, 3.0, 2.0) == 0.0


# ---- rewinding curve, AUC, p*, interpolation (§3.5-3.6, §7.6) ----------------------------------------------
def test_auc_pstar_and_barrier_closed_forms():
    fr = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    losses = [2.0 + 0.4 * p for p in fr]
    assert D.auc(fr, losses, 0.75) == pytest.approx(0.4 * 0.75**2 / 2, abs=1e-12)
    assert D.max_removable(fr, losses, eps=0.1) == pytest.approx(0.2)
    alphas = [i / 10 for i in range(11)]
    assert D.barrier(alphas, [1 + a for a in alphas]) == pytest.approx(0.0, abs=1e-12)
    assert D.barrier(alphas, [1 + 0.5 * math.sin(math.pi * a) for a in alphas]) == pytest.approx(0.5)


def test_interpolation_endpoints_are_exact_and_reproduce_losses():
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=97, d_model=32, n_layers=1, n_heads=4, block_size=16).eval()
    a = {k: v.detach().clone() for k, v in model.state_dict().items()}
    b = _perturbed(a, 0.1)
    assert all(torch.equal(D.interpolate(a, b, 0.0)[k], a[k]) for k in a)
    assert all(torch.equal(D.interpolate(a, b, 1.0)[k], b[k]) for k in a)
    batch = {"input_ids": torch.randint(0, 97, (4, 16)), "labels": torch.randint(0, 97, (4, 16))}
    ev = D.evaluator(model, batch)
    model.load_state_dict(b)
    with torch.no_grad():
        direct = torch.nn.functional.cross_entropy(
            model(batch["input_ids"]).flatten(0, 1), batch["labels"].flatten()
        )
    assert abs(ev(D.interpolate(a, b, 1.0)) - float(direct)) < 1e-6


def test_head_scores_single_out_the_changed_head_and_oracle_orders_by_harm():
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=97, d_model=32, n_layers=2, n_heads=4, block_size=16).eval()
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    layers = H.find_attention(base, 4)
    tuned = dict(base)
    name = layers[1].weights["q"].name  # change head 2 of layer 1 only
    w = tuned[name].clone()
    w[2 * 8 : 3 * 8] += 0.5 * torch.randn(8, 32)
    tuned[name] = w
    for crit in ("rotation", "rel_update", "abs_update", "spectral_shift"):
        scores = D.head_scores(crit, base, tuned, layers)
        assert int(scores.argmax()) == 4 + 2, crit
        assert scores[torch.arange(8) != 6].abs().max() < 1e-9, crit
    batch = {"input_ids": torch.randint(0, 97, (8, 16)), "labels": torch.randint(0, 97, (8, 16))}
    ev = D.evaluator(model, batch)
    oracle = D.head_scores("oracle", base, tuned, layers, ev)
    assert oracle[torch.arange(8) != 6].abs().max() < 1e-6 and abs(float(oracle[6])) > 0
    grads = D.loss_gradients(model, tuned, batch)
    taylor = D.head_scores("taylor", base, tuned, layers, grads=grads)
    assert int(taylor.argmax()) == 6 and taylor[torch.arange(8) != 6].abs().max() < 1e-9
    r1, r2 = (
        D.head_scores("random", base, tuned, layers, seed=5),
        D.head_scores("random", base, tuned, layers, seed=5),
    )
    assert torch.equal(r1, r2)


def test_greedy_oracle_sees_interactions_the_one_unit_oracle_misses():
    """Units 0 and 1 are each harmless to rewind but costly together (an interaction); every other unit costs
    0.1 x its index. The one-unit oracle rewinds 0 then 1 (the cost jumps at step 2); the greedy oracle rewinds 0
    and leaves 1 for last, so its curve is never above the one-unit oracle's and each step is the cheapest
    one-unit extension of the set before it."""
    torch.manual_seed(0)
    base = {
        k: v.detach()
        for k, v in TinyGPT(vocab_size=97, d_model=32, n_layers=2, n_heads=4, block_size=16)
        .state_dict()
        .items()
    }
    tuned = _perturbed(base)
    layers = H.find_attention(base, 4)
    units = H.units(layers)

    def rewound(state) -> frozenset:
        return frozenset(
            j
            for j, (i, g) in enumerate(units)
            if torch.equal(H.head_block(state, layers[i], "q", g), H.head_block(base, layers[i], "q", g))
        )

    def cost(chosen: frozenset) -> float:
        return 5.0 * ({0, 1} <= chosen) + sum(0.1 * j for j in chosen if j > 1)

    calls = []

    def evaluate(state) -> float:
        calls.append(1)
        return cost(rewound(state))

    greedy = D.head_scores("oracle_greedy", base, tuned, layers, evaluate)
    assert len(calls) == len(units) * (len(units) + 1) // 2
    assert sorted(greedy.tolist()) == list(range(len(units)))
    order = greedy.argsort().tolist()
    assert order == [0, 2, 3, 4, 5, 6, 7, 1]
    oracle = D.head_scores("oracle", base, tuned, layers, evaluate).tolist()
    one_unit_order = sorted(range(len(units)), key=lambda j: (oracle[j], j))
    assert one_unit_order[:2] == [0, 1]
    for k in range(1, len(units) + 1):
        g_set, o_set = frozenset(order[:k]), frozenset(one_unit_order[:k])
        assert cost(g_set) <= cost(o_set)
        assert cost(g_set) == min(
            cost(frozenset(order[: k - 1]) | {j}) for j in set(range(len(units))) - set(order[: k - 1])
        )
    with pytest.raises(ValueError, match="oracle_greedy criterion needs an evaluator"):
        D.head_scores("oracle_greedy", base, tuned, layers)


# ---- the CPT module, the probe callback (§7.8 second part) ---------------------------------------------------
TINY = [
    "--model.init_args.base.pretrain_steps=20",
    "--model.init_args.base.d_model=32",
    "--model.init_args.base.heads=4",
    "--model.init_args.base.block_size=32",
    "--data.init_args.block_size=32",
    "--data.init_args.val_windows=16",
    "--data.init_args.train_windows_per_epoch=320",
    "--model.init_args.analysis.n_random=2",
    "--trainer.enable_progress_bar=false",
]


def _fit(tmp_path, run_id, *extra):
    from litlab.__main__ import main

    args = ["fit", "--config", "configs/diffract/quick.yaml", f"--runs_dir={tmp_path}", f"--run_id={run_id}"]
    assert main(args + TINY + list(extra)) == 0
    return tmp_path / "diffract" / run_id


def test_cpt_fit_logs_the_analysis_and_probe_leaves_training_bitwise_unchanged(tmp_path, monkeypatch):
    monkeypatch.chdir(checkpoints.Path(__file__).resolve().parent.parent)
    with_probe = _fit(tmp_path, "probe", "--trainer.max_steps=20")
    without = _fit(tmp_path, "plain", "--trainer.max_steps=20", "--trainer.callbacks=[]")
    a = torch.load(with_probe / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    b = torch.load(without / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    probe = json.loads((with_probe / "probe.json").read_text())["history"]
    assert probe[0]["step"] == 0
    assert (
        probe[0]["rW_mean"] == 0.0
        and probe[0]["rho_mean"] == 0.0
        and probe[0]["a_mean"] == pytest.approx(1.0)
    )
    summary = json.loads((with_probe / "summary.json").read_text())["metrics"]
    assert 0.0 <= summary["diffract/rho_max"] <= 1.0 and summary["diffract/rW_mean"] > 0
    assert summary["diffract/loss_tuned_domain"] < summary["diffract/loss_base_domain"]
    assert summary["diffract/G"] == summary["diffract/G_vec"]
    assert {"diffract/auc", "diffract/auc_min", "diffract/loss_general_rewound"} <= set(summary)
    report = json.loads((with_probe / "diffract.json").read_text())
    assert len(report["curves"]["rotation"]["domain"]) == len(report["fractions"])
    assert (with_probe / "diffract_rewind.png").exists() and (with_probe / "probe_heads.png").exists()
    # the #base source rebuilds θ0 exactly: the module's cached base, not the trained weights
    base = checkpoints.load(str(with_probe / "checkpoints" / "last.ckpt") + "#base").state()
    tuned = checkpoints.load(str(with_probe)).state()
    assert all(torch.equal(tuned[k], a["model." + k]) for k in tuned)
    assert any(not torch.equal(base[k], tuned[k]) for k in tuned)


# ---- `litlab analyze diffract` on checkpoints of another card's runs (LoKRA) ---------------------------------
def test_analyze_two_lokra_checkpoints(tmp_path, monkeypatch):
    from litlab.__main__ import main

    monkeypatch.chdir(checkpoints.Path(__file__).resolve().parent.parent)
    short = [
        "--trainer.max_steps=6",
        "--trainer.limit_val_batches=1",
        "--model.init_args.base.pretrain_steps=20",
        "--model.init_args.warmup_steps=2",
        "--trainer.enable_progress_bar=false",
        f"--runs_dir={tmp_path}",
    ]
    ckpts = {}
    for mode in ("lora", "lokra_plus"):
        args = [
            "fit",
            "--config",
            "configs/lokra/quick.yaml",
            f"--model.init_args.mode={mode}",
            f"--run_id={mode}",
        ]
        assert main(args + short) == 0
        ckpts[mode] = tmp_path / "lokra" / mode / "checkpoints" / "last.ckpt"
    out = tmp_path / "report"
    argv = ["analyze", "diffract", "--base", f"{ckpts['lora']}#base", "--tuned", str(ckpts["lora"])]
    argv += ["--tuned", str(ckpts["lokra_plus"]), "--domain", "text", "--criteria", "rotation", "random"]
    argv += ["--n-random", "2", "--windows", "8", "--alphas", "3", "--out", str(out)]
    assert main(argv) == 0
    res = json.loads((out / "results.json").read_text())["results"]
    for r in res[:2]:
        s = r["scalars"]
        assert s["rW_mean"] > 0 and 0 <= s["rho_max"] <= 1 and math.isfinite(s["auc_rotation"])
    assert set(res[2]["interpolation"]["barriers"]) == {"L_text", "L_general(text)"}
    assert (out / "report.md").exists() and (out / "tuned1" / "diffract_heads.png").exists()
    # the base is LoKRA's frozen TinyGPT; the tuned weights are base + merged adapter deltas
    raw = torch.load(ckpts["lora"], weights_only=True)["state_dict"]
    base = checkpoints.load(f"{ckpts['lora']}#base").state()
    assert torch.equal(base["blocks.0.attn.q_proj.weight"], raw["model.blocks.0.attn.q_proj.base.weight"])
    tuned = checkpoints.load(str(ckpts["lora"])).state()
    A, B = (
        raw["model.blocks.0.attn.q_proj.branches.default.A"],
        raw["model.blocks.0.attn.q_proj.branches.default.B"],
    )
    assert not any(".branches." in k for k in tuned)
    delta = tuned["blocks.0.attn.q_proj.weight"] - base["blocks.0.attn.q_proj.weight"]
    assert torch.allclose(delta, (8.0 / 4) * B @ A, atol=1e-6)


# ---- effect checks on the quick recipe (spec §7.7, §7.8; slow: three full CPT fits, seed 0) ---------------------
@pytest.fixture(scope="module")
def quick_scalars(tmp_path_factory):
    from litlab.__main__ import main

    root = checkpoints.Path(__file__).resolve().parent.parent
    out = tmp_path_factory.mktemp("diffract_quick")
    scal = {}
    for domain in ("math", "code", "instruction"):
        args = ["fit", "--config", str(root / "configs/diffract/quick.yaml"), f"--runs_dir={out}"]
        args += [
            f"--run_id={domain}",
            f"--data.init_args.domain={domain}",
            "--trainer.enable_progress_bar=false",
        ]
        args += ["--experiment=diffract"]
        assert main(args) == 0
        scal[domain] = json.loads((out / "diffract" / domain / "diffract.json").read_text())["scalars"]
    return scal


@pytest.mark.slow
def test_swap_test_vectors_carry_the_gain(quick_scalars):  # §7.7
    for domain in ("math", "code"):
        s = quick_scalars[domain]
        assert s["G_vec"] >= 0.8 and s["G_vec"] - s["G_val"] >= 0.15, (domain, s["G_vec"], s["G_val"])


@pytest.mark.slow
def test_oracles_beat_random_rewinding(quick_scalars):  # §7.8; the greedy one is the card's positive control
    for domain, s in quick_scalars.items():
        assert s["auc_oracle"] <= s["auc_random_min"], (domain, s["auc_oracle"], s["auc_random_min"])
        assert s["auc_oracle_greedy"] <= s["auc_oracle"], (domain, s["auc_oracle_greedy"], s["auc_oracle"])


@pytest.mark.slow
@pytest.mark.xfail(
    reason="measured (card diffract, 2026-12-06): the reconstructed rotation criterion is not better than random "
    "rewinding at this scale (math, run seed 0: AUC 0.0371 vs random mean 0.0251, above 1.05x)",
    strict=True,  # seed 0 is deterministic: a pass here means the card's verdict moved
)
def test_rotation_against_random_rewinding(quick_scalars):  # §7.8
    for domain, s in quick_scalars.items():
        assert s["auc_rotation"] <= 1.05 * s["auc_random"], (domain, s["auc_rotation"], s["auc_random"])
    assert any(s["auc_rotation"] <= s["auc_random"] for s in quick_scalars.values())
