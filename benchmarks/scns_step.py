"""CPU time of one SCNS training step's backbone work on the quick card's tiny text-to-image model.

The model of ``configs/scns/quick.yaml`` (a diffusers ``UNet2DConditionModel``, channels 16/32, cross-attention in
every block, and a 2-layer ``CLIPTextModel``; random weights: the time does not depend on them), a batch of 8
renders of 16 × 16, the ε-prediction loss at random timesteps and its backward to the cross-attention K/V
weights (the parameters SCNS's row deltas live on; everything else frozen). No optimiser step, no selection:
the per-step cost of the backbone, as the diffusion family's closing notes report it. Process CPU seconds on one
thread; the median after ``--warmup`` steps. Decides no card claim.

    litlab bench scns_step [--steps 30] [--warmup 5] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from litlab.datamodules.continual_concepts import VOCAB, tokenize
from litlab.lit_modules.diffusion.ddpm import TinyT2I, TinyT2IConfig, ddpm_losses, make_scheduler
from litlab.lit_modules.diffusion.neurons import GROUND_SETS


def measure(steps: int = 30, warmup: int = 5, batch_size: int = 8, image_size: int = 16) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = TinyT2IConfig()
    ids = tokenize(["a red circle"]).expand(batch_size, -1)
    model = TinyT2I(cfg, image_size, len(VOCAB), ids.shape[1]).requires_grad_(False)
    kv = [m.weight for n, m in model.unet.named_modules() if n.endswith(GROUND_SETS["kv"])]
    for w in kv:
        w.requires_grad_(True)
    scheduler = make_scheduler(cfg.num_train_timesteps)
    x0 = torch.randn(batch_size, 3, image_size, image_size)
    times = []
    for i in range(warmup + steps):
        t = torch.randint(0, cfg.num_train_timesteps, (batch_size,))
        noise = torch.randn_like(x0)
        start = time.process_time()
        ddpm_losses(model.unet, scheduler, x0, model.encode(ids), t, noise).mean().backward()
        for w in kv:
            w.grad = None
        if i >= warmup:
            times.append(time.process_time() - start)
    return {
        "batch_size": batch_size,
        "image_size": image_size,
        "unet_params": sum(p.numel() for p in model.unet.parameters()),
        "step_cpu_s_median": round(statistics.median(times), 4),
        "step_cpu_s_min": round(min(times), 4),
        "step_cpu_s_max": round(max(times), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="litlab bench scns_step", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.steps, args.warmup, args.batch_size), indent=2))
    return 0
