"""GPU benchmark of the four kernels against their PyTorch / SDPA / cuBLAS baselines.

    litlab bench kernels --kernel a b c1 c2 [--quick] [--out bench.md]

Times with ``triton.testing.do_bench`` (warmup 25, rep 100, median), bf16, and writes a markdown table with the
achieved TFLOP/s or GB/s beside the roofline floor of the detected GPU (H100/H200 datasheet constants).
``--cpu-smoke`` runs tiny shapes on the CPU with a wall-clock timer (Triton interpreter, so the numbers mean
nothing): it only exercises the table code in tests without a GPU.
"""

# ruff: noqa: B023  (each timed lambda is called at once, inside its loop iteration)
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from litlab.kernels.block_select import quant_qk_block_select, smooth_quantize
from litlab.kernels.block_sparse_attention import block_sparse_attention
from litlab.kernels.lora_linear import lora_linear, lora_linear_reference
from litlab.kernels.lowrank import gather_lowrank_reconstruct, gather_lowrank_reconstruct_reference

PEAK = {
    "H100": {"tflops": 989.0, "tops_int8": 1979.0, "tbps": 3.35},
    "H200": {"tflops": 989.0, "tops_int8": 1979.0, "tbps": 4.8},
}


def gpu_peak() -> dict:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return PEAK["H200"] if "H200" in name else PEAK["H100"]


def timer(cpu: bool):
    if not cpu:
        from triton.testing import do_bench

        return lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median")

    def wall(fn):
        fn()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
        return statistics.median(times)

    return wall


# A rate in the table's unit is work (FLOPs, int8 ops or bytes) per millisecond divided by this.
PER_MS = {"TFLOP/s": 1e9, "TOP/s": 1e9, "GB/s": 1e6}


def table_row(
    kernel: str,
    case: str,
    ms: float,
    work: float,
    unit: str,
    peak_per_s: float,
    floor_ms: float | None = None,
) -> tuple:
    """One row of the table: the rate at which ``work`` was done in ``ms``, beside the roofline floor (the time
    ``work`` takes at the peak rate ``peak_per_s``; ``floor_ms`` where another bound is slower)."""
    floor_ms = roofline_ms(work, peak_per_s) if floor_ms is None else floor_ms
    return (kernel, case, ms, work / ms / PER_MS[unit], unit, floor_ms)


def roofline_ms(work: float, peak_per_s: float) -> float:
    """The time ``work`` takes at the datasheet's peak rate: no kernel is faster."""
    return 1e3 * work / peak_per_s


