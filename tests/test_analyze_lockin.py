"""``litlab analyze lockin`` (issue 16): the Rayleigh check, the stiff-mode fraction and the bifurcation comparison
against closed forms and hand computations, then the command on tiny ``configs/lock_in/quick.yaml`` runs made in
``tmp_path`` (plain and projected) and on a checkpoint of another card's run (LoKRA), and its errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from litlab.lit_modules.analysis import curvature as C
from litlab.lit_modules.analysis import lock_in as LI

ROOT = Path(__file__).resolve().parent.parent


# ---- pure functions ------------------------------------------------------------------------------------------
def test_rayleigh_check_against_closed_forms():
    d = torch.tensor([5.0, 3.0, 1.0, 0.5], dtype=torch.float64)
    eps = 1e-2
    e0 = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    near = torch.tensor([1.0, eps, 0.0, 0.0], dtype=torch.float64)  # e_0 + ε e_1, checked against λ = 5
    out = C.rayleigh_check(lambda v: d * v, torch.tensor([5.0, 5.0]), torch.stack([e0, near], 1))
    assert out["rayleigh"][0] == 5.0 and out["rel_diff"][0] == 0.0 and out["residual"][0] == 0.0
    q = (5.0 + 3.0 * eps**2) / (1 + eps**2)  # v = e_0 + ε e_1: vᵀHv / vᵀv
    assert out["rayleigh"][1] == pytest.approx(q, rel=1e-14)
    assert out["rel_diff"][1] == pytest.approx((5.0 - q) / 5.0, rel=1e-10)
    # ||Hv - 5 v|| = ε |3 - 5|, over |λ| ||v|| = 5 sqrt(1 + ε²)
    assert out["residual"][1] == pytest.approx(eps * 2.0 / (5.0 * math.sqrt(1 + eps**2)), rel=1e-12)
    # a Lanczos Ritz vector's Rayleigh quotient is its Ritz value; n limits the pairs checked
    g = torch.Generator().manual_seed(0)
    Q = torch.linalg.qr(torch.randn(60, 60, generator=g, dtype=torch.float64))[0]
    Hm = Q @ torch.diag(torch.linspace(0.0, 1.0, 60, dtype=torch.float64).pow(4) * 40) @ Q.T
    eig = C.lanczos(lambda v: Hm @ v, 60, k=4, m=60)
    out = C.rayleigh_check(lambda v: Hm @ v, eig.values, eig.vectors, n=3)
    assert len(out["rayleigh"]) == 3
    assert max(out["rel_diff"]) < 1e-10 and max(out["residual"]) < 1e-8


def test_point_probes_on_a_known_quadratic():
    """L(θ) = ½ θᵀHθ, H = Q diag(λ) Qᵀ, θ0 = 0, δ = Q c: with the top-3 basis, f = Σ_{i≤3} c_i² / Σ c_i²,
    h = ½ Σ_{i≤3} λ_i c_i², c = h / (½ λ_1 ||δ||²), floor k/P = 3/40."""
    g = torch.Generator().manual_seed(1)
    P = 40
    Q = torch.linalg.qr(torch.randn(P, P, generator=g, dtype=torch.float64))[0]
    lam = torch.cat([torch.tensor([50.0, 20.0, 10.0]), torch.linspace(1.0, 0.01, P - 3)]).double()
    Hm = Q @ torch.diag(lam) @ Q.T
    eig = C.lanczos(lambda v: Hm @ v, P, k=3, m=P)
    assert torch.allclose(eig.values, lam[:3], rtol=1e-10)
    c = torch.arange(1, P + 1, dtype=torch.float64) / 10
    delta = Q @ c
    out = LI.point_probes(delta, eig)
    f = float(c[:3].pow(2).sum() / c.pow(2).sum())
    h = float(0.5 * (lam[:3] * c[:3].pow(2)).sum())
    assert out["f"] == pytest.approx(f, rel=1e-9) and out["h"] == pytest.approx(h, rel=1e-9)
    assert out["drift"] == pytest.approx(float(c.norm()), rel=1e-12)
    assert out["c"] == pytest.approx(h / (0.5 * 50.0 * float(c.pow(2).sum())), rel=1e-9)
    assert out["f_floor"] == 3 / 40
    # with every direction in the basis, h is the quadratic loss itself and f = 1
    full = C.lanczos(lambda v: Hm @ v, P, k=P, m=P)
    out = LI.point_probes(delta, full)
    assert out["f"] == pytest.approx(1.0, abs=1e-9)
    assert out["h"] == pytest.approx(float(0.5 * delta @ Hm @ delta), rel=1e-8)


def _pt(t, lt, lb, drift=0.0, f=0.0, lb0=2.0):
    return {"t": t, "L_T": lt, "L_B": lb, "dL_B": lb - lb0, "drift": drift, "f": f, "h": 0.0}


def test_curve_deviation_matched_point_and_bifurcation_by_hand():
    ref = [_pt(0, 3.0, 2.0), _pt(1, 2.0, 3.0, 5.0, 1e-3), _pt(2, 1.0, 4.0, 10.0, 1e-3)]
    run = [_pt(0, 3.0, 2.0), _pt(1, 2.5, 2.0), _pt(2, 1.5, 3.0), _pt(3, 0.5, 5.0)]
    # Φ_ref is the reference's own points (already non-increasing): Φ(2.5) = 2.5, Φ(1.5) = 3.5, 0.5 is outside
    assert LI.curve_at([3.0, 2.0, 1.0], [2.0, 3.0, 4.0], [2.5, 1.5, 0.5, 3.0]) == [2.5, 3.5, None, 2.0]
    assert LI.curve_at([1.0, 1.0, 2.0], [1.0, 3.0, 5.0], [1.0, 1.5]) == [2.0, 3.5]  # ties averaged
    dev = LI.curve_deviation(ref, run)
    assert dev["n_in_range"] == 3 and dev["ref_noise"] == 0.0
    assert dev["dev"] == pytest.approx((0 + 0.5 + 0.5) / 3) and dev["dev_signed"] == pytest.approx(-1 / 3)
    assert LI.matched_point(ref, 1.02)["t"] == 2 and LI.matched_point(run, 0.4) is None

    proj = [_pt(0, 3.0, 2.0), _pt(1, 2.0, 2.6, 5.1), _pt(2, 1.01, 3.2, 10.2, 0.0)]
    b = LI.bifurcation({"final": ref[-1], "trajectory": ref}, {"final": proj[-1], "trajectory": proj})
    assert b["dL_T"] == pytest.approx(0.01) and b["drift_ratio"] == pytest.approx(1.02)
    assert b["f_ratio"] == 0.0 and b["broad_gain"] == pytest.approx(0.8)
    assert b["witness"]  # drifts 10 and 10.2 (within 10 %), ΔL_B 2.0 and 1.2 (ratio 1.67 >= 1.5)
    assert b["L_star"] == pytest.approx(1.02) and (b["t_matched_ref"], b["t_matched"]) == (2, 2)
    assert b["gain_matched"] == pytest.approx(0.8) and b["check_7_6"]
    far = [_pt(0, 3.0, 2.0), _pt(1, 1.2, 3.9, 12.0)]  # never reaches L* = 1.02; drift 12 vs 10
    b = LI.bifurcation({"final": ref[-1], "trajectory": ref}, {"final": far[-1], "trajectory": far})
    assert b["gain_matched"] is None and b["t_matched"] is None
    assert not b["witness"] and not b["check_7_6"] and b["drift_ratio"] == pytest.approx(1.2)
    fit = LI.linear_fit([0.0, 1.0, 2.0], [1.0, 3.0, 5.0])
    assert fit == pytest.approx({"intercept": 1.0, "slope": 2.0, "r2": 1.0})


# ---- the command on tiny lock_in runs ----------------------------------------------------------------------------
TINY = [
    "--model.init_args.base.pretrain_steps=20",
    "--model.init_args.base.d_model=32",
    "--model.init_args.base.block_size=32",
    "--data.init_args.block_size=32",
    "--data.init_args.val_windows=32",
    "--model.init_args.curvature.k=4",
    "--model.init_args.curvature.lanczos_iters=10",
    "--model.init_args.curvature.n_cal_windows=32",
    "--model.init_args.eval_every=3",
    "--trainer.max_steps=6",
    "--trainer.enable_progress_bar=false",
]


def _fit_lock_in(tmp_path, run_id, *extra):
    from litlab.__main__ import main

    args = ["fit", "--config", "configs/lock_in/quick.yaml", f"--runs_dir={tmp_path}", f"--run_id={run_id}"]
    assert main(args + TINY + list(extra)) == 0
    return tmp_path / "lock_in" / run_id


def test_analyze_lockin_on_a_plain_and_a_projected_run(tmp_path, monkeypatch):
    from litlab.__main__ import main

    monkeypatch.chdir(ROOT)
    plain = _fit_lock_in(tmp_path, "plain")
    proj = _fit_lock_in(tmp_path, "proj", "--model.init_args.projection=global")
    out = tmp_path / "report"
    assert (
        main(["analyze", "lockin", "--run", str(plain), "--run", f"projected={proj}", "--out", str(out)]) == 0
    )
    res = json.loads((out / "results.json").read_text())
    assert list(res["runs"]) == ["plain", "projected"] and res["reference"] == "plain"
    # one θ0 and one calibration set: one basis, the one the fits cached (k = 4 of the run's plan)
    (basis,) = res["bases"].values()
    assert basis["runs"] == ["plain", "projected"] and basis["source"] == "the run's cached basis"
    assert basis["plan"]["k"] == 4 and len(basis["values"]) == 4
    ck = basis["rayleigh"]
    assert ck["value"] == basis["values"]  # every pair re-checked
    # a Ritz vector's Rayleigh quotient is its Ritz value (float32 vectors: to 1e-4); the fresh residual is the
    # one Lanczos measured
    assert abs(ck["rayleigh"][0] - basis["values"][0]) <= 1e-4 * abs(basis["values"][0])
    assert ck["residual"][0] == pytest.approx(basis["lanczos_residuals"][0], abs=1e-3)
    P = basis["P"]
    for label, folder in (("plain", plain), ("projected", proj)):
        r = res["runs"][label]
        logged = json.loads((folder / "trajectory.json").read_text())["trajectory"]
        assert r["trajectory"] == logged and r["trajectory_source"] == "the checkpoint"
        # the final point recomputed from the checkpoint's weights is the one the fit logged
        for k, v in r["logged_minus_recomputed"].items():
            assert v <= 1e-5 * max(1.0, abs(logged[-1][k])), k
        assert r["final"]["f_floor"] == 4 / P and r["final"]["t"] == 6
    fp, fq = res["runs"]["plain"]["final"], res["runs"]["projected"]["final"]
    assert fp["f"] > 0 and fq["f"] < 1e-6  # projection leaves no stiff energy
    b = res["bifurcation"]["projected"]
    assert b["drift_ratio"] == pytest.approx(fq["drift"] / fp["drift"], rel=1e-12)
    assert b["broad_gain"] == pytest.approx(fp["L_B"] - fq["L_B"], rel=1e-12)
    L_star = 1.02 * fp["L_T"]
    first = [next((p for p in res["runs"][x]["trajectory"] if p["L_T"] <= L_star), None) for x in res["runs"]]
    if None in first:
        assert b["gain_matched"] is None
    else:
        assert b["gain_matched"] == pytest.approx(first[0]["L_B"] - first[1]["L_B"])
    # the pooled fit of L_B on h_t, by hand (normal equations)
    pts = [p for r in res["runs"].values() for p in r["trajectory"]]
    h = torch.tensor([p["h"] for p in pts], dtype=torch.float64)
    y = torch.tensor([p["L_B"] for p in pts], dtype=torch.float64)
    slope = float(((h - h.mean()) * (y - y.mean())).sum() / (h - h.mean()).pow(2).sum())
    fit = res["harm_fit"]
    assert fit["slope"] == pytest.approx(slope, rel=1e-6) and fit["n_points"] == len(pts) == 6
    resid = y - (y.mean() + slope * (h - h.mean()))
    assert fit["r2"] == pytest.approx(1 - float(resid.pow(2).sum() / (y - y.mean()).pow(2).sum()), abs=1e-9)
    report = (out / "report.md").read_text()
    assert "Rayleigh" in report and "§7.6 check" in report
    for name in ("lockin_curves", "lockin_harm", "lockin_stiff", "lockin_spectrum"):
        assert (out / f"{name}.png").stat().st_size > 0


def test_analyze_lockin_rebuilds_theta0_under_the_runs_own_seed(tmp_path, monkeypatch):
    """No hyper-parameter holds the base's seed any more (it is the run seed's backbone stream): the analysis
    rebuilds θ0 under the seed its run was fitted with, whatever seed the analysing process has."""
    from litlab.__main__ import main
    from litlab.lit_modules.analysis import checkpoints

    monkeypatch.chdir(ROOT)
    run = _fit_lock_in(tmp_path, "seed3", "--seed_everything=3")
    assert checkpoints.run_seed_of(run / "checkpoints" / "last.ckpt") == 3
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # another seed in the analysing process
    out = tmp_path / "report"
    assert main(["analyze", "lockin", "--run", str(run), "--out", str(out)]) == 0
    r = json.loads((out / "results.json").read_text())["runs"]["seed3"]
    (basis,) = json.loads((out / "results.json").read_text())["bases"].values()
    assert basis["source"] == "the run's cached basis"  # the same base and Lanczos start as the fit's
    logged = r["trajectory"][-1]
    for k, v in r["logged_minus_recomputed"].items():  # the drift is measured from the fit's own θ0
        assert v <= 1e-5 * max(1.0, abs(logged[k])), k


def test_analyze_lockin_names_what_a_run_folder_lacks(tmp_path, capsys):
    from litlab.__main__ import main

    (tmp_path / "empty").mkdir()
    assert main(["analyze", "lockin", "--run", str(tmp_path / "empty"), "--out", str(tmp_path / "o")]) == 2
    assert "checkpoints/last.ckpt" in capsys.readouterr().err
    assert (
        main(["analyze", "lockin", "--run", "HuggingFaceTB/SmolLM2-135M", "--out", str(tmp_path / "o")]) == 2
    )
    assert "θ0" in capsys.readouterr().err


# ---- on another card's checkpoint (LoKRA: an adapter run; no trajectory, no task domain in its DataModule) ------
def test_analyze_lockin_on_a_lokra_checkpoint(tmp_path, monkeypatch, capsys):
    from litlab.__main__ import main

    monkeypatch.chdir(ROOT)
    args = ["fit", "--config", "configs/lokra/quick.yaml", "--model.init_args.mode=lora", "--run_id=lora"]
    args += [
        "--trainer.max_steps=6",
        "--trainer.limit_val_batches=1",
        "--model.init_args.base.pretrain_steps=20",
    ]
    args += [
        "--model.init_args.warmup_steps=2",
        "--trainer.enable_progress_bar=false",
        f"--runs_dir={tmp_path}",
    ]
    assert main(args) == 0
    run = tmp_path / "lokra" / "lora"
    out = tmp_path / "report"
    small = ["--k", "3", "--lanczos-iters", "8", "--cal-windows", "8", "--windows", "8", "--out", str(out)]
    assert main(["analyze", "lockin", "--run", str(run), *small]) == 2
    assert "--task-domain" in capsys.readouterr().err  # LocalTextDataModule names no task domain
    assert main(["analyze", "lockin", "--run", str(run), "--task-domain", "text", *small]) == 0
    r = json.loads((out / "results.json").read_text())["runs"]["lora"]
    assert r["class"] == "LoKRALanguageModel" and r["trajectory_source"].startswith(
        "θ0 and the final weights"
    )
    assert [p["t"] for p in r["trajectory"]] == [0, 6] and r["logged_minus_recomputed"] is None
    # the drift is the merged adapter update: ||θ_t - θ0||² = Σ over adapted matrices of ||(α/r) B A||²_F
    raw = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    sq = 0.0
    for k, A in raw.items():
        if k.endswith(".branches.default.A"):
            B = raw[k[: -len("A")] + "B"]
            sq += float(((8.0 / 4) * B.double() @ A.double()).pow(2).sum())
    assert r["final"]["drift"] == pytest.approx(math.sqrt(sq), rel=1e-4)
    assert 0.0 <= r["final"]["f"] <= 1.0 and r["final"]["L_T"] > 0
