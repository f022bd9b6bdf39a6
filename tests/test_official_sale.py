"""SALE against the authors' code: golden numbers from github.com/BirdChristopher/SALE at commit
39d380ce8b375e96a30a2a1bf8e2a00aab0c29c1, the per-warp scheme every official script runs (``quant_mode=3``):
``int4_flash_attn/quant_triton.py`` (``int4_quant_sub_k_mean_perwarp_SmoothQ_fullsize_allInOne``: codes, scales and
``qmk``) and the ``Quant_mode == 3`` branch of ``compute_attn_1rowblock_skipping_v2`` in
``csrc/flash_attn/src/flash_fwd_int4_sparse_kernel_v2.h`` (reserved region, ``reduce_row_sum``'s threshold, the
rounded q̄·k' term, the fp16 comparison: the block map it records), transcribed to PyTorch and run once on CPU with
each fp16 element operation rounded as the kernels round it, on the inputs in
``tests/fixtures/official/sale/golden.pt`` (fp16; the map's q and k rebuilt exactly from small integer factors).

The dense fallback of the official calibration (``flash_attn_func_int4_skip``: prompts <= 1024 tokens run SDPA, so
they never lower a threshold) is our ``Calibration.dense_fallback`` at ``min_seq_len``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from litlab.kernels.block_select import quant_qk_block_select, smooth_quantize
from litlab.lit_modules.core.models import tiny_llama
from litlab.lit_modules.longctx.sale import (
    Calibration,
    SALEConfig,
    calibrate_thresholds,
    sale_block_mask,
    sink_needle_inputs,
)

FIXTURE = Path(__file__).parent / "fixtures" / "official" / "sale"
GOLDEN = torch.load(FIXTURE / "golden.pt")
TOL = json.loads((FIXTURE / "SOURCE.json").read_text())["tolerance"]


def _pattern(H: int, N: int, d: int, a: int, b: int) -> torch.Tensor:
    """The fixture's full-rank integer pattern in [-8, 8] (keeps per-token and per-warp estimates apart)."""
    i, j, h = torch.arange(N)[:, None], torch.arange(d)[None], torch.arange(H)[:, None, None]
    return ((i * a + j * b + h * 31 + (i * j) % 13) % 17 - 8).float()


def _map_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = GOLDEN
    div = float(g["map_divisor"])
    H, N, r = g["U"].shape
    d = g["V"].shape[2]
    q = ((g["U"].float() @ g["V"].float()) / div + _pattern(H, N, d, 7919, 104729) / 32).half()[None]
    k = ((g["W"].float() @ g["Z"].float()) / div + _pattern(H, N, d, 6007, 3571) / 32).half()[None]
    assert float(q.double().sum()) == float(g["map_q_sum"])  # rebuilt exactly
    assert float(k.double().sum()) == float(g["map_k_sum"])
    return q, k


def test_perwarp_codes_scales_and_qmk_equal_the_official_quantiser():
    g = GOLDEN
    k_s, qi, ki, sq, sk, c = smooth_quantize(g["q_quant"], g["k_quant"], 4, quant_mode=3, block_k=32)
    assert torch.equal(qi, g["qq"]) and torch.equal(ki, g["kq"])
    assert torch.equal(sq, g["sq"]) and torch.equal(sk, g["sk"])
    assert (c.float() - g["qmk"].float()).abs().max() <= TOL


def test_perwarp_block_map_equals_the_official_kernel_and_per_token_does_not():
    q, k = _map_inputs()
    tau = GOLDEN["map_thresholds"]
    blocks = dict(block_q=64, block_k=32, local_blocks=4, seg_blocks=4)  # the official 64 x 32, 128, 128
    quant = smooth_quantize(q, k, 4, quant_mode=3, block_k=32)
    mask = quant_qk_block_select(q, *quant, tau, **blocks, quant_mode=3)
    assert torch.equal(mask, GOLDEN["map_mode3"])
    per_token = quant_qk_block_select(q, *smooth_quantize(q, k, 4), tau, **blocks)
    assert int((per_token != GOLDEN["map_mode3"]).sum()) > 0  # quant_mode 2 moves some blocks


def test_quant_mode_option_defaults_to_the_official_scripts_and_moves_few_blocks():
    """quant_mode 3 (default, every official script) and 2 (per token) select nearly the same blocks on the sink +
    needle input: at tau 0.01 a handful differ (measured: 5 of 625 selected)."""
    assert SALEConfig().quant_mode == 3
    q, k, _ = (t[None] for t in sink_needle_inputs())
    m3, _ = sale_block_mask(q, k, 0.01, SALEConfig(impl="reference"))
    m2, _ = sale_block_mask(q, k, 0.01, SALEConfig(impl="reference", quant_mode=2))
    differ = int((m3 != m2).sum())
    assert 0 < differ <= 0.02 * int(m2.sum())


def test_calibration_dense_fallback_leaves_short_prompts_alone():
    """Prompts of at most min_seq_len tokens run dense in the official calibration (no error, no halving)."""
    torch.manual_seed(0)
    model = tiny_llama(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1).eval()
    prompts = [torch.randint(0, 64, (128,), generator=torch.Generator().manual_seed(s)) for s in range(2)]
    cfg = SALEConfig(16, 16, 32, 32, 4, "reference")
    strict = 1e-4  # an error bound every sparse head misses: halving from 0.5 until every block is kept
    skipped, _ = calibrate_thresholds(model, prompts, cfg, strict, tau_init=0.5, min_seq_len=128)
    assert torch.equal(skipped, torch.full_like(skipped, 0.5))
    calibrated, _ = calibrate_thresholds(model, prompts, cfg, strict, tau_init=0.5, min_seq_len=0)
    assert (calibrated < 0.5).all()
    assert Calibration().dense_fallback
