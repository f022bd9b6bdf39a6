#!/usr/bin/env bash
# GPU checks that CI (CPU only) cannot run: kernels a/b/c1/c2 natively against their references, AdapterLinear's fused
# LoRA path, the kernel benchmark and SALE's prefill timing (dense SDPA vs SALE vs pooled, 4K-32K, bf16 and fp32).
# Needs only a python3 with torch (CUDA), triton, transformers, lightning, matplotlib and pytest: the checkout is
# imported in place (no install), so it also runs on a machine without package-index access.
#   .ci/gpu_checks.sh [out folder, default runs/gpu]
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=${1:-runs/gpu}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PKG=$(mktemp -d)
mkdir -p "$PKG/litlab"
cp litlab/*.py "$PKG/litlab/"
for d in kernels lit_modules datamodules callbacks strategies benchmarks; do ln -sfn "$ROOT/$d" "$PKG/litlab/$d"; done
export PYTHONPATH=$PKG PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 WANDB_MODE=disabled
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$OUT_DIR/env.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -m "not slow" -rs \
  tests/test_kernels.py tests/test_adapters_fused.py 2>&1 | tee "$OUT_DIR/pytest_gpu.txt" | tail -25
timeout 200 python3 -c "from litlab.benchmarks.kernels import main; main(['--kernel', 'a', 'b', 'c1', 'c2', '--out', '$OUT_DIR/kernels_bench.md'])" 2>&1 | tail -30
for dtype in bfloat16 float32; do
  timeout 200 python3 -c "from litlab.benchmarks.sale_prefill import main; main(['--device', 'cuda', '--dtype', '$dtype', '--lengths', '4096', '8192', '16384', '32768', '--reps', '5', '--json', '$OUT_DIR/sale_prefill_$dtype.json'])" 2>&1 | tee "$OUT_DIR/sale_prefill_$dtype.txt" | tail -8
done
rm -rf "$PKG"
