""".ci/gpu_checks.sh on a machine without CUDA: it runs what it can, says what it skipped and why, and writes its
JSON and Markdown; the stand-in fits it would run on the GPU are the cards' full configs with --stand-in."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from litlab.standin import STAND_INS

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="on a GPU machine the script runs the real checks"
)


def load_driver():
    spec = importlib.util.spec_from_file_location("gpu_checks", ROOT / ".ci" / "gpu_checks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", str(ROOT / ".ci" / "gpu_checks.sh"), str(out), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_without_cuda_every_gpu_check_is_skipped_with_its_reason(tmp_path):
    gpu_only = "kernel_tests,fused_lora,sale_prefill,xkv_decode,bench_kernels,standin"
    done = run_script(tmp_path, "--checks", gpu_only)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no NVIDIA GPU here" in done.stdout
    assert "skipped (" in done.stdout and "no CUDA device (needs a GPU)" in done.stdout
    record = json.loads((tmp_path / "gpu_checks.json").read_text())
    names = [c["name"] for c in record["checks"]]
    assert names[:5] == ["kernel_tests", "fused_lora", "sale_prefill", "xkv_decode", "bench_kernels"]
    assert sorted(n.split(":")[1] for n in names[5:]) == sorted(STAND_INS)  # every card's stand-in
    assert all(c["status"] == "skipped" and "CUDA" in c["reason"] for c in record["checks"])
    table = (tmp_path / "gpu_checks.md").read_text()
    assert table.startswith("# GPU checks: cpu (no CUDA device)")
    assert "| standin:lordo | skipped |" in table


def test_stand_in_fits_keep_the_configs_precision_and_run_one_gpu_ddp(tmp_path):
    driver = load_driver()
    lokra = driver.standin_command("lokra", tmp_path)
    assert lokra[lokra.index("--config") + 1] == "configs/lokra/full.yaml" and "--stand-in" in lokra
    # after --stand-in, so the config's bf16 autocast wins over the stand-in's CPU precision
    assert lokra.index("--trainer.precision=bf16-mixed") > lokra.index("--stand-in")
    assert {"--trainer.accelerator=gpu", "--trainer.max_steps=20", "--trainer.strategy=ddp"} <= set(lokra)
    lordo = driver.standin_command("lordo", tmp_path)  # LoRDO's own Strategy stays
    assert not any(a.startswith("--trainer.strategy") for a in lordo)
    dare = driver.standin_command("dare", tmp_path)  # no precision in the config: fp32
    assert not any(a.startswith("--trainer.precision") for a in dare)
    cpu = driver.standin_command("lokra", tmp_path, on_cpu=True)
    assert "--trainer.accelerator=cpu" in cpu and "--trainer.max_steps=2" in cpu
    assert not any(a.startswith("--trainer.precision") for a in cpu)


@pytest.mark.slow
def test_cpu_fallback_runs_a_stand_in_and_the_xkv_benchmark(tmp_path):
    done = run_script(tmp_path, "--checks", "xkv_decode,standin:lordo,fused_lora", "--cpu-fallback")
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "gpu_checks.json").read_text())
    by_name = {c["name"]: c for c in record["checks"]}
    assert record["cpu_fallback"] is True
    assert by_name["fused_lora"]["status"] == "skipped"
    assert by_name["xkv_decode"]["status"] == "passed"
    rows = json.loads((tmp_path / "xkv_decode.json").read_text())["rows"]
    assert {r["method"] for r in rows} == {"dense", "xkv", "xkv_sr"}
    assert all(r["decode_ms_per_token"] > 0 for r in rows)
    assert by_name["standin:lordo"]["status"] == "passed"
    assert by_name["standin:lordo"]["details"].startswith("status finished")
