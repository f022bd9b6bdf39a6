"""Env steps per second of one SAC update per env step: the Lightning loop (manual optimisation, env stepped
in ``training_step``, the same ``RLDataModule``) against a plain PyTorch loop calling ``SACAgent.update`` with
the same losses, networks and batch. Rounds are interleaved in one process so machine load hits both alike;
both wall-clock and CPU (process) time are reported — on a shared machine the CPU-time ratio is the fair one.

The Lightning side is the loop the RL modules run: ``steps_per_batch`` env steps (each with its update) per
``training_step`` (``RLModule.training_step``), ``manual_backward`` and ``LightningOptimizer.step`` for each of
the three optimisers (so precision plugins keep working; the actor and temperature losses share one backward,
``RLModule.step_optimizers``, as ``SACAgent.update`` does), the step-index loader and its fetcher, and every
per-batch/per-backward hook dispatch, with logging every 50 env steps — but no logger, progress bar,
checkpoint or ``RLEvalCallback`` (a user's run adds those; their cost is the user's choice, not the loop's).
What remains is Lightning's fixed dispatch per ``training_step`` (≈ 0.3 ms, now shared by ``steps_per_batch``
env steps) and per manual optimiser step (≈ 0.13 ms) on CPU, independent of network width: a larger fraction
with the 64-wide nets than with 256-wide ones.

    litlab bench rl_loop --steps 1000 --rounds 6 [--steps-per-batch 16] [--hidden 256 256 --batch-size 256]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import lightning as L
import torch

from litlab.datamodules.rl import OfflineData, RLDataModule
from litlab.datamodules.rl_env import Collector, env_dims, make_env
from litlab.datamodules.rl_replay import ReplayBuffer
from litlab.lit_modules.rl.module import RLModule
from litlab.lit_modules.rl.sac import (
    SACAgent,
    actor_loss_per_sample,
    critic_loss,
    polyak_update,
    temperature_loss,
)


class OnlineSAC(RLModule):
    """SAC on the env reward in Lightning: exactly ``SACAgent.update``'s three steps under manual
    optimisation."""

    needs_offline = False

    def __init__(
        self,
        hidden: tuple[int, ...] = (64, 64),
        lr: float = 3e-4,
        batch_size: int = 128,
        learning_starts: int = 100,
        online_steps: int = 1000,
        log_every: int = 50,
        steps_per_batch: int = 16,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.online_iterations = online_steps

    def build(self, obs_dim: int, act_dim: int) -> None:
        self.agent = SACAgent(obs_dim, act_dim, list(self.hparams.hidden), self.hparams.lr)
        self.dims = (obs_dim, act_dim)

    def configure_optimizers(self):
        return [self.agent.opt_critic, self.agent.opt_actor, self.agent.opt_alpha]

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        return self.agent.actor.act(obs, deterministic)

    def run_iteration(self, idx: int) -> None:
        hp, dm, ag = self.hparams, self.data, self.agent
        dm.collect(None if dm.env_steps < hp.learning_starts else (lambda o: ag.actor.act(o)))
        if dm.env_steps > hp.learning_starts:
            opt_critic, opt_actor, opt_alpha = self.optimizers()
            batch = dm.sample_online(hp.batch_size)
            alpha = ag.log_alpha.exp().detach()
            loss_q = critic_loss(ag.critic, ag.critic_target, ag.actor, batch, batch["rew"], alpha, ag.gamma)
            self.step_optimizers([(opt_critic, loss_q, None)])
            loss_pi, logp = actor_loss_per_sample(ag.actor, ag.critic, batch["obs"], alpha)
            loss_alpha = temperature_loss(ag.log_alpha, logp, ag.target_entropy)
            self.step_optimizers([(opt_actor, loss_pi.mean(), None), (opt_alpha, loss_alpha, None)])
            polyak_update(ag.critic, ag.critic_target, ag.polyak)
            if (idx + 1) % hp.log_every == 0:
                self.log_dict(
                    {"train/loss_critic": loss_q, "env_steps": float(dm.env_steps), "step": float(idx)}
                )
        dm.finish_iteration(idx)


def plain_loop(
    env_id: str, steps: int, hidden: tuple[int, ...], batch_size: int, learning_starts: int, seed: int
) -> tuple[float, float]:
    torch.manual_seed(seed)
    env = make_env(env_id)
    obs_dim, act_dim = env_dims(env)
    agent = SACAgent(obs_dim, act_dim, hidden)
    buffer = ReplayBuffer(obs_dim, act_dim, steps)
    collector = Collector(env, buffer, seed)
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        collector.step(None if collector.env_steps < learning_starts else (lambda o: agent.actor.act(o)))
        if collector.env_steps > learning_starts:
            agent.update(buffer.sample(batch_size))
    return steps / (time.perf_counter() - started), steps / (time.process_time() - cpu)


def lightning_loop(
    env_id: str,
    steps: int,
    hidden: tuple[int, ...],
    batch_size: int,
    learning_starts: int,
    seed: int,
    steps_per_batch: int = 16,
) -> tuple[float, float]:
    L.seed_everything(seed, verbose=False)
    dm = RLDataModule(env_id=env_id, offline=OfflineData(level=None))
    model = OnlineSAC(
        hidden,
        batch_size=batch_size,
        learning_starts=learning_starts,
        online_steps=steps,
        steps_per_batch=steps_per_batch,
    )
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        log_every_n_steps=1,  # as the RL configs: the module's log_every sets the cadence
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    timer = {}

    class Clock(L.Callback):
        def on_train_start(self, *_):
            timer["start"], timer["cpu_start"] = time.perf_counter(), time.process_time()

        def on_train_end(self, *_):
            timer["end"], timer["cpu_end"] = time.perf_counter(), time.process_time()

    trainer.callbacks.append(Clock())
    trainer.fit(model, dm)
    return steps / (timer["end"] - timer["start"]), steps / (timer["cpu_end"] - timer["cpu_start"])


def benchmark(
    env_id: str = "Pendulum-v1",
    steps: int = 1000,
    rounds: int = 3,
    hidden: tuple[int, ...] = (64, 64),
    batch_size: int = 128,
    learning_starts: int = 100,
    steps_per_batch: int = 16,
) -> dict:
    torch.set_num_threads(1)
    plain, lit = [], []
    lit_loop = functools.partial(lightning_loop, steps_per_batch=steps_per_batch)
    for r in range(rounds):  # interleaved, alternating which goes first
        order = [(plain, plain_loop), (lit, lit_loop)]
        for out, fn in order if r % 2 == 0 else order[::-1]:
            out.append(fn(env_id, steps, hidden, batch_size, learning_starts, seed=r))
    ratio = lambda i: statistics.median(p[i] / q[i] for p, q in zip(plain, lit))  # noqa: E731
    cpu_ratios = [p[1] / q[1] for p, q in zip(plain, lit)]
    res = {
        "env_id": env_id,
        "steps_per_round": steps,
        "rounds": rounds,
        "hidden": list(hidden),
        "batch_size": batch_size,
        "steps_per_batch": steps_per_batch,
        "plain_steps_per_s_wall": [round(x[0], 1) for x in plain],
        "lightning_steps_per_s_wall": [round(x[0], 1) for x in lit],
        "plain_steps_per_s_cpu": [round(x[1], 1) for x in plain],
        "lightning_steps_per_s_cpu": [round(x[1], 1) for x in lit],
        "overhead_ratio_wall_median": round(ratio(0), 4),
        "overhead_ratio_cpu_median": round(ratio(1), 4),
        # the rounds' CPU-time ratios scatter by tens of percent on a shared VM: their mean with a 95 % t-interval
        "overhead_ratio_cpu_mean": round(statistics.fmean(cpu_ratios), 4),
        "overhead_ratio_cpu_ci95": [round(x, 4) for x in _t_interval(cpu_ratios)],
    }
    return res


def _t_interval(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return (float("nan"), float("nan"))
    from scipy import stats

    half = stats.t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5
    return (statistics.fmean(xs) - half, statistics.fmean(xs) + half)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="litlab bench rl_loop", description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="Pendulum-v1")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument(
        "--steps-per-batch", type=int, default=16, help="env steps per training_step of the Lightning loop"
    )
    args = parser.parse_args(argv)
    res = benchmark(
        args.env,
        args.steps,
        args.rounds,
        tuple(args.hidden),
        args.batch_size,
        steps_per_batch=args.steps_per_batch,
    )
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
