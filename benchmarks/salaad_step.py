"""Time of a SALAAD training step against a dense step of the same model, in the same process.

Both modules are the quick card's model (``configs/salaad/quick.yaml``: a 2-layer Llama, hidden 64, MLP 128) on
the same batches of 16 x 128 characters; their steps are interleaved, so that machine load hits both alike. A dense
step is forward → backward → clip → AdamW; a SALAAD step adds the coupling gradient ρ(X − L − S + Y/ρ) on the 14
blocks before clipping and, every F steps, one ADMM / controller iteration (SVT, hard cut, dual ascent) on every
block, so the mean over a multiple of F steps includes the refreshes. Process CPU seconds on one thread (what the
shared machine's load does not stretch). Decides no card claim.

    litlab bench salaad_step [--steps 100] [--num-freq 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from litlab.lit_modules.structured.lm import DecoderLM
from litlab.lit_modules.structured.salaad import SALAAD


def _batches(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 97, (16, 129), generator=g)
        out.append({"input_ids": ids[:, :-1], "labels": ids[:, 1:]})
    return out


def time_steps(steps: int = 100, num_freq: int = 10, warmup: int = 5) -> dict[str, float]:
    """Mean CPU seconds per step (dense, SALAAD) over ``steps`` interleaved steps (after ``warmup`` of each)."""
    if steps < 1 or steps % num_freq:
        raise ValueError(f"steps={steps} must be a positive multiple of num_freq={num_freq}")
    torch.manual_seed(0)
    dense, salaad = DecoderLM(), DecoderLM()
    salaad.load_state_dict(dense.state_dict())
    cb = SALAAD(rate_rank=0.15, rate_rank_by_name={"mlp": 0.35}, num_freq=num_freq, log_blocks=False)
    cb.attach(salaad)
    opts = {
        m: torch.optim.AdamW(m.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
        for m in (dense, salaad)
    }
    totals = {"dense": 0.0, "salaad": 0.0}
    for i, batch in enumerate(_batches(steps + warmup)):
        for name, m in (("dense", dense), ("salaad", salaad)):
            t0 = time.process_time()
            opt = opts[m]
            m.lm_loss(batch).backward()
            if m is salaad:
                cb.on_before_optimizer_step(None, m, opt)
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if m is salaad and (i + 1) % num_freq == 0:
                with torch.no_grad():
                    for n, lin in cb.modules.items():
                        cb.state[n].update(lin.weight)
            if i >= warmup:
                totals[name] += time.process_time() - t0
    out = {k: v / steps for k, v in totals.items()}
    out["ratio"] = out["salaad"] / out["dense"]
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="litlab bench salaad_step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--num-freq", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    res = time_steps(args.steps, args.num_freq)
    if args.json:
        print(json.dumps(res))
    else:
        print(
            f"dense step {1e3 * res['dense']:.2f} ms, SALAAD step {1e3 * res['salaad']:.2f} ms "
            f"(F = {args.num_freq}, refreshes included): ratio {res['ratio']:.3f} (CPU s, one thread, {args.steps} steps)"
        )
    return 0
