"""Time per training step of each continual method and baseline relative to plain LoRA (sequential LoRA).

Every module is built on the cards' quick protocol (``ContinualDataModule()``: digits, 5 tasks; the cached
TinyViT), trained briefly on task 0 so that every protection is active, then stepped on task 1's batches with
the modules' steps interleaved batch by batch, so that machine load hits all of them alike. The median seconds
per ``cl_step`` (loss → backward → gradient hooks → optimiser step → update rectification) are printed, with
the ratio to the module named ``lora``. These numbers decide no card's claim; they used to be the ``derived``
step-time ratios of seeds/janus_lora.yaml and seeds/loda.yaml.

    litlab bench continual_steps [--methods lora janus_lora loda] [--steps 80] [--warmup-steps 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from litlab.datamodules.continual import ContinualDataModule
from litlab.lit_modules.continual.baselines import InfLoRA, LoRAGPM, OLoRA
from litlab.lit_modules.continual.harness import SequentialLoRA
from litlab.lit_modules.continual.janus_lora import JanusLoRA
from litlab.lit_modules.continual.loda import LoDA

# name -> module factory; "lora" is the reference every ratio divides by
METHODS: dict[str, Callable[[], SequentialLoRA]] = {
    "lora": SequentialLoRA,
    "janus_lora": JanusLoRA,
    "janus_lora_tangent": lambda: JanusLoRA(gr_mode="tangent"),
    "lora_gpm": LoRAGPM,
    "inflora": InfLoRA,
    "olora": OLoRA,
    "loda": LoDA,
    "loda_no_gao": lambda: LoDA(gao_enabled=False),
}


def time_training_steps(
    modules: dict[str, SequentialLoRA], dm: ContinualDataModule, steps: int = 80, warmup_steps: int = 10
) -> dict[str, float]:
    """Median seconds per ``cl_step`` on task 1 (so every protection is active) for each module, with the
    modules' steps interleaved batch by batch. Drives the DataModule and the modules' task hooks itself, as a
    Trainer would, with one plain optimiser per module."""
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"need steps >= 1 and warmup_steps >= 0, got {steps}, {warmup_steps}")
    dm.setup("fit")
    batch_size = dm.hparams.batch_size
    batches = list(dm.task_train_loader(1, batch_size=batch_size))
    for m in modules.values():
        m.build(dm)
        m._standalone_opt = m.configure_optimizers()
        m.on_task_start(0, dm)
        for x, y in list(dm.task_train_loader(0, batch_size=batch_size))[:warmup_steps]:
            m.cl_step((x, y), m._standalone_opt, lambda loss: loss.backward())
        m.on_task_end(0, dm)
        m._standalone_opt.state.clear()
        m.on_task_start(1, dm)
    times: dict[str, list[float]] = {n: [] for n in modules}
    for i in range(steps):
        batch = batches[i % len(batches)]
        for n, m in modules.items():
            t0 = time.perf_counter()
            m.cl_step(batch, m._standalone_opt, lambda loss: loss.backward())
            times[n].append(time.perf_counter() - t0)
    return {n: sorted(v)[len(v) // 2] for n, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="litlab bench continual_steps", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--methods", nargs="+", default=list(METHODS), help=f"among {', '.join(METHODS)}")
    parser.add_argument("--steps", type=int, default=80, help="timed steps per method (median reported)")
    parser.add_argument("--warmup-steps", type=int, default=10, help="task-0 steps before timing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print {method: seconds per step} as JSON")
    args = parser.parse_args(argv)
    unknown = [m for m in args.methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; choose among {list(METHODS)}")
    names = ["lora", *[m for m in args.methods if m != "lora"]]  # the reference always runs
    torch.manual_seed(args.seed)
    secs = time_training_steps(
        {n: METHODS[n]() for n in names}, ContinualDataModule(), args.steps, args.warmup_steps
    )
    if args.json:
        print(json.dumps(secs, indent=1))
        return 0
    print("time per training step vs plain LoRA (median, interleaved, one process)")
    print(f"{'method':22s} {'ms / step':>10s} {'ratio to LoRA':>14s}")
    for name, s in secs.items():
        print(f"{name:22s} {1000 * s:10.2f} {s / secs['lora']:14.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
