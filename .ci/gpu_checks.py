"""The one-GPU checks of .ci/gpu_checks.sh (which sets PYTHONPATH to the checkout): each check runs in its own
process under a share of a total time budget and leaves its log in <out>/logs/; the results go to
<out>/gpu_checks.json and <out>/gpu_checks.md. Without CUDA every check that needs it is recorded as skipped, with
the reason, and the rest run.

    python3 .ci/gpu_checks.py --out runs/gpu [--budget-s 570] [--checks env,kernel_tests,...] [--standin-jobs 4]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

FUSED_LORA = """
import json, torch, triton.testing as tt
from litlab.lit_modules.core.adapters import AdapterLinear, inject_adapters
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4096, 4096)).cuda().bfloat16()
inject_adapters(net, r"0", rank=16, alpha=32.0)
for p in net.parameters():
    p.data = p.data.bfloat16()
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
out = {}
for impl in ("auto", "reference"):
    AdapterLinear.fused_impl = impl
    out[impl] = tt.do_bench(lambda: net(x).sum().backward(), warmup=10, rep=50)
AdapterLinear.fused_impl = "auto"
fused = net(x)
AdapterLinear.fused_impl = "reference"
unfused = net(x)
err = float((fused.float() - unfused.float()).abs().max() / unfused.float().abs().max())
print(json.dumps({"fused_ms": out["auto"], "unfused_ms": out["reference"], "speedup": out["reference"] / out["auto"],
                  "max_rel_err": err, "shape": "8192 x 4096 -> 4096, rank 16, bf16, forward + backward"}))
"""


def cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def stand_in_slugs() -> list[str]:
    from litlab.standin import STAND_INS

    return sorted(STAND_INS)


def standin_command(slug: str, runs: Path, on_cpu: bool = False) -> list[str]:
    """20 steps of the card's full config on its stand-in, on the GPU, in the config's precision (the stand-in's
    CPU arguments may lower it: given again after them), one-GPU DDP unless the config names its own strategy.
    ``on_cpu`` (--cpu-fallback): 2 steps on the CPU in the stand-in's precision, the same command otherwise."""
    config = yaml.safe_load((ROOT / f"configs/{slug}/full.yaml").read_text())
    trainer = config.get("trainer") or {}
    args = [PY, "-m", "litlab", "fit", "--config", f"configs/{slug}/full.yaml", "--stand-in"]
    args += [f"--trainer.accelerator={'cpu' if on_cpu else 'gpu'}", "--trainer.devices=1"]
    args.append(f"--trainer.max_steps={2 if on_cpu else 20}")
    if trainer.get("precision") and not on_cpu:
        args.append(f"--trainer.precision={trainer['precision']}")
    if not trainer.get("strategy"):
        args.append("--trainer.strategy=ddp")
    return [*args, f"--runs_dir={runs}", f"--run_id={slug}"]


def kernel_tests_command(*options: str) -> list[str]:
    """pytest on the kernel tests (tests/test_kernels.py, tests/test_adapters_fused.py), the default suite's
    selection (not slow), without the cache or the project's addopts, with ``options`` added."""
    return [
        PY,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-m",
        "not slow",
        *options,
        "tests/test_kernels.py",
        "tests/test_adapters_fused.py",
    ]


