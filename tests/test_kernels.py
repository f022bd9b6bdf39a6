"""Kernels a, b, c1, c2 against their PyTorch references on the CPU under the Triton interpreter.

Fresh random inputs per test (seeded by the test's name), outputs poisoned before each launch (NaN / 0xFF), the
tolerances written beside each test. The GPU benchmark smoke test is marked `gpu` and skipped without CUDA.
"""

import os
import zlib

import torch

if (
    not torch.cuda.is_available()
):  # read by litlab.kernels.dispatch.lazy_jit at first launch, so setting it here suffices
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from litlab.kernels import dispatch  # noqa: E402
from litlab.kernels.block_select import (  # noqa: E402,E501
    block_select_reference,
    quant_qk_block_select,
    reserved_blocks,
    smooth_quantize,
)
from litlab.kernels.block_sparse_attention import block_sparse_attention, block_sparse_attention_reference  # noqa: E402
from litlab.kernels.lora_linear import lora_linear, lora_linear_reference  # noqa: E402
from litlab.kernels.lowrank import (  # noqa: E402
    apply_rope,
    gather_lowrank_reconstruct,
    gather_lowrank_reconstruct_reference,
    inverse_rope,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATTN_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
REL_TOL_C1 = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}
REL_TOL_C2 = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def _poison_and_seed(request, monkeypatch):
    monkeypatch.setattr(dispatch, "poison_outputs", True)
    torch.manual_seed(zlib.crc32(request.node.name.encode()))


def rel(x, ref):
    return float((x.detach().float() - ref.detach().float()).norm() / ref.detach().float().norm())


def rope_tables(L, d, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, d, 2).float() / d)
    emb = torch.cat([torch.outer(torch.arange(L).float(), inv)] * 2, -1)
    return emb.cos(), emb.sin()