def sink_local_random_mask(B, H, N, bq, bk, rho, device):
    """Reserved sink + local-128 blocks plus random middle blocks at density ``rho``."""
    nq, nk = math.ceil(N / bq), math.ceil(N / bk)
    mask = torch.rand(B, H, nq, nk, device=device) < rho
    qb = torch.arange(nq, device=device)[:, None]
    kb = torch.arange(nk, device=device)[None, :]
    last = (torch.clamp((qb + 1) * bq, max=N) + bk - 1) // bk
    mask |= (kb == 0) | ((kb >= last - 128 // bk) & (kb < last))
    return mask & (kb < last)


def bench_a(quick, dev, dtype, measure, peak):
    rows = []
    H, Hk, d = (2, 1, 32) if dev == "cpu" else (32, 8, 128)
    lengths = [256] if dev == "cpu" else ([8192] if quick else [8192, 16384, 32768, 65536, 131072])
    for N in lengths:
        q = torch.randn(1, H, N, d, device=dev, dtype=dtype)
        k, v = (torch.randn(1, Hk, N, d, device=dev, dtype=dtype) for _ in range(2))
        sdpa_ms = measure(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
        dense_flops = 2 * H * N * N * d  # causal: half of 4*H*N^2*d
        rows.append(table_row("a", f"SDPA N={N}", sdpa_ms, dense_flops, "TFLOP/s", peak["tflops"] * 1e12))
        for rho in [1.0, 0.1] if quick else [1.0, 0.5, 0.2, 0.1, 0.05]:
            mask = sink_local_random_mask(1, H, N, 64, 32, rho, dev)
            ms = measure(lambda: block_sparse_attention(q, k, v, mask, 64, 32, impl="triton"))
            flops = 4 * 64 * 32 * d * int(mask.sum())
            case = f"block-sparse N={N} rho={rho} (density {float(mask.float().mean()):.2f})"
            rows.append(table_row("a", case, ms, flops, "TFLOP/s", peak["tflops"] * 1e12))
    return rows


def bench_b(quick, dev, dtype, measure, peak):
    rows = []
    H, Hk, d = (2, 1, 32) if dev == "cpu" else (32, 8, 128)
    lengths = [256] if dev == "cpu" else ([16384] if quick else [16384, 32768, 65536, 131072])
    for N in lengths:
        q = torch.randn(1, H, N, d, device=dev, dtype=dtype)
        k = torch.randn(1, Hk, N, d, device=dev, dtype=dtype)
        quant = smooth_quantize(q, k, 4)
        ms_q = measure(lambda: smooth_quantize(q, k, 4))
        ms_s = measure(lambda: quant_qk_block_select(q, *quant, 0.01, impl="triton"))
        ops = H * N * N * d  # middle region ~ half the square, 2 ops per MAC
        nbytes = 1.8e9 * (N / 65536) * (H / 32)  # what smooth_quantize moves: 1.8 GB at N = 65536, H = 32
        rows.append(table_row("b", f"smooth_quantize N={N}", ms_q, nbytes, "GB/s", peak["tbps"] * 1e12))
        rows.append(table_row("b", f"int8 block select N={N}", ms_s, ops, "TOP/s", peak["tops_int8"] * 1e12))
    return rows


def bench_c1(quick, dev, dtype, measure, peak):
    rows = []
    Hk, d, L = (2, 32, 512) if dev == "cpu" else (8, 128, 65536)
    cases = (
        [(1, 40, 48)]
        if dev == "cpu"
        else [
            (B, S, r)
            for B in ((1, 8) if quick else (1, 8, 32))
            for S in (1024, 2048)
            for r in ((384,) if quick else (96, 384, 576, 768))
        ]
    )
    inv = 1.0 / 1e5 ** (torch.arange(0, d, 2, device=dev).float() / d)
    emb = torch.cat([torch.outer(torch.arange(L, device=dev).float(), inv)] * 2, -1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    for B, S, r in cases:
        a = torch.randn(B, L, r, device=dev, dtype=dtype)
        bm = torch.randn(B, Hk, r, d, device=dev, dtype=dtype)
        idx = torch.randint(0, L // 8, (B, Hk, S // 8), device=dev)
        ms = measure(lambda: gather_lowrank_reconstruct(a, bm, idx, cos, sin, chunk_size=8, impl="triton"))
        ms_ref = measure(lambda: gather_lowrank_reconstruct_reference(a, bm, idx, cos, sin, 8))
        nbytes = 2 * (B * Hk * S * r + B * Hk * r * d + B * Hk * S * d)
        case = f"gather-reconstruct B={B} S={S} r={r} (reference {ms_ref:.3f} ms)"
        rows.append(table_row("c1", case, ms, nbytes, "GB/s", peak["tbps"] * 1e12))
    return rows


def bench_c2(quick, dev, dtype, measure, peak):
    rows = []
    n = 64 if dev == "cpu" else 4096
    cases = (
        [(16, 4)]
        if dev == "cpu"
        else [(T, r) for T in (16, 512, 4096) for r in ((16,) if quick else (8, 16, 64))]
    )
    for T, r in cases:
        x = torch.randn(T, n, device=dev, dtype=dtype)
        w = torch.randn(n, n, device=dev, dtype=dtype) / n**0.5
        a, b = torch.randn(r, n, device=dev, dtype=dtype), torch.randn(n, r, device=dev, dtype=dtype)
        ms = measure(lambda: lora_linear(x, w, a, b, 0.5, impl="triton"))
        ms_base = measure(lambda: x @ w.t())
        ms_ref = measure(lambda: lora_linear_reference(x, w, a, b, 0.5))
        flops = 2 * T * n * (n + r) + 2 * T * r * n
        # compute-bound or bound by reading W (bf16) once, whichever is slower
        floor = max(roofline_ms(flops, peak["tflops"] * 1e12), roofline_ms(2 * n * n, peak["tbps"] * 1e12))
        case = f"lora_linear T={T} r={r} (x@W^T {ms_base:.3f} ms, unfused {ms_ref:.3f} ms)"
        rows.append(table_row("c2", case, ms, flops, "TFLOP/s", peak["tflops"] * 1e12, floor_ms=floor))
    return rows


BENCHES = {"a": bench_a, "b": bench_b, "c1": bench_c1, "c2": bench_c2}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernel", nargs="+", choices=sorted(BENCHES), default=sorted(BENCHES))
    p.add_argument("--quick", action="store_true", help="fewer shapes")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    p.add_argument("--out", default="kernels_bench.md")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        os.environ["TRITON_INTERPRET"] = "1"
        dev, dtype = "cpu", torch.float32
    elif not torch.cuda.is_available():
        print(
            "kernels/bench.py needs a CUDA GPU (use --cpu-smoke to exercise the script only)", file=sys.stderr
        )
        return 2
    else:
        dev, dtype = "cuda", torch.bfloat16
    peak, measure = gpu_peak(), timer(args.cpu_smoke)
    device = (
        "CPU (interpreter smoke run: timings meaningless)" if args.cpu_smoke else torch.cuda.get_device_name()
    )
    lines = [
        f"Kernel benchmark on {device}, {dtype}, median of do_bench (warmup 25, rep 100)",
        "",
        "| kernel | case | ms | achieved | unit | roofline floor ms |",
        "|---|---|---|---|---|---|",
    ]
    for name in args.kernel:
        for kern, case, ms, achieved, unit, floor in BENCHES[name](args.quick, dev, dtype, measure, peak):
            lines.append(f"| {kern} | {case} | {ms:.4f} | {achieved:.2f} | {unit} | {floor:.4f} |")
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
