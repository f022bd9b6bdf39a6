"""Trajectory lock-in in narrow-task fine-tuning (ICML 2026; only the abstract could be read: title, arXiv id, code
and numbers were not found). Everything below the abstract's level is RECONSTRUCTED.

The abstract's claims: the (task loss, broad loss) pairs of fine-tuning runs fall on one shared degradation curve,
and common stabilisers (smaller lr, weight decay, L2-to-init, early stopping, clipping) mostly change the speed
along it ("lock-in"); drift ||θ - θ0|| is a poor proxy of damage ("drift paradox"); an online curvature-based harm
signal tracks how much of the update sits in high-curvature directions; escaping needs a "spectral bifurcation"
that re-orients the update toward soft curvature modes.

Algorithm, as reconstructed (our numbering):
    1. curvature basis at θ0 on broad calibration data: top-k eigenpairs (λ_i, v_i) of H_B by Lanczos
       (``curvature.lanczos`` over ``curvature.hvp``), or layer-wise input covariances A_l = E[a aᵀ]
    2. fine-tune; log (t, L_T, A_T, L_B, d_t = ||θ_t - θ0||) every ``eval_every`` steps
    3. harm signal h_t = ½ Σ_i λ_i (v_iᵀ(θ_t - θ0))²; stiff fraction f_t = ||Sᵀ(θ_t - θ0)||² / ||θ_t - θ0||²;
       curvature share c_t = h_t / (½ λ_1 d_t²)
    4. soft-mode projection after each optimizer step: step ← step - S Sᵀ step (global) or
       dW ← dW - (dW U_r) U_rᵀ (layer-wise, U_r the eigenvectors carrying τ of A_l's energy)
    5. offline: isotonic fit L_B = Φ(L_T) over a run family (pool-adjacent-violators), collapse score R²_T,
       R²_d of L_B on a monotone function of the drift, drift-paradox witnesses, matched-performance comparison,
       Spearman of h with ΔL_B
    probes of the update subspace: erank of dW (p_i = s_i²/Σ s²), stability ||V_tᵀ V_{t-τ}||²_F / k, participation
    ratio of the windowed update stream (Σμ)²/Σμ².

This file holds steps 3-5 and the probes as pure functions, and ``LockInFT`` (steps 1-4 on litlab's tiny LM: task
= the ``math`` domain, broad = held-out docstrings); ``litlab analyze lockin`` runs step 1 and the offline
comparison of saved runs (``point_probes``, ``linear_fit``, ``curve_deviation``, ``bifurcation``, the figures) on
their checkpoints. The layer-wise (K-FAC / input-covariance) basis, EWC, early stopping, LoRA-rank and freezing
stabilisers, and the task accuracy A_T are not built yet.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from litlab.lit_modules.analysis import curvature as C
from litlab.lit_modules.analysis.contract import DomainEvalData, check_data
from litlab.lit_modules.analysis.diffract import TinyBase, lm_losses
from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.core.corpus import CharTokenizer, local_text_corpus
from litlab.lit_modules.core.errors import ConfigError
from litlab.lit_modules.core.hf import load_causal_lm
from litlab.lit_modules.core.io import atomic_path, atomic_write_json, cache_dir
from litlab.lit_modules.core.pretrain import cache_key
from litlab.lit_modules.core.seeding import derive_seed, record_artefact


# ---- 3. harm signal ---------------------------------------------------------------------------------------
def harm_signal(delta: Tensor, values: Tensor, vectors: Tensor) -> float:
    """``h = ½ Σ_i λ_i (v_iᵀ δ)²`` for ``δ = θ_t - θ0`` and the basis ``vectors`` ``[P, k]``."""
    proj = vectors.T.to(delta.dtype) @ delta
    return float(0.5 * (values.to(delta.dtype) * proj.pow(2)).sum())


def stiff_fraction(delta: Tensor, vectors: Tensor) -> float:
    """``f = ||Sᵀ δ||² / ||δ||²`` (0 for δ = 0)."""
    n = float(delta.pow(2).sum())
    return float((vectors.T.to(delta.dtype) @ delta).pow(2).sum()) / n if n > 0 else 0.0


def curvature_share(h: float, lam1: float, drift: float) -> float:
    """``c = h / (½ λ_1 d²)`` (0 for d = 0)."""
    return h / (0.5 * lam1 * drift**2) if drift > 0 and lam1 > 0 else 0.0


# ---- 4. soft-mode projection ------------------------------------------------------------------------------
def project_out(step: Tensor, vectors: Tensor) -> Tensor:
    """``step - S (Sᵀ step)`` (S with orthonormal columns)."""
    return step - vectors @ (vectors.T @ step)


def project_out_damped(step: Tensor, values: Tensor, vectors: Tensor, gamma: float) -> Tensor:
    """``step - S diag(λ_i / (λ_i + γ)) Sᵀ step`` (the soft variant)."""
    return step - vectors @ ((values / (values + gamma)) * (vectors.T @ step))


def energy_basis(A: Tensor, tau: float = 0.9) -> Tensor:
    """Top eigenvectors of the PSD ``A`` whose eigenvalues carry at least ``tau`` of its trace, ``[in, r]``."""
    evals, evecs = torch.linalg.eigh(A.double())
    evals, evecs = evals.flip(0).clamp_min(0), evecs.flip(1)
    cum = torch.cumsum(evals, 0) / evals.sum().clamp_min(1e-300)
    r = int((cum < tau).sum()) + 1
    return evecs[:, : min(r, A.shape[0])]


def project_layer(dW: Tensor, U: Tensor) -> Tensor:
    """``dW - (dW U_r) U_rᵀ`` for an ``[out, in]`` update and the input basis ``U_r`` ``[in, r]``."""
    U = U.to(dW.dtype)
    return dW - (dW @ U) @ U.T


# ---- 5. collapse, paradox, rank statistics ---------------------------------------------------------------
def isotonic_decreasing(x: Sequence[float], y: Sequence[float]) -> Tensor:
    """Least-squares fit ``ŷ`` non-increasing in ``x`` (pool-adjacent-violators), in the input order."""
    x, y = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)
    order = torch.argsort(x, stable=True)
    vals, weights = [], []
    for v in (-y[order]).tolist():  # increasing fit of -y
        vals.append(v)
        weights.append(1.0)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            w = weights[-2] + weights[-1]
            v = (vals[-2] * weights[-2] + vals[-1] * weights[-1]) / w
            vals[-2:], weights[-2:] = [v], [w]
    fit = torch.cat([torch.full((int(w),), -v, dtype=torch.float64) for v, w in zip(vals, weights)])
    out = torch.empty_like(fit)
    out[order] = fit
    return out


def isotonic_increasing(x: Sequence[float], y: Sequence[float]) -> Tensor:
    return -isotonic_decreasing(x, [-v for v in y])


def r2(y: Sequence[float], fit: Sequence[float]) -> float:
    y, fit = torch.as_tensor(y, dtype=torch.float64), torch.as_tensor(fit, dtype=torch.float64)
    ss_tot = float((y - y.mean()).pow(2).sum())
    return 1.0 - float((y - fit).pow(2).sum()) / ss_tot if ss_tot > 0 else 1.0


def collapse_r2(task_loss: Sequence[float], broad_loss: Sequence[float]) -> float:
    """``R²_T``: broad loss explained by one non-increasing curve of the task loss (pooled over runs)."""
    return r2(broad_loss, isotonic_decreasing(task_loss, broad_loss))


def drift_r2(drift: Sequence[float], broad_loss: Sequence[float]) -> float:
    """``R²_d``: broad loss explained by one non-decreasing curve of the drift."""
    return r2(broad_loss, isotonic_increasing(drift, broad_loss))


def paradox_witnesses(
    drift: Sequence[float], dLB: Sequence[float], tol: float = 0.1, ratio: float = 1.5
) -> list[tuple[int, int]]:
    """Pairs ``(a, b)`` with ``|d_a - d_b| <= tol · mean(d_a, d_b)`` and ``max/min`` of ``ΔL_B`` at least ``ratio``
    (both increases positive)."""
    out = []
    for a in range(len(drift)):
        for b in range(a + 1, len(drift)):
            da, db = drift[a], drift[b]
            if abs(da - db) <= tol * 0.5 * (da + db) and min(dLB[a], dLB[b]) > 0:
                if max(dLB[a], dLB[b]) / min(dLB[a], dLB[b]) >= ratio:
                    out.append((a, b))
    return out


def _ranks(x: Sequence[float]) -> Tensor:
    x = torch.as_tensor(x, dtype=torch.float64)
    order = torch.argsort(x, stable=True)
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=torch.float64)
    for v in torch.unique(x):  # average ranks of ties
        m = x == v
        ranks[m] = ranks[m].mean()
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / (rx.norm() * ry.norm()))


# ---- offline comparison of saved runs (``litlab analyze lockin``) ---------------------------------------------
def point_probes(delta: Tensor, eig: C.Eigen) -> dict[str, float]:
    """Step 3 at one point, for ``delta = θ_t - θ0`` (float64; subtract in the parameters' dtype first, as the
    module does): drift ``d``, harm ``h``, stiff fraction ``f``, curvature share ``c``, and ``f_floor = k / P``, the
    expected ``f`` of a direction drawn uniformly at random (the scale ``f`` is read against)."""
    V = eig.vectors.double()
    d = float(delta.norm())
    h = harm_signal(delta, eig.values, V)
    return {
        "drift": d,
        "h": h,
        "f": stiff_fraction(delta, V),
        "c": curvature_share(h, float(eig.values[0]), d),
        "f_floor": V.shape[1] / V.shape[0],
    }


def linear_fit(x: Sequence[float], y: Sequence[float]) -> dict[str, float]:
    """Least squares ``y = intercept + slope · x`` and its ``r2``."""
    X = torch.stack([torch.ones(len(x), dtype=torch.float64), torch.as_tensor(x, dtype=torch.float64)], 1)
    yv = torch.as_tensor(y, dtype=torch.float64)
    coef = torch.linalg.lstsq(X, yv[:, None]).solution
    return {
        "intercept": float(coef[0, 0]),
        "slope": float(coef[1, 0]),
        "r2": r2(yv.tolist(), (X @ coef)[:, 0].tolist()),
    }


def curve_at(x_fit: Sequence[float], y_fit: Sequence[float], x: Sequence[float]) -> list[float | None]:
    """A fitted curve given by its points ``(x_fit, y_fit)`` (tied ``x`` averaged), linearly interpolated at each
    ``x``; None outside ``[min x_fit, max x_fit]`` (no extrapolation)."""
    xs, ys = torch.as_tensor(x_fit, dtype=torch.float64), torch.as_tensor(y_fit, dtype=torch.float64)
    ux, inv = torch.unique(xs, sorted=True, return_inverse=True)
    uy = torch.zeros_like(ux).index_add_(0, inv, ys) / torch.bincount(inv, minlength=len(ux)).double()
    out: list[float | None] = []
    for v in x:
        if not float(ux[0]) <= v <= float(ux[-1]):
            out.append(None)
            continue
        j = min(int(torch.searchsorted(ux, torch.tensor(v, dtype=torch.float64), right=True)), len(ux) - 1)
        i = max(j - 1, 0)
        x0, x1, y0, y1 = float(ux[i]), float(ux[j]), float(uy[i]), float(uy[j])
        out.append(y0 if x1 == x0 else y0 + (y1 - y0) * (v - x0) / (x1 - x0))
    return out


def curve_deviation(reference: Sequence[dict], run: Sequence[dict]) -> dict[str, float | int | None]:
    """How far a run's ``(L_T, L_B)`` points sit from the reference run's own degradation curve ``Φ_ref`` (the
    isotonic fit of the reference's points, interpolated between them): over the run's points whose ``L_T`` lies in
    the reference's range (``n_in_range``), ``dev = mean |L_B - Φ_ref(L_T)|`` and ``dev_signed`` (negative: lower
    broad loss than the reference at the same task loss); ``ref_noise`` = the reference's own mean residual
    ``|L_B - Φ_ref(L_T)|``, the scale a departure from the curve is read against."""
    lt, lb = [p["L_T"] for p in reference], [p["L_B"] for p in reference]
    fit = isotonic_decreasing(lt, lb)
    noise = float((torch.as_tensor(lb, dtype=torch.float64) - fit).abs().mean())
    phi = curve_at(lt, fit.tolist(), [p["L_T"] for p in run])
    dev = [p["L_B"] - v for p, v in zip(run, phi) if v is not None]
    return {
        "n_in_range": len(dev),
        "dev": sum(abs(d) for d in dev) / len(dev) if dev else None,
        "dev_signed": sum(dev) / len(dev) if dev else None,
        "ref_noise": noise,
    }


def matched_point(trajectory: Sequence[dict], target: float) -> dict | None:
    """The first point with ``L_T <= target`` (the matched-performance point), or None."""
    return next((p for p in trajectory if p["L_T"] <= target), None)


def broad_loss_at_task_loss(trajectory: Sequence[dict], target: float) -> float | None:
    """The degradation curve read at one task loss: ``L_B`` where the run's task loss first falls to ``target``,
    linear in ``L_T`` between the last point above it and the first at or below it (θ0's own ``L_B`` if it starts
    there); None if the run never gets there. Under lock-in every stabiliser gives the same value (one curve,
    another speed); a run on another branch (rehearsal of the broad data, say) does not."""
    for i, p in enumerate(trajectory):
        if p["L_T"] <= target:
            if i == 0:
                return float(p["L_B"])
            a = trajectory[i - 1]
            w = (a["L_T"] - target) / (a["L_T"] - p["L_T"])
            return float(a["L_B"] + w * (p["L_B"] - a["L_B"]))
    return None


# the reconstruction's bifurcation test (spec §7.6): equal task loss, equal drift, broad loss lower by a margin
BIFURCATION_TASK_TOL, BIFURCATION_DRIFT = 0.05, (0.95, 1.05)
BIFURCATION_MARGIN = 0.3


def bifurcation(
    reference: dict, run: dict, matched_rel: float = 0.02, tol: float = 0.1, ratio: float = 1.5
) -> dict[str, float | bool | None]:
    """The spectral-bifurcation comparison of ``run`` against ``reference`` (each ``{"final": point, "trajectory":
    points}``, points with ``L_T, L_B, dL_B, drift, f``): final differences (``dL_T``, ``drift_ratio``, ``f_ratio``,
    ``broad_gain = L_B(ref) - L_B(run)``); the drift-paradox witness of the two final points; the run's departure
    from the reference's curve (``curve_deviation``); the matched-performance comparison at
    ``L* = (1 + matched_rel) · L_T(ref, final)`` (``gain_matched`` = ``L_B`` of the reference minus the run's, at
    each one's first point with ``L_T <= L*``; None if one never gets there); ``check_7_6``: ``|dL_T| < 0.05``, drift
    ratio in [0.95, 1.05] and ``broad_gain >= 0.3``."""
    a, b = reference["final"], run["final"]
    out: dict[str, float | bool | None] = {
        "dL_T": b["L_T"] - a["L_T"],
        "drift_ratio": b["drift"] / a["drift"] if a["drift"] > 0 else None,
        "f_ratio": b["f"] / a["f"] if a["f"] > 0 else None,
        "broad_gain": a["L_B"] - b["L_B"],
        "witness": bool(paradox_witnesses([a["drift"], b["drift"]], [a["dL_B"], b["dL_B"]], tol, ratio)),
    }
    out.update(curve_deviation(reference["trajectory"], run["trajectory"]))
    target = (1 + matched_rel) * a["L_T"]
    pa, pb = matched_point(reference["trajectory"], target), matched_point(run["trajectory"], target)
    out["L_star"] = target
    out["t_matched_ref"], out["t_matched"] = (pa or {}).get("t"), (pb or {}).get("t")
    out["gain_matched"] = pa["L_B"] - pb["L_B"] if pa and pb else None
    lo, hi = BIFURCATION_DRIFT
    out["check_7_6"] = bool(
        abs(out["dL_T"]) < BIFURCATION_TASK_TOL
        and out["drift_ratio"] is not None
        and lo <= out["drift_ratio"] <= hi
        and out["broad_gain"] >= BIFURCATION_MARGIN
    )
    return out


def write_analysis_figures(
    runs: Mapping[str, dict], spectra: Mapping[str, dict], harm_fit: Mapping[str, float], out_dir: Path
) -> list[Path]:
    """The report figures of ``litlab analyze lockin`` (spec §5 plots 1-5): ``lockin_curves.png`` (L_B vs L_T with
    the reference's isotonic curve; L_B vs drift), ``lockin_harm.png`` (L_B vs h_t with the pooled linear fit; h_t
    over steps), ``lockin_stiff.png`` (f_t over steps against the random floor k/P) and ``lockin_spectrum.png``
    (Ritz values at θ0 with the Rayleigh quotients of the re-checked pairs). ``runs``: label → ``{"trajectory",
    "final"}``, the first is the reference; ``spectra``: basis name → ``{"ritz_all", "rayleigh"}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    labels = list(runs)
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for label in labels:
        tr = runs[label]["trajectory"]
        ax[0].plot([p["L_T"] for p in tr], [p["L_B"] for p in tr], marker=".", label=label)
        ax[1].plot([p["drift"] for p in tr], [p["L_B"] for p in tr], marker=".", label=label)
    ref = runs[labels[0]]["trajectory"]
    fit = isotonic_decreasing([p["L_T"] for p in ref], [p["L_B"] for p in ref]).tolist()
    pts = sorted(zip([p["L_T"] for p in ref], fit))
    ax[0].plot([x for x, _ in pts], [y for _, y in pts], "k--", lw=0.8, label=f"Φ of {labels[0]} (isotonic)")
    ax[0].set(xlabel="task loss L_T", ylabel="broad loss L_B", title="degradation curves")
    ax[0].invert_xaxis()
    ax[1].set(xlabel="drift ||θ - θ0||", ylabel="L_B", title="broad loss against drift")
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "lockin_curves.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    hs = []
    for label in labels:
        tr = runs[label]["trajectory"]
        hs += [p["h"] for p in tr]
        ax[0].scatter([p["h"] for p in tr], [p["L_B"] for p in tr], s=12, label=label)
        ax[1].plot([p["t"] for p in tr], [p["h"] for p in tr], marker=".", label=label)
    if hs and harm_fit:
        xs = [min(hs), max(hs)]
        ax[0].plot(xs, [harm_fit["intercept"] + harm_fit["slope"] * x for x in xs], "k--", lw=0.8)
        ax[0].set_title(
            f"L_B = {harm_fit['intercept']:.3g} + {harm_fit['slope']:.3g} h   (R² {harm_fit['r2']:.3f})"
        )
    ax[0].set(xlabel="harm signal h_t", ylabel="L_B")
    ax[1].set(xlabel="step t", ylabel="h_t", title="harm signal")
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "lockin_harm.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for label in labels:
        tr = runs[label]["trajectory"]
        ax.plot([p["t"] for p in tr], [p["f"] for p in tr], marker=".", label=label)
    floor = runs[labels[0]]["final"]["f_floor"]
    ax.axhline(floor, color="grey", ls=":", lw=0.8, label="random floor k/P")
    ax.set_yscale("symlog", linthresh=max(floor / 10, 1e-12))
    ax.set(xlabel="step t", ylabel="stiff-mode fraction f_t", title="stiff-mode energy (bifurcation: f → 0)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "lockin_stiff.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for name, sp in spectra.items():
        ritz = sp["ritz_all"]
        ax.plot(range(1, len(ritz) + 1), ritz, marker=".", lw=0.8, label=f"{name}: Ritz values")
        q = sp["rayleigh"]["rayleigh"]
        ax.scatter(range(1, len(q) + 1), q, marker="x", s=30, label=f"{name}: Rayleigh quotients")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set(
        xlabel="index i", ylabel="λ_i of the broad-loss Hessian at θ0", title="curvature spectrum (Lanczos)"
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out_dir / "lockin_spectrum.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


# ---- probes of the update subspace --------------------------------------------------------------------------
def erank_energy(dW: Tensor) -> float:
    """``exp(H(p))`` with ``p_i = s_i² / Σ s²`` (0 for dW = 0)."""
    s2 = torch.linalg.svdvals(dW.double()).pow(2)
    if float(s2.sum()) == 0:
        return 0.0
    p = s2 / s2.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def subspace_stability(V_now: Tensor, V_before: Tensor) -> float:
    """``||V_tᵀ V_{t-τ}||²_F / k``."""
    k = V_now.shape[1]
    return float((V_now.T @ V_before).pow(2).sum() / k)


def participation_ratio(steps: Tensor) -> float:
    """``(Σ μ)² / Σ μ²`` of the eigenvalues ``μ`` of the Gram matrix of the step vectors ``[w, P]``."""
    mu = torch.linalg.eigvalsh(steps.double() @ steps.double().T).clamp_min(0)
    return float(mu.sum() ** 2 / mu.pow(2).sum()) if float(mu.pow(2).sum()) > 0 else 0.0


# ---- the fine-tuning module (reconstructed protocol of the spec's CPU experiment) ---------------------------
@config_part
class Stabilizer:
    """What varies between the runs of a family: ``lr``, AdamW ``weight_decay``, ``l2sp`` λ of the penalty
    ``λ/2 ||θ - θ0||²`` (L2-SP, Li et al. 2018). Clipping is the Trainer's ``gradient_clip_val``."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    l2sp: float = 0.0


@config_part
class CurvatureBasisPlan:
    """The broad-loss Hessian basis at θ0: top-``k`` Lanczos pairs from ``lanczos_iters`` steps over
    ``n_cal_windows`` fixed broad windows (the start vector from the run's ``curvature`` stream); cached per base."""

    k: int = 20
    lanczos_iters: int = 50
    n_cal_windows: int = 64


def calibration_batches(general: Mapping[str, Tensor], n_windows: int, batch_size: int = 32) -> list[dict]:
    """The calibration set C_B: the first ``n_windows`` broad windows, in batches of ``batch_size``."""
    cal = {k: v[:n_windows] for k, v in general.items()}
    n = cal["input_ids"].shape[0]
    return [{k: v[i : i + batch_size] for k, v in cal.items()} for i in range(0, n, batch_size)]


def broad_hessian_basis(
    model: nn.Module,
    batches: Sequence[Mapping[str, Tensor]],
    plan: CurvatureBasisPlan,
    seed: int,
    flat: C.FlatParams | None = None,
    theta0: Tensor | None = None,
    fixed: Mapping[str, Tensor] | None = None,
) -> C.Eigen:
    """Step 1: the top-``plan.k`` Lanczos pairs (``plan.lanczos_iters`` steps, start vector from ``seed``) of
    the Hessian of the mean next-token CE over ``batches`` at ``theta0`` (default: the model's own parameters,
    flattened over ``named_parameters()``), in eval mode and on one thread (the basis must not depend on the
    process's thread count); vectors in float32. ``fixed``: the tensors outside ``flat`` (default the model's
    buffers, its other parameters as they are)."""
    params = dict(model.named_parameters())
    flat = flat if flat is not None else C.FlatParams.of(params)
    if theta0 is None:
        theta0 = flat.flatten({k: v.detach() for k, v in params.items()})
    f = C.lm_loss_fn(model, batches, flat, dict(model.named_buffers()) if fixed is None else fixed)
    was, threads = model.training, torch.get_num_threads()
    model.eval()
    torch.set_num_threads(1)  # the cached artifact must not depend on the process's thread count
    try:
        hessian = C.hessian_operator(f, theta0)
        # the Lanczos vectors stay on the CPU (k copies of the parameters); each product runs where θ0 is
        matvec = hessian if theta0.device.type == "cpu" else lambda v: hessian(v.to(theta0.device)).cpu()
        eig = C.lanczos(matvec, flat.size, plan.k, plan.lanczos_iters, seed)
    finally:
        torch.set_num_threads(threads)
        model.train(was)
    return C.Eigen(eig.values, eig.vectors.float(), eig.residuals, eig.ritz_all)


def basis_cache_path(base: TinyBase, plan: CurvatureBasisPlan, base_seed: int, lanczos_seed: int) -> Path:
    """Where ``LockInFT`` caches the basis of a tiny base (keyed by the base recipe and its seed, the plan and the
    Lanczos start vector's seed)."""
    key = cache_key(
        {
            "base": dataclasses.asdict(base),
            "base_seed": base_seed,
            "curv": dataclasses.asdict(plan),
            "lanczos_seed": lanczos_seed,
        }
    )
    return cache_dir() / f"lockin_basis-{key}.pt"


def load_basis(path: Path) -> C.Eigen | None:
    if not path.exists():
        return None
    d = torch.load(path, weights_only=True)
    return C.Eigen(d["values"], d["vectors"], d["residuals"], d["ritz_all"])


def save_basis(eig: C.Eigen, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(dataclasses.asdict(eig), tmp)


@cache
def pretraining_ids() -> Tensor:
    """The characters of the tiny base's pre-training text, the first half of the local corpus (as
    ``core.pretrain.pretrained_tiny_gpt(split="first_half")`` reads it): the rehearsal data, apart from the broad
    evaluation windows (held out at the end of the other half, ``DomainCorpusDataModule``'s ``text`` domain)."""
    ids = CharTokenizer().encode(local_text_corpus())
    return ids[: len(ids) // 2]


LOCKIN_BASE = TinyBase(heads=4)
STABILIZER = Stabilizer()
CURVATURE = CurvatureBasisPlan()


class LockInFT(L.LightningModule):
    """Narrow-task fine-tuning of a pre-trained tiny LM with the lock-in probes: every ``eval_every`` steps the
    task loss L_T and broad loss L_B on fixed windows, the drift d_t, the harm signal h_t and the stiff fraction
    f_t against the broad-loss Hessian basis at θ0 (``lockin/*``; the whole trajectory in
    ``<run>/trajectory.json``). ``projection="global"`` removes the stiff-basis component of every optimizer step
    (the reconstructed "spectral bifurcation"). Data: a ``DomainEvalData`` module (task = its ``domain``, broad =
    its ``general_domain``).

    ``backbone="tiny_gpt"`` builds θ0 from ``base`` (cached, with its basis); any other value is a Hugging Face causal
    LM id or folder in ``dtype`` (``core.hf.load_causal_lm``; offline it stops at once naming it), e.g. the full
    scale's Qwen2.5-0.5B narrow-tuned on GSM8K (answer-only labels) with fineweb-edu as the broad distribution
    (``datamodules.hub_corpus.HubCorpusDataModule``). At that size the global basis covers the parameters matching
    the regex ``curvature_params`` only (the Lanczos vectors are ``k`` copies of it): h_t, f_t and the projection
    act on that subset, the drift d_t on every parameter. The spec's layer-wise K-FAC basis for > 1B models is
    not built. A Hugging Face backbone's basis is computed at θ0 in every fit (a resumed one too), not cached.

    The card's controls: ``rehearsal`` adds ``rehearsal`` times the LM loss of a batch of the base's own
    pre-training text (``pretraining_ids``, windows from the run's ``rehearsal`` stream) to every step's task loss:
    > 0 is rehearsal (replay of the broad data, a run known to land on a lower degradation curve), < 0 unlearns it
    (a run known to land on a higher one). ``match_task_loss`` (L*): at the end of the fit the curve is read there,
    ``lockin/L_B_matched`` (``broad_loss_at_task_loss``; not logged when the run never reaches L*)."""

    def __init__(
        self,
        base: TinyBase = LOCKIN_BASE,
        stabilizer: Stabilizer = STABILIZER,
        projection: Literal["none", "global"] = "none",
        curvature: CurvatureBasisPlan = CURVATURE,
        eval_every: int = 15,
        backbone: str = "tiny_gpt",
        dtype: str = "float32",
        curvature_params: str | None = None,
        rehearsal: float = 0.0,
        match_task_loss: float | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if projection not in ("none", "global"):
            raise ValueError(f"projection must be 'none' or 'global', got {projection!r}")
        if rehearsal and backbone != "tiny_gpt":
            raise ConfigError(
                f"rehearsal={rehearsal} replays the tiny base's pre-training text; backbone={backbone!r} has none "
                "here (rehearsal is the quick scale's control)"
            )
        self.base_cfg, self.stab, self.curv, self.projection = base, stabilizer, curvature, projection
        if backbone == "tiny_gpt":
            self.model = base.pretrained()
        else:  # a Hugging Face id or folder; fails at once offline naming what to download
            self.model = load_causal_lm(backbone, dtype=dtype).train()
        params = dict(self.model.named_parameters())
        self.flat_all = C.FlatParams.of(params)  # every parameter: the drift, L2-SP
        self.theta0_all = self.flat_all.flatten({k: v.detach() for k, v in params.items()}).clone()
        if curvature_params is None:
            self.flat, self.theta0 = self.flat_all, self.theta0_all
        else:  # the parameters the curvature basis covers (h_t, f_t, the projection)
            names = [n for n in params if re.search(curvature_params, n)]
            if not names:
                raise ConfigError(
                    f"curvature_params={curvature_params!r} matches no parameter of {backbone!r} (names look like "
                    f"{list(params)[:3]})"
                )
            self.flat = C.FlatParams.of(params, names)
            self.theta0 = self.flat.flatten({n: params[n].detach() for n in names}).clone()
        self.basis: C.Eigen | None = None
        self.trajectory: list[dict] = []

    # -- curvature basis at θ0 (cached per base, plan and start vector) --
    def curvature_basis(self) -> C.Eigen:
        if self.basis is not None:
            return self.basis
        lanczos_seed = derive_seed("curvature")
        if self.hparams.backbone != "tiny_gpt":
            self.basis = self._hf_basis(lanczos_seed)
            return self.basis
        path = basis_cache_path(self.base_cfg, self.curv, derive_seed("backbone"), lanczos_seed)
        record_artefact("curvature_basis", path.stem)  # the cache key names the base, the plan and the seeds
        self.basis = load_basis(path)
        if self.basis is not None:
            return self.basis
        batches = calibration_batches(self.trainer.datamodule.eval_set("general"), self.curv.n_cal_windows)
        eig = broad_hessian_basis(self.model, batches, self.curv, lanczos_seed, self.flat, self.theta0)
        save_basis(eig, path)
        self.basis = eig
        return eig

    def _hf_basis(self, lanczos_seed: int) -> C.Eigen:
        """The basis of a Hugging Face backbone at θ0 (the parameters outside ``curvature_params`` at θ0 too, whatever
        the model holds now), on the model's device; kept on the CPU."""
        device = next(self.model.parameters()).device
        cal = calibration_batches(self.trainer.datamodule.eval_set("general"), self.curv.n_cal_windows)
        batches = [{k: v.to(device) for k, v in b.items()} for b in cal]
        fixed = {**dict(self.model.named_buffers()), **self.flat_all.unflatten(self.theta0_all.to(device))}
        eig = broad_hessian_basis(
            self.model, batches, self.curv, lanczos_seed, self.flat, self.theta0.to(device), fixed
        )
        return C.Eigen(eig.values.cpu(), eig.vectors.cpu(), eig.residuals.cpu(), eig.ritz_all.cpu())

    def setup(self, stage: str) -> None:
        check_data(self.trainer.datamodule, DomainEvalData, type(self).__name__)

    def on_fit_start(self) -> None:
        if self.trainer.fast_dev_run:  # a smoke run (one step): no curvature basis, no probes
            return
        self.curvature_basis()
        if self.global_step == 0 and not self.trajectory:
            self._record()

    def _theta(self) -> Tensor:
        return self.flat.flatten({k: self.model.get_parameter(k).detach().cpu() for k in self.flat.names})

    @torch.no_grad()
    def _record(self) -> dict:
        dm, eig = self.trainer.datamodule, self.curvature_basis()
        was = self.model.training
        self.model.eval()
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        lt = float(lm_losses(self.model, state, dm.eval_set("domain")).mean())
        lb = float(lm_losses(self.model, state, dm.eval_set("general")).mean())
        self.model.train(was)
        delta = (self._theta() - self.theta0).double()
        d = float(delta.norm())
        if self.flat is not self.flat_all:  # the basis covers a subset; the drift counts every parameter
            theta = self.flat_all.flatten({k: v.detach().cpu() for k, v in self.model.named_parameters()})
            d = float((theta - self.theta0_all).double().norm())
        h = harm_signal(delta, eig.values, eig.vectors.double())
        point = {
            "t": self.global_step,
            "L_T": lt,
            "L_B": lb,
            "drift": d,
            "h": h,
            "f": stiff_fraction(delta, eig.vectors.double()),
            "c": curvature_share(h, float(eig.values[0]), d),
        }
        if self.trajectory:
            point["dL_B"] = lb - self.trajectory[0]["L_B"]
        else:
            point["dL_B"] = 0.0
        self.trajectory.append(point)
        return point

    # the trajectory so far travels in the checkpoint: a resumed fit logs the same ΔL_B (relative to t = 0)
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["lock_in_trajectory"] = list(self.trajectory)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.trajectory = list(checkpoint.get("lock_in_trajectory", []))

    def training_step(self, batch, batch_idx: int) -> Tensor:
        logits = self.model(batch["input_ids"])
        logits = logits if isinstance(logits, Tensor) else logits.logits  # a Hugging Face model's output
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())  # -100: not a task token
        self.log("train/loss_task", loss, prog_bar=True)
        if self.hparams.rehearsal:
            broad = self._rehearsal_loss(*batch["input_ids"].shape)
            self.log("train/loss_rehearsal", broad)
            loss = loss + self.hparams.rehearsal * broad
        if self.stab.l2sp > 0:
            theta = torch.cat([p.reshape(-1) for p in self.model.parameters()])
            loss = loss + 0.5 * self.stab.l2sp * (theta - self.theta0_all.to(theta.device)).pow(2).sum()
        return loss

    def _rehearsal_loss(self, batch_size: int, block: int) -> Tensor:
        """The LM loss of ``batch_size`` random pre-training windows; the windows of step t are drawn from the
        run's ``rehearsal`` stream and t, so a resumed fit replays the same ones."""
        ids = pretraining_ids()
        gen = torch.Generator().manual_seed(derive_seed("rehearsal") + self.global_step)
        starts = torch.randint(0, len(ids) - block - 1, (batch_size, 1), generator=gen)
        windows = ids[starts + torch.arange(block + 1)].to(self.device)
        logits = self.model(windows[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())

    def validation_step(self, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        """The DataModule's validation loaders, task (0) and broad (1): ``val/loss_task``, ``val/loss_broad``."""
        logits = self.model(batch["input_ids"])
        logits = logits if isinstance(logits, Tensor) else logits.logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())
        self.log("val/loss_task" if dataloader_idx == 0 else "val/loss_broad", loss, add_dataloader_idx=False)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None) -> None:
        if self.projection == "none":
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        prev = self._theta()
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        S = self.curvature_basis().vectors
        step = project_out(self._theta() - prev, S)  # step ← step - S Sᵀ step, after the optimizer's own step
        with torch.no_grad():
            for name, t in self.flat.unflatten(prev + step).items():
                self.model.get_parameter(name).copy_(t)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        t = self.trainer
        if t.fast_dev_run:
            return
        last = t.max_steps is not None and 0 < t.max_steps <= self.global_step
        if self.global_step % self.hparams.eval_every == 0 or last:
            point = self._record()
            for k in ("L_T", "L_B", "dL_B", "drift", "h", "f", "c"):
                self.log(f"lockin/{k}", float(point[k]), on_step=True, on_epoch=False)
        target = self.hparams.match_task_loss
        matched = broad_loss_at_task_loss(self.trajectory, target) if last and target is not None else None
        if matched is not None:
            self.log("lockin/L_B_matched", matched, on_step=True, on_epoch=False)
        if last and t.is_global_zero:
            eig = self.curvature_basis()
            atomic_write_json(
                Path(t.default_root_dir) / "trajectory.json",
                {
                    "trajectory": self.trajectory,
                    "ritz_top": eig.values.tolist(),
                    "residuals": eig.residuals.tolist(),
                    "stabilizer": dataclasses.asdict(self.stab),
                    "projection": self.projection,
                    "rehearsal": self.hparams.rehearsal,
                    "match_task_loss": target,
                    "L_B_matched": matched,
                },
            )

    def configure_optimizers(self):
        return torch.optim.AdamW(
            self.model.parameters(), lr=self.stab.lr, betas=(0.9, 0.95), weight_decay=self.stab.weight_decay
        )


# ---- the card's report hook -----------------------------------------------------------------------------------
def _linear_r2(x: Sequence[float], y: Sequence[float]) -> float:
    return linear_fit(x, y)["r2"]


def _points(runs: Sequence[Mapping]) -> list[dict]:
    return [p for r in runs for p in r["trajectory"]]


def lock_in_statistics(runs: Sequence[Mapping]) -> dict[str, float]:
    """The statistics of one seed's runs, each as its ``trajectory.json`` holds it (``{"stabilizer": {lr,
    weight_decay, l2sp}, "projection", "trajectory"}``), classified by what they ran, not by their names: the
    *standard* runs are the unprojected ones without rehearsal (the stabilisers; a rehearsal or unlearning run is a
    control), the *lr-only* runs those of them without L2-SP or weight decay. Collapse R²_T and drift R²_d pooled over the standard runs, R²_T over the lr-only ones; Spearman
    of final h with final ΔL_B over the standard runs; linear R² of L_B on h_t pooled over their (run, t) points;
    and for a projected run, against the standard run of the same stabiliser: the drift ratio projected / plain and
    whether their two final points are a drift-paradox witness."""
    standard = [r for r in runs if r["projection"] == "none" and not r.get("rehearsal", 0.0)]
    lr_only = [r for r in standard if not r["stabilizer"]["l2sp"] and not r["stabilizer"]["weight_decay"]]
    pts, lr_pts = _points(standard), _points(lr_only)
    finals = [r["trajectory"][-1] for r in standard]
    out = {
        "collapse_r2": collapse_r2([p["L_T"] for p in pts], [p["L_B"] for p in pts]),
        "collapse_r2_lr_only": collapse_r2([p["L_T"] for p in lr_pts], [p["L_B"] for p in lr_pts]),
        "drift_r2": drift_r2([p["drift"] for p in pts], [p["L_B"] for p in pts]),
        "harm_spearman": spearman([f["h"] for f in finals], [f["dL_B"] for f in finals]),
        "harm_r2": _linear_r2([p["h"] for p in pts], [p["L_B"] for p in pts]),
    }
    projected = [r for r in runs if r["projection"] != "none"]
    if len(projected) > 1:
        raise ValueError(f"one projected run per seed, got {len(projected)}")
    if projected:
        plain = [r for r in standard if r["stabilizer"] == projected[0]["stabilizer"]]
        if len(plain) != 1:
            raise ValueError(
                f"the projected run ({projected[0]['stabilizer']}) needs exactly one unprojected run with the "
                f"same stabiliser to be compared with, got {len(plain)}"
            )
        a, b = plain[0]["trajectory"][-1], projected[0]["trajectory"][-1]
        out["drift_ratio"] = b["drift"] / a["drift"]
        out["final_witness"] = float(
            bool(paradox_witnesses([a["drift"], b["drift"]], [a["dL_B"], b["dL_B"]]))
        )
    return out


def setting_label(run: Mapping) -> str:
    """What a run ran, for a legend: ``lr 0.001``, ``lr 0.001, L2-SP 0.05``, ``lr 0.001, projected``, ``lr 0.001,
    rehearsal -0.1``."""
    stab = run["stabilizer"]
    parts = [f"lr {stab['lr']:g}"]
    parts += [f"L2-SP {stab['l2sp']:g}"] if stab["l2sp"] else []
    parts += [f"wd {stab['weight_decay']:g}"] if stab["weight_decay"] else []
    parts += ["projected"] if run["projection"] != "none" else []
    parts += [f"rehearsal {run['rehearsal']:g}"] if run.get("rehearsal") else []
    return ", ".join(parts)


def report(result, out_dir):
    """``report_hook`` of seeds/lock_in.yaml: ``lock_in_statistics`` per seed over every run that wrote a
    ``trajectory.json`` (its stabiliser and projection say what it is; the card's run names are not read):
    ``derived.<name>_min`` and ``_max`` over seeds, ``final_witness_seeds``, a per-seed table and the trajectories
    of the first seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from litlab.lit_modules.core.results import ReportExtras

    by_seed: dict[int, list[dict]] = {seed: [] for seed in result.seeds}
    for _, run in result.distinct_runs():
        for seed_run in run.runs:
            path = Path(seed_run.run_dir) / "trajectory.json"
            if path.exists():
                by_seed[seed_run.seed].append(json.loads(path.read_text()))
    per_seed = [lock_in_statistics(by_seed[seed]) for seed in result.seeds]
    numbers = {}
    for key in per_seed[0]:
        vals = [s[key] for s in per_seed]
        numbers[f"{key}_min"], numbers[f"{key}_max"] = min(vals), max(vals)
    numbers["final_witness_seeds"] = sum(s.get("final_witness", 0.0) for s in per_seed)
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for run in by_seed[result.seeds[0]]:
        tr, label = run["trajectory"], setting_label(run)
        ax[0].plot([p["L_T"] for p in tr], [p["L_B"] for p in tr], marker=".", label=label)
        ax[1].plot([p["drift"] for p in tr], [p["L_B"] for p in tr], marker=".", label=label)
    targets = {r.get("match_task_loss") for r in by_seed[result.seeds[0]]} - {None}
    for target in targets:  # where the card reads the curve (lockin/L_B_matched)
        ax[0].axvline(target, color="grey", linestyle=":", label=f"L* = {target:g}")
    ax[0].set(
        xlabel="task loss L_T (math)", ylabel="broad loss L_B (docstrings)", title=f"seed {result.seeds[0]}"
    )
    ax[1].set(xlabel="drift ||θ - θ0||", ylabel="L_B", title="drift paradox")
    # the unlearning floor's broad loss runs off to ~30 nats: the axes show the other runs' range
    kept = [
        p["L_B"] for r in by_seed[result.seeds[0]] if r.get("rehearsal", 0.0) >= 0 for p in r["trajectory"]
    ]
    if kept:
        for a in ax:
            a.set_ylim(min(kept) - 0.1, max(kept) + 0.3)
    ax[0].invert_xaxis()
    ax[0].legend(fontsize=7)
    fig.tight_layout()
    path = Path(out_dir) / "lock_in_trajectories.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    keys = list(per_seed[0])
    md = "| seed | " + " | ".join(keys) + " |\n|" + "---|" * (len(keys) + 1) + "\n"
    for seed, s in zip(result.seeds, per_seed):
        md += f"| {seed} | " + " | ".join(f"{s.get(k, float('nan')):.4g}" for k in keys) + " |\n"
    return ReportExtras(figures=[path], markdown=md, numbers=numbers)