# ---- a. block-sparse attention ----------------------------------------------------------------------------------
def _qkv(M, N, dtype, H=4, H_kv=2, d=32):
    q = torch.randn(1, H, M, d, device=DEVICE).to(dtype)
    k, v = (torch.randn(1, H_kv, N, d, device=DEVICE).to(dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_block_sparse_random_mask_empty_rows_and_lse(dtype):
    q, k, v = _qkv(200, 200, dtype)  # ragged last blocks: 200 = 3*64 + 8 = 6*32 + 8
    mask = torch.rand(1, 4, 4, 7, device=DEVICE) < 0.5
    mask[:, 0, :, :] |= torch.eye(4, 7, dtype=torch.bool, device=DEVICE)  # some heads keep the diagonal block
    mask[:, 1, 2] = False  # an all-False row block: zeros and lse = -inf
    o, lse = block_sparse_attention(q, k, v, mask, 64, 32, return_lse=True, impl="triton")
    ref, ref_lse = block_sparse_attention_reference(q, k, v, mask, 64, 32, return_lse=True)
    assert (o.float() - ref.float()).abs().max() <= ATTN_TOL[dtype]
    assert (o[:, 1, 128:192] == 0).all()
    finite = ref_lse.isfinite()
    assert torch.equal(lse.isfinite(), finite) and (lse[finite] - ref_lse[finite]).abs().max() < 1e-4
    assert (lse[:, 1, 128:192] == float("-inf")).all()


def test_block_sparse_all_true_equals_sdpa():
    q, k, v = _qkv(200, 200, torch.float32)
    mask = torch.ones(1, 4, 4, 7, dtype=torch.bool, device=DEVICE)
    o = block_sparse_attention(q, k, v, mask, 64, 32, impl="triton")
    sdpa = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True
    )
    assert (o - sdpa).abs().max() <= 1e-5


def test_block_sparse_chunked_prefill_bottom_right_causal():
    q, k, v = _qkv(72, 200, torch.float32)  # M < N: the last 72 queries of a 200-token prefix
    mask = torch.rand(1, 4, 2, 7, device=DEVICE) < 0.6
    o = block_sparse_attention(q, k, v, mask, 64, 32, impl="triton")
    assert (o - block_sparse_attention_reference(q, k, v, mask, 64, 32)).abs().max() <= 1e-5


# ---- b. low-bit block selection ---------------------------------------------------------------------------------
def sink_needle_qk(H=2, N=256, d=32, needles=12):
    from litlab.lit_modules.longctx.sale import sink_needle_inputs

    q, k, _ = sink_needle_inputs(
        H=H, N=N, d=d, n_needles=needles, seed=int(torch.randint(0, 1000, ())), min_query=96, min_gap=48
    )
    return q[None].to(DEVICE), k[None, :1].to(DEVICE)


@pytest.mark.parametrize("inputs", ["gaussian", "sink_needle"])
def test_block_select_kernel_equals_reference(inputs):
    if inputs == "gaussian":
        q, k = torch.randn(1, 2, 256, 32, device=DEVICE), torch.randn(1, 1, 256, 32, device=DEVICE)
    else:
        q, k = sink_needle_qk()
    qz = smooth_quantize(q, k, bits=4)
    k_s, qi, ki = qz[:3]
    assert qi.abs().max() <= 7 and ki.abs().max() <= 7
    for tau in ([0.05, 0.3], [0.01, 0.0]):  # per-head thresholds; 0 = dense head
        blocks = dict(block_q=64, block_k=32, local_blocks=2, seg_blocks=1)  # N=256 leaves a middle region
        mask = quant_qk_block_select(q, *qz, torch.tensor(tau), impl="triton", **blocks)
        ref, margin = block_select_reference(q, *qz, torch.tensor(tau), return_margin=True, **blocks)
        care = ~(margin.abs() <= 1e-4)  # entries within 1e-4 of the threshold are "don't care"
        assert mask.max() <= 1 and torch.equal(mask.bool() | ~care, ref.bool() | ~care)
        assert torch.equal(mask[:, :, 0], ref[:, :, 0])
    if inputs == "sink_needle":
        sparse = quant_qk_block_select(q, *qz, 0.05, impl="triton", **blocks).float().mean()
        assert sparse < 0.6  # the needle geometry leaves most middle blocks unselected


def test_block_select_estimate_accuracy_and_reserved_table():
    q, k = torch.randn(1, 2, 256, 32), torch.randn(1, 1, 256, 32)
    exact = q @ (k - k.mean(2, keepdim=True)).transpose(-1, -2)
    for bits, tol in ((4, 0.25), (16, 1e-5)):
        k_s, qi, ki, sq, sk, c = smooth_quantize(q, k, bits)
        est = (qi.float() @ ki.float().transpose(-1, -2)) * sq[..., None] * sk[..., None, :] + c[..., None, :]
        assert rel(est, exact) < tol
    assert reserved_blocks(5, 1024, 64, 32, 4, 4) == (12, 7, range(1, 5))  # a row computed by hand


# ---- c1. gather + low-rank reconstruct + RoPE ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("chunk", [1, 8])
def test_gather_lowrank_reconstruct(dtype, chunk):
    B, L, r, H, d, S = 1, 96, 48, 2, 32, 40  # r not a multiple of BLOCK_R=32, S not of BLOCK_S=32
    a = torch.randn(B, L, r, device=DEVICE).to(dtype)
    bm = (torch.randn(B, H, r, d, device=DEVICE) / r**0.5).to(dtype)
    idx = torch.randint(0, L // chunk, (B, H, S // chunk), device=DEVICE)
    idx[:, :, 1] = idx[:, :, 0]  # repeated indices
    cos, sin = rope_tables(L, d)
    cos, sin = cos.to(DEVICE, dtype), sin.to(DEVICE, dtype)
    plain = gather_lowrank_reconstruct(a, bm, idx, chunk_size=chunk, impl="triton", block_s=32, block_r=32)
    roped = gather_lowrank_reconstruct(
        a, bm, idx, cos, sin, chunk_size=chunk, impl="triton", block_s=32, block_r=32
    )
    assert (
        rel(plain, gather_lowrank_reconstruct_reference(a, bm, idx, None, None, chunk)) <= REL_TOL_C1[dtype]
    )
    assert rel(roped, gather_lowrank_reconstruct_reference(a, bm, idx, cos, sin, chunk)) <= REL_TOL_C1[dtype]
    if dtype == torch.float32:  # inverse RoPE of the fused output is the plain reconstruction
        t = (idx[..., None] * chunk + torch.arange(chunk, device=DEVICE)).flatten(-2)
        assert rel(inverse_rope(roped, cos[t], sin[t]), plain) < 1e-6
        x = torch.randn(L, d)
        c, s = rope_tables(L, d)
        assert (inverse_rope(apply_rope(x, c, s), c, s) - x).abs().max() < 1e-6


# ---- c2. fused LoRA linear ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_lora_linear_forward_and_grads(dtype):
    for T, (n_in, n_out), r, bias in [
        (1, (48, 64), 1, True),
        (7, (64, 48), 4, False),
        (64, (48, 64), 16, True),
        (64, (64, 64), 4, False),
    ]:
        x = torch.randn(2, T, n_in, device=DEVICE).to(dtype).requires_grad_()
        w = (torch.randn(n_out, n_in, device=DEVICE) / n_in**0.5).to(dtype)
        a = (torch.randn(r, n_in, device=DEVICE) / n_in**0.5).to(dtype).requires_grad_()
        b = torch.randn(n_out, r, device=DEVICE).to(dtype).requires_grad_()
        bb = torch.randn(n_out, device=DEVICE).to(dtype) if bias else None
        y = lora_linear(x, w, a, b, 0.5, bb, impl="triton")
        ref_inputs = [t.detach().float().requires_grad_() for t in (x, a, b)]
        y_ref = lora_linear_reference(
            ref_inputs[0], w.float(), ref_inputs[1], ref_inputs[2], 0.5, None if bb is None else bb.float()
        )
        assert rel(y, y_ref) <= REL_TOL_C2[dtype], (T, n_in, n_out, r)
        if dtype == torch.float32:
            g = torch.randn_like(y_ref)
            grads = torch.autograd.grad(y, (x, a, b), g)
            grads_ref = torch.autograd.grad(y_ref, ref_inputs, g)
            assert all(rel(u, v) <= 1e-5 for u, v in zip(grads, grads_ref))


def test_lora_linear_reference_gradcheck():
    x, a, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((3, 6), (2, 6), (5, 2)))
    w = torch.randn(5, 6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x, a, b: lora_linear(x, w, a, b, 0.7, impl="reference"), (x, a, b))


def test_dispatch_errors():
    q = torch.zeros(1, 1, 4, 16)
    with pytest.raises(ValueError, match="impl='cuda'"):
        block_sparse_attention(q, q, q, torch.ones(1, 1, 1, 1, dtype=torch.bool), impl="cuda")
    with pytest.raises(ValueError, match="block_mask shape"):
        block_sparse_attention(q, q, q, torch.ones(1, 1, 2, 2, dtype=torch.bool))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="kernels/bench.py needs a CUDA GPU")
def test_bench_smoke(tmp_path):
    from litlab.benchmarks.kernels import main

    assert main(["--kernel", "a", "c1", "--quick", "--out", str(tmp_path / "bench.md")]) == 0
    assert "TFLOP/s" in (tmp_path / "bench.md").read_text()


def test_bench_script_cpu_smoke(tmp_path):
    from litlab.benchmarks.kernels import main

    out = tmp_path / "bench.md"
    assert main(["--kernel", "a", "b", "c1", "c2", "--cpu-smoke", "--out", str(out)]) == 0
    text = out.read_text()
    assert all(f"| {k} |" in text for k in ("a", "b", "c1", "c2")) and "TFLOP/s" in text