def checks(out: Path, on_cpu: bool = False) -> dict[str, tuple[bool, list[str], int]]:
    """name -> (needs CUDA, command, timeout in seconds); ``on_cpu``: the CPU variants (tiny shapes, the kernels in
    Triton's interpreter) of the checks that have one, whose numbers mean nothing but exercise the same code."""
    if on_cpu:
        return cpu_checks(out)
    bench = "from litlab.benchmarks.{0} import main; raise SystemExit(main({1!r}))"
    table = {
        "env": (
            False,
            [
                PY,
                "-c",
                "import torch, lightning, transformers, diffusers; print('torch', torch.__version__, "
                "'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() "
                "else '', 'lightning', lightning.__version__, 'transformers', transformers.__version__, "
                "'diffusers', diffusers.__version__)",
            ],
            60,
        ),
        "kernel_tests": (
            True,
            kernel_tests_command("-rs"),  # -rs: the reasons of skipped tests in the log
            150,
        ),
        "fused_lora": (True, [PY, "-c", FUSED_LORA], 40),
        "sale_prefill": (
            True,
            [
                PY,
                "-c",
                bench.format(
                    "sale_prefill",
                    [
                        "--device",
                        "cuda",
                        "--dtype",
                        "bfloat16",
                        "--lengths",
                        "4096",
                        "8192",
                        "16384",
                        "32768",
                        "65536",
                        "--reps",
                        "3",
                        "--json",
                        str(out / "sale_prefill_bf16.json"),
                    ],
                ),
            ],
            90,
        ),
        "xkv_decode": (
            True,
            [
                PY,
                "-c",
                bench.format(
                    "xkv_decode",
                    [
                        "--device",
                        "cuda",
                        "--lengths",
                        "4096",
                        "16384",
                        "32768",
                        "--layers",
                        "8",
                        "--json",
                        str(out / "xkv_decode.json"),
                    ],
                ),
            ],
            90,
        ),
        "bench_kernels": (
            True,
            [
                PY,
                "-c",
                bench.format(
                    "kernels",
                    ["--kernel", "a", "b", "c1", "c2", "--quick", "--out", str(out / "kernels_bench.md")],
                ),
            ],
            90,
        ),
    }
    for slug in stand_in_slugs():
        table[f"standin:{slug}"] = (True, standin_command(slug, out / "standin_runs"), 120)
    return table


def cpu_checks(out: Path) -> dict[str, tuple[bool, list[str], int]]:
    bench = "from litlab.benchmarks.{0} import main; raise SystemExit(main({1!r}))"
    table = {
        "kernel_tests": (
            False,
            kernel_tests_command(),
            300,
        ),
        "xkv_decode": (
            False,
            [
                PY,
                "-c",
                bench.format(
                    "xkv_decode",
                    [
                        "--device",
                        "cpu",
                        "--tiny",
                        "--lengths",
                        "256",
                        "--layers",
                        "4",
                        "--new-tokens",
                        "4",
                        "--json",
                        str(out / "xkv_decode.json"),
                    ],
                ),
            ],
            120,
        ),
    }
    for slug in stand_in_slugs():
        table[f"standin:{slug}"] = (False, standin_command(slug, out / "standin_runs", on_cpu=True), 300)
    return table


def run_check(name: str, command: list[str], timeout: float, out: Path) -> dict:
    log = out / "logs" / f"{name.replace(':', '_')}.txt"
    t0 = time.monotonic()
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        status = "passed" if done.returncode == 0 else f"failed (exit {done.returncode})"
        text = done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        parts = [
            p.decode(errors="replace") if isinstance(p, bytes) else (p or "")
            for p in (err.stdout, err.stderr)
        ]
        status, text = f"timed out after {timeout:.0f} s", "".join(parts)
    log.write_text(text)
    result = {
        "name": name,
        "status": status,
        "seconds": round(time.monotonic() - t0, 1),
        "log": str(log),
        "details": details(name, text, out),
    }
    if status.startswith("failed") and "--trainer.strategy=ddp" in command:
        # a stand-in that fails under DDP: once more without it, to tell "fails under DDP" from "fails on CUDA"
        retry = [a.replace("--run_id=", "--run_id=no_ddp-") for a in command if a != "--trainer.strategy=ddp"]
        plain = run_check(f"{name}:no_ddp", retry, timeout, out)
        result["without_ddp"] = plain
        result["status"] = f"{status} under DDP; without DDP {plain['status']}"
    return result


