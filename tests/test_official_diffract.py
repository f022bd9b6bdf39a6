"""Diffract against the authors' code: golden numbers from github.com/Risk-AI-Research/diffract at commit
adf9a12cfbfea609f9aa8218a2b2af1356e556e5, the toolkit's kernels in ``src/diffract/core/compute/kernels/``
(``mat_decomposition.py``: ``svd``, ``esd``, ``max_sval``; ``norms.py``: ``frob_norm``, ``l2_norm``,
``nuclear_norm``; ``ranks.py``: ``stable_rank``, ``effective_rank``; ``alignment.py``: ``overlap``,
``vector_agreement``, ``max_vector_agreement``, ``avg_vector_agreement``), run once on CPU (numpy, float64) on the
three base / tuned matrix pairs stored in ``tests/fixtures/official/diffract/golden.pt``.

The toolkit sorts singular values ascending, ours descending: per-component arrays are compared reversed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from litlab.lit_modules.analysis.spectral import alignment, esd, norms_and_ranks, spectral_change, svd

FIXTURE = Path(__file__).parent / "fixtures" / "official" / "diffract"
GOLDEN = torch.load(FIXTURE / "golden.pt")
TOL = json.loads((FIXTURE / "SOURCE.json").read_text())["tolerance"]
PAIRS = sorted({k.split(".")[0] for k in GOLDEN})


def _close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    assert (ours.double() - theirs).abs().max() < TOL * max(1.0, float(theirs.abs().max()))


@pytest.mark.parametrize("pair", PAIRS)
def test_spectra_norms_and_ranks_match_the_toolkit(pair):
    g = GOLDEN
    for tag in ("0", "d"):
        W = g[f"{pair}.W{tag}"]
        _close(svd(W).s.flip(0), g[f"{pair}.svals{tag}"])
        _close(esd(W).flip(0), g[f"{pair}.esd{tag}"])
        fro, l2, stable, effective, _ = g[f"{pair}.norms{tag}"].tolist()
        ours = norms_and_ranks(W)
        assert ours["fro"] == pytest.approx(fro, rel=TOL)
        assert ours["spectral"] == pytest.approx(l2, rel=TOL)
        assert ours["stable_rank"] == pytest.approx(stable, rel=TOL)
        assert ours["effective_rank"] == pytest.approx(effective, rel=TOL)


@pytest.mark.parametrize("pair", PAIRS)
def test_singular_vector_alignment_matches_the_toolkit(pair):
    g = GOLDEN
    f0, fd = svd(g[f"{pair}.W0"]), svd(g[f"{pair}.Wd"])
    for side, (X0, Xd) in (("l", (f0.U, fd.U)), ("r", (f0.V, fd.V))):
        a, b = alignment(X0, Xd)
        _close(a.flip(0), g[f"{pair}.{side}_agreement"])
        _close(b.flip(0), g[f"{pair}.max_{side}_agreement"])
    row = spectral_change(g[f"{pair}.W0"], g[f"{pair}.Wd"])
    avg_l, avg_r = g[f"{pair}.avg_l"], g[f"{pair}.avg_r"]
    assert row["a"] == pytest.approx(float(avg_l[0] + avg_r[0]) / 2, rel=TOL)  # ⟨a⟩ over both sides
    assert row["b"] == pytest.approx(float(avg_l[1] + avg_r[1]) / 2, rel=TOL)
