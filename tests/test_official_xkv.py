"""xKV against the authors' code: golden numbers from github.com/abdelfattah-lab/xKV at commit
bfe5d7201a098556416988a397632cd661b00ff5 — ``xKV/customized_cache/fake_layer_merge_dynamic_cache.py``
(``fake_svd`` on the layer group's keys / values concatenated along heads; ``slerp_merge_rows_batch`` and
``fake_minicache_merge``, the MiniCache baseline) and ``xKV/configurations.py`` (``generate_consecutive_layer_groups``),
run once on CPU in float32 on the inputs stored in ``tests/fixtures/official/xkv/golden.pt``: three layers' K
(a shared token basis plus noise) and V of 2 heads x 40 tokens x 8 dims, cross-layer (G = 3) and single-layer
(G = 1) ranks 4, 6, 12; SLERP of two layers' rows (10 of 40 tokens nearly parallel) at gamma 0.05 / 0.3, t 0.5 / 0.3.

Ours goes through the same steps as ``XKV._factorise`` and ``XKV.install``: the layer-major, head-major
concatenation, ``truncated_svd`` (A = U_r, B = S_r W_rᵀ), the per-layer per-head B blocks and the reconstruction
kernel's reference path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from litlab.kernels.lowrank import gather_lowrank_reconstruct
from litlab.lit_modules.longctx.xkv import _flat, _heads, layer_groups, slerp_merge, truncated_svd

FIXTURE = Path(__file__).parent / "fixtures" / "official" / "xkv"
GOLDEN = torch.load(FIXTURE / "golden.pt")
TOL = json.loads((FIXTURE / "SOURCE.json").read_text())["tolerance"]


def _reconstruct(mats: list[torch.Tensor], rank: int) -> list[torch.Tensor]:
    B, H, L, _ = mats[0].shape
    x = torch.cat([_flat(m.float()) for m in mats], -1)
    a, b = truncated_svd(x, rank)
    width = x.shape[-1] // len(mats)
    idx = torch.arange(L).expand(B, H, L)
    return [
        gather_lowrank_reconstruct(a, _heads(b[..., i * width : (i + 1) * width], H), idx, impl="reference")
        for i in range(len(mats))
    ]


def _rel(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


@pytest.mark.parametrize("rank", [4, 6, 12])
def test_cross_layer_and_single_layer_svd_match_fake_svd(rank):
    g = GOLDEN
    for kind in ("k", "v"):
        mats = list(g["keys" if kind == "k" else "values"])
        for ours, theirs in zip(_reconstruct(mats, rank), g[f"svd_{kind}_r{rank}"]):
            assert _rel(ours, theirs) < TOL, (kind, rank)
    assert _rel(_reconstruct([g["keys"][0]], rank)[0], g[f"svd_k1_r{rank}"]) < TOL


@pytest.mark.parametrize("gamma", [0.05, 0.3])
@pytest.mark.parametrize("t", [0.5, 0.3])
def test_minicache_slerp_matches_fake_minicache_merge(gamma, t):
    g = GOLDEN
    x_new, y_new, merged, retained = slerp_merge(g["slerp_x"], g["slerp_y"], t, gamma)
    theirs = g[f"slerp_g{gamma}_t{t}"]
    assert _rel(x_new, theirs[0]) < TOL and _rel(y_new, theirs[1]) < TOL
    assert retained >= 20  # the 10 nearly parallel tokens x 2 heads keep their own rows


def test_layer_groups_match_the_official_consecutive_groups():
    for (start, end, size), theirs in zip(GOLDEN["group_cases"].tolist(), GOLDEN["groups"]):
        assert layer_groups(32, size, start, end) == theirs
