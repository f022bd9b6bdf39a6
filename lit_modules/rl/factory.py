"""The SAC route of the local D4RL-style data factory: a plain-PyTorch SAC (``SACAgent``) trained here, its
snapshots rolled out into D4RL-layout HDF5 files — no downloads. ``litlab data d4rl`` is its command line; the
analytic Pendulum route and the file layout are data-side (``litlab.datamodules.rl_datasets``), reached
through the family's contract.

Levels (D4RL's definitions, arXiv 2004.07219): ``random`` = the untrained SAC policy, ``expert`` = the last
policy, ``medium`` = the first snapshot (evaluated every ``eval_every`` steps) whose return reaches
R_random + (R_expert − R_random)/3, ``medium-replay`` = the SAC replay buffer up to the medium snapshot,
``medium-expert`` = medium ∪ expert.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from litlab.lit_modules.rl.contract import (
    ANALYTIC_ENVS,
    LEVELS,
    ReplayBuffer,
    env_dims,
    evaluate,
    level_rollout,
    make_analytic_dataset,
    make_env,
    random_return,
    write_level,
)
from litlab.lit_modules.rl.sac import SACAgent

PolicyKind = Literal["auto", "sac", "analytic"]


def train_sac(
    env_id: str,
    total_steps: int,
    seed: int,
    hidden: tuple[int, ...] = (256, 256),
    eval_every: int = 5000,
    learning_starts: int = 5000,
    batch_size: int = 256,
    eval_episodes: int = 5,
    log=print,
) -> dict:
    """Plain-PyTorch SAC (UTD 1). Returns snapshots ``[(step, return, actor state)]`` and the replay
    buffer."""
    torch.manual_seed(seed)
    env = make_env(env_id)
    obs_dim, act_dim = env_dims(env)
    agent = SACAgent(obs_dim, act_dim, hidden)
    buffer = ReplayBuffer(obs_dim, act_dim, total_steps)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    snapshots = []
    started = time.time()
    for t in range(1, total_steps + 1):
        o = torch.as_tensor(np.asarray(obs, np.float32))
        act = (
            torch.as_tensor(env.action_space.sample())
            if t <= learning_starts
            else agent.actor.act(o.unsqueeze(0)).squeeze(0)
        )
        nxt, rew, terminated, truncated, _ = env.step(act.numpy())
        buffer.add(
            obs=o, act=act, rew=float(rew), next_obs=np.asarray(nxt, np.float32), terminal=float(terminated)
        )
        obs = nxt
        if terminated or truncated:
            obs, _ = env.reset()
        if t > learning_starts:
            agent.update(buffer.sample(batch_size))
        if t % eval_every == 0 or t == total_steps:
            ret = float(
                np.mean(evaluate(lambda x: agent.actor.act(x, deterministic=True), env_id, eval_episodes))
            )
            snapshots.append((t, ret, copy.deepcopy(agent.actor.state_dict())))
            log(f"  sac {env_id} step {t}: eval return {ret:.1f} ({time.time() - started:.0f} s)")
    return {
        "snapshots": snapshots,
        "buffer": buffer,
        "obs_dim": obs_dim,
        "act_dim": act_dim,
        "hidden": hidden,
    }


def make_dataset(
    env_id: str,
    level: str,
    n_transitions: int = 20_000,
    seed: int = 0,
    policy: PolicyKind = "auto",
    sac_steps: int = 100_000,
    out: Path | None = None,
    log=print,
    ref_episodes: int = 100,
) -> Path:
    """Generate ``<env>-<level>.hdf5`` (and the ``expert`` level's reference returns) under ``out`` or the
    cache: ``policy="auto"`` is the analytic controller where one exists (Pendulum-v1), SAC otherwise."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r} is not one of {LEVELS}")
    policy = ("analytic" if env_id in ANALYTIC_ENVS else "sac") if policy == "auto" else policy
    if policy == "analytic":
        return make_analytic_dataset(env_id, level, n_transitions, seed, out, log, ref_episodes)
    run = train_sac(
        env_id,
        sac_steps,
        seed,
        eval_every=max(sac_steps // 10, 1),
        learning_starts=min(5000, sac_steps // 10),
        log=log,
    )
    actors = []
    for step, ret, state in run["snapshots"]:
        actor = SACAgent(run["obs_dim"], run["act_dim"], run["hidden"]).actor
        actor.load_state_dict(state)
        actors.append((step, ret, actor))
    r_rand = random_return(env_id, ref_episodes)
    expert_step, expert_return, expert_actor = actors[-1]
    medium_step, _, medium_actor = next(
        (a for a in actors if a[1] >= r_rand + (expert_return - r_rand) / 3), actors[-1]
    )  # an expert no better than random: medium = expert
    untrained = SACAgent(run["obs_dim"], run["act_dim"], run["hidden"]).actor
    by_level = {
        "random": lambda o: untrained.act(o),
        "medium": lambda o: medium_actor.act(o),
        "expert": lambda o: expert_actor.act(o),
    }
    algorithm = f"SAC (plain PyTorch), expert at step {expert_step}, medium at step {medium_step}"
    if level == "medium-replay":
        state = run["buffer"].state_dict()
        m = min(medium_step, n_transitions)
        data = {
            "observations": state["obs"][:m].numpy(),
            "actions": state["act"][:m].numpy(),
            "next_observations": state["next_obs"][:m].numpy(),
            "rewards": state["rew"][:m].numpy(),
            "terminals": state["terminal"][:m].numpy() > 0.5,
            "timeouts": np.zeros(m, bool),
            "infos/action_log_probs": np.full(m, np.nan, np.float32),
            "_returns": np.asarray([np.nan]),
        }
        data["timeouts"][-1] = not data["terminals"][-1]
    else:
        data = level_rollout(by_level, env_id, level, n_transitions, seed)
    return write_level(data, env_id, level, seed, algorithm, out, log, ref_episodes, expert_return)
