"""``AdapterLinear`` takes the fused LoRA kernel (c2, kernels/lora_linear.py; LoRA, arXiv 2106.09685) when one
unmerged low-rank branch without dropout is active: same output and gradients as the unfused sum, checked on the
CPU under the Triton interpreter (on CUDA the kernel runs natively)."""

import os

import torch

if not torch.cuda.is_available():  # read by litlab.kernels.dispatch.lazy_jit at first launch
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
from torch import nn  # noqa: E402

from litlab.kernels import lora_linear as c2  # noqa: E402
from litlab.lit_modules.core.adapters import AdapterLinear  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def layer(seed=0, bias=True, d_in=96, d_out=80, rank=8, dropout=0.0):
    torch.manual_seed(seed)
    lin = AdapterLinear(nn.Linear(d_in, d_out, bias=bias)).to(DEVICE)
    br = lin.add_branch("default", rank=rank, alpha=16.0, dropout=dropout)
    with torch.no_grad():
        br.B.normal_()  # B = 0 at init would hide the branch
    return lin


def run(lin, x, impl, monkeypatch):
    monkeypatch.setattr(AdapterLinear, "fused_impl", impl)
    br = lin.branches["default"]
    br.A.grad = br.B.grad = None
    x = x.clone().requires_grad_(True)
    y = lin(x)
    (y * torch.linspace(-1, 1, y.shape[-1], device=DEVICE)).sum().backward()
    return y.detach(), x.grad, br.A.grad.clone(), br.B.grad.clone()


@pytest.mark.parametrize("bias", [True, False])
def test_fused_path_equals_unfused(bias, monkeypatch):
    calls = []
    real = c2._LoRALinear.apply
    monkeypatch.setattr(c2._LoRALinear, "apply", lambda *a: calls.append(1) or real(*a))
    lin = layer(bias=bias)
    x = torch.randn(3, 21, 96, device=DEVICE)
    fused = run(lin, x, "triton", monkeypatch)
    assert calls, "the fused kernel was not launched"
    unfused = run(lin, x, "reference", monkeypatch)
    assert len(calls) == 1
    for a, b in zip(fused, unfused):
        assert (a - b).norm() <= 1e-5 * b.norm()


def test_fused_only_for_a_single_unmerged_dropout_free_lowrank_branch(monkeypatch):
    monkeypatch.setattr(AdapterLinear, "fused_impl", "triton")
    x = torch.randn(2, 96, device=DEVICE)
    lin = layer()
    assert lin.fused_branch(x) is lin.branches["default"]
    assert lin.fused_branch(x.double()) is None  # dtypes differ
    lin.add_branch("second", rank=4)
    assert lin.fused_branch(x) is None  # two active branches
    lin.merge("second")
    assert lin.fused_branch(x) is lin.branches["default"]  # merged branches are in W0 already
    lin.merge("default")
    assert lin.fused_branch(x) is None
    assert layer(dropout=0.1).fused_branch(x) is None
    kr = AdapterLinear(nn.Linear(96, 80)).to(DEVICE)
    kr.add_branch("kr", kind="khatri_rao", rank=4)
    assert kr.fused_branch(x) is None
    monkeypatch.setattr(AdapterLinear, "fused_impl", "auto")
    if DEVICE == "cpu":  # auto fuses on CUDA only: CPU runs (and the cards' numbers) keep the unfused sum
        assert layer().fused_branch(x) is None