def details(name: str, text: str, out: Path) -> str:
    """The check's numbers in one line (its JSON or summary where it writes one, else its log's last line)."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if name.startswith("standin:"):
        _, slug, *retry = name.split(":")
        summary = out / "standin_runs" / slug / (f"no_ddp-{slug}" if retry else slug) / "summary.json"
        if summary.exists():
            s = json.loads(summary.read_text())
            metrics = {
                k: round(v, 4) for k, v in (s.get("metrics") or {}).items() if isinstance(v, (int, float))
            }
            return f"status {s.get('status')}; {len(metrics)} metrics, e.g. {dict(list(metrics.items())[:2])}"
    if name in ("fused_lora", "env") and lines:
        return lines[-1]
    written = {"sale_prefill": "sale_prefill_bf16.json", "xkv_decode": "xkv_decode.json"}.get(name)
    if written and (out / written).exists():
        return f"numbers in {written}; " + (lines[-1][:200] if lines else "")
    return lines[-1][:300] if lines else ""


def markdown(record: dict) -> str:
    mode = " (CPU fallback: tiny shapes, the numbers mean nothing)" if record.get("cpu_fallback") else ""
    rows = [
        f"# GPU checks: {record['device']}{mode}",
        "",
        f"{record['date']}, {record['total_seconds']} s in all.",
        "",
        "| check | status | seconds | numbers / reason |",
        "|---|---|---|---|",
    ]
    for c in record["checks"]:
        text = (c.get("details") or c.get("reason") or "").replace("|", "/")
        rows.append(f"| {c['name']} | {c['status']} | {c.get('seconds', '')} | {text} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/gpu"))
    p.add_argument(
        "--budget-s", type=float, default=570.0, help="all checks together (the script's 10 minutes)"
    )
    p.add_argument("--checks", default="", help="comma-separated names (standin:<slug>, or standin for all)")
    p.add_argument("--standin-jobs", type=int, default=4, help="stand-in fits at once on the one GPU")
    p.add_argument(
        "--cpu-fallback",
        action="store_true",
        help="without CUDA, run the CPU variants (tiny shapes, 2 stand-in steps on the CPU) instead of skipping",
    )
    args = p.parse_args(argv)
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    start, has_cuda = time.monotonic(), cuda_available()
    table = {**checks(out), **(checks(out, on_cpu=True) if args.cpu_fallback and not has_cuda else {})}
    wanted = [w for w in args.checks.split(",") if w]
    chosen = {
        n: c
        for n, c in table.items()
        if not wanted or n in wanted or (n.startswith("standin:") and "standin" in wanted)
    }
    results: list[dict] = []

    def remaining() -> float:
        return args.budget_s - (time.monotonic() - start)

    def skip_or_run(name: str, needs_cuda: bool, command: list[str], timeout: float) -> dict:
        if needs_cuda and not has_cuda:
            return {"name": name, "status": "skipped", "reason": "no CUDA device (needs a GPU)"}
        if remaining() < 10:
            return {
                "name": name,
                "status": "skipped",
                "reason": f"time budget of {args.budget_s:.0f} s spent",
            }
        return run_check(name, command, min(timeout, remaining()), out)

    serial = [(n, c) for n, c in chosen.items() if not n.startswith("standin:")]
    for name, (needs_cuda, command, timeout) in serial:
        results.append(skip_or_run(name, needs_cuda, command, timeout))
        print(f"{name}: {results[-1]['status']}", flush=True)
    standins = [(n, c) for n, c in chosen.items() if n.startswith("standin:")]
    with concurrent.futures.ThreadPoolExecutor(max(1, args.standin_jobs)) as pool:
        futures = [pool.submit(skip_or_run, n, *c) for n, c in standins]
        for future in futures:
            results.append(future.result())
            print(f"{results[-1]['name']}: {results[-1]['status']}", flush=True)
    device = "cpu (no CUDA device)"
    if has_cuda:
        import torch

        device = torch.cuda.get_device_name()
    record = {
        "device": device,
        "cpu_fallback": bool(args.cpu_fallback and not has_cuda),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "total_seconds": round(time.monotonic() - start, 1),
        "checks": results,
    }
    (out / "gpu_checks.json").write_text(json.dumps(record, indent=2))
    (out / "gpu_checks.md").write_text(markdown(record))
    skipped = [r["name"] for r in results if r["status"] == "skipped"]
    if skipped:
        print(
            f"skipped ({len(skipped)}): "
            + ", ".join(f"{r['name']} ({r['reason']})" for r in results if r["status"] == "skipped")
        )
    failed = [r["name"] for r in results if r["status"] not in ("passed", "skipped")]
    print(
        f"results: {out / 'gpu_checks.json'}, {out / 'gpu_checks.md'}"
        + (f"; FAILED: {failed}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
