"""LoDA against the authors' code: golden numbers from github.com/HHHLF/LoDA_ICML2026 at commit
92f8ba8a6fbcb4af18cbcf01ba9430b831aa193c, ``models/decomposed_lora.py`` (``_init_lora_weight``: the general basis
from the SVD of M_cur + M_prev and the isolated basis from the Cholesky-whitened SVD then QR, both scaled by
1/√3; ``_energy_merge``: η_i and the merged update B diag(1 − η) A) and ``methods/dlora.py``
(``Learner.train_function``'s GAO ``perturb_and_train``, transcribed: two half steps per batch, two batches, SGD
momentum 0.9, on a tiny two-factor linear model with CE standing in for its cosine loss), run once on CPU in float64
on the inputs stored in ``tests/fixtures/official/loda/golden.pt`` (an old-task second moment with two near-null
directions).

Eigenvector signs are arbitrary, so bases are compared as projectors AᵀA. The released code has no ridge on
M_prev: ``ridge=0.0`` (our default since issue 30) reproduces it; ``ridge=1e-3`` moves the isolated projector.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from litlab.lit_modules.continual.loda import LoDA, general_basis, isolated_basis, recalibration_coeff

FIXTURE = Path(__file__).parent / "fixtures" / "official" / "loda"
GOLDEN = torch.load(FIXTURE / "golden.pt")
TOL = json.loads((FIXTURE / "SOURCE.json").read_text())["tolerance"]


def _projector(A: torch.Tensor) -> torch.Tensor:
    return A.T.double() @ A.double()


def test_general_and_isolated_bases_match_the_official_code():
    g = GOLDEN
    r, scale = int(g["rank"]), g["a_scale"]
    general = general_basis(g["M_cur"], g["M_prev"], r).T * scale
    isolated = isolated_basis(g["M_cur"], g["M_prev"], r).T * scale  # default ridge 0.0 = released
    assert (_projector(general) - _projector(g["general_A"])).abs().max() < TOL
    assert (_projector(isolated) - _projector(g["isolated_A"])).abs().max() < TOL


def test_recalibrated_merge_matches_the_official_energy_merge():
    g = GOLDEN
    c = recalibration_coeff(g["general_A"], g["M_prev"], g["M_cur"], float(g["merge_gamma"]))
    assert (1.0 - c - g["merge_eta"]).abs().max() < TOL
    assert (g["B"] @ torch.diag(c) @ g["general_A"] - g["merge_delta"]).abs().max() < TOL


def test_gao_half_steps_match_the_official_perturb_and_train():
    """``LoDA.gao_half_step`` on a stand-in module (its two factors, CE loss): θ + ρ g_src/‖g_src‖, one SGD step on
    the target group's loss, θ − e; groups (1 → 2) then (2 → 1), two batches."""
    g = GOLDEN
    A, B = (g[k].clone().requires_grad_(True) for k in ("gao_A0", "gao_B0"))
    module = types.SimpleNamespace(
        _shifted_params=lambda: [A, B],
        loss=lambda x, y: (F.cross_entropy(x @ A.T @ B.T, y), {}),
        transform_grads=lambda: None,
    )
    opt = torch.optim.SGD([A, B], lr=0.1, momentum=0.9)
    one, two = (g["gao_x1"], g["gao_y1"]), (g["gao_x2"], g["gao_y2"])
    for _ in range(2):
        for src, tgt in ((one, two), (two, one)):
            LoDA.gao_half_step(module, src, tgt, float(g["gao_rho"]), opt, lambda loss: loss.backward())
    assert (A.detach() - g["gao_A"]).abs().max() < TOL
    assert (B.detach() - g["gao_B"]).abs().max() < TOL


def test_ridge_option_moves_the_isolated_projector_and_defaults_to_the_released_zero():
    """ridge 1e-3 (our pre-issue-30 default) changes the isolated projector on these near-null directions;
    both the function and the LightningModule default to the released 0.0."""
    g = GOLDEN
    r, scale = int(g["rank"]), g["a_scale"]
    ridged = isolated_basis(g["M_cur"], g["M_prev"], r, ridge=1e-3).T * scale
    assert (_projector(ridged) - _projector(g["isolated_A"])).abs().max() > 1e-3
    assert LoDA().hparams.ridge == 0.0
