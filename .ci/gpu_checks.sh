#!/usr/bin/env bash
# GPU checks that CI (CPU only) cannot run, in one call of at most 10 minutes on one GPU (.ci/gpu_checks.py):
# kernels a/b/c1/c2 natively against their references (tests/test_kernels.py, tests/test_adapters_fused.py),
# AdapterLinear's fused LoRA path against the unfused one (time and error), SALE's prefill against dense SDPA
# (bf16, 4K-64K tokens), xKV's decode against the dense KV cache (benchmarks/xkv_decode.py), `litlab bench kernels`,
# and 20 steps of every card's full config on its stand-in on CUDA (`litlab fit --config configs/<slug>/full.yaml
# --stand-in`, the config's precision, one-GPU DDP). Writes <out>/gpu_checks.json and <out>/gpu_checks.md, each
# check's log in <out>/logs/. On a machine without CUDA it runs what it can and lists what it skipped and why.
# Needs only a python3 with torch, triton, transformers, diffusers, lightning and pytest: the checkout is imported
# in place (no install), so it also runs on a machine without package-index access.
#   .ci/gpu_checks.sh [out folder, default runs/gpu] [gpu_checks.py options, e.g. --checks env,standin]
# The python: $PYTHON, else the checkout's .venv/bin/python where it exists, else python3.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT_DIR=${1:-runs/gpu}
shift || true
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PKG=$(mktemp -d)
trap 'rm -rf "$PKG"' EXIT
mkdir -p "$PKG/litlab"
cp litlab/*.py "$PKG/litlab/"
for d in kernels lit_modules datamodules callbacks strategies benchmarks; do ln -sfn "$ROOT/$d" "$PKG/litlab/$d"; done
export PYTHONPATH=$PKG PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 WANDB_MODE=disabled
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT_DIR/env.txt"
else
  echo "nvidia-smi not found: no NVIDIA GPU here; the checks that need CUDA are skipped" | tee "$OUT_DIR/env.txt"
fi
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo "$ROOT/.venv/bin/python" || echo python3)}
timeout 600 "$PYTHON" .ci/gpu_checks.py --out "$OUT_DIR" "$@"
