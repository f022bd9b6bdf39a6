"""Local D4RL-style data factory (dare.md §5.1): policies trained or written here, rolled out into D4RL-layout
HDF5 files — no downloads. ``litlab data d4rl`` is its command line.

Levels (D4RL's definitions): ``random`` (uniform random actions for the analytic route, the untrained SAC policy
for the SAC route), ``medium`` (a policy at ≈ 1/3 of the expert return), ``medium-replay`` (the SAC replay buffer
up to the medium checkpoint), ``expert``, ``medium-expert`` (medium ∪ expert). Policies:

* ``sac``: a plain-PyTorch SAC run (``SACAgent``) evaluated every ``eval_every`` steps; expert = the last policy,
  medium = the first snapshot whose return reaches R_random + (R_expert − R_random)/3.
* ``analytic`` (Pendulum-v1 only, seconds, deterministic): an energy-pumping swing-up + PD controller as expert
  (return ≈ −137); medium = the same controller with actions replaced by uniform-random ones with probability 0.8
  plus N(0, 0.1) noise (dare.md §6); medium-replay = random-action probability falling from 1.0 to 0.8.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from litlab.lit_modules.core.io import atomic_write_text, cache_dir
from litlab.lit_modules.rl.d4rl_io import write_d4rl
from litlab.lit_modules.rl.envs import Policy, env_dims, evaluate, make_env
from litlab.lit_modules.rl.replay import ReplayBuffer
from litlab.lit_modules.rl.sac import SACAgent
from litlab.lit_modules.rl.scores import cached_refs_path

LEVELS = ("random", "medium", "medium-replay", "expert", "medium-expert")
PolicyKind = Literal["auto", "sac", "analytic"]


def dataset_path(env_id: str, level: str, root: Path | None = None) -> Path:
    return (root or cache_dir() / "d4rl") / f"{env_id}-{level}.hdf5"


def pendulum_swingup(obs: torch.Tensor) -> torch.Tensor:
    """Energy pumping far from the top, PD control near it. Obs [B, 3] = (cos θ, sin θ, θ̇) -> action [B, 1] in [−1, 1]
    (torque / 2). Pendulum-v1: θ̈ = 15 sin θ + 3u, so E = θ̇²/2 + 15 (cos θ − 1) has dE/dt = 3 u θ̇."""
    c, s, td = obs[:, 0], obs[:, 1], obs[:, 2]
    theta = torch.atan2(s, c)
    energy = 0.5 * td**2 + 15 * (c - 1)
    pump = -energy * torch.where(td >= 0, 1.0, -1.0)
    u = torch.where(c > 0.85, -(10 * theta + 2 * td), pump)
    return (u.clamp(-2, 2) / 2).unsqueeze(-1)


def noisy(policy: Policy, random_prob: float, noise_std: float, rng: np.random.Generator) -> Policy:
    def act(obs: torch.Tensor) -> torch.Tensor:
        a = policy(obs)
        if rng.random() < random_prob:
            return torch.as_tensor(rng.uniform(-1, 1, a.shape), dtype=torch.float32)
        return (a + noise_std * torch.as_tensor(rng.standard_normal(a.shape), dtype=torch.float32)).clamp(
            -1, 1
        )

    return act


def rollout(
    policy: Policy | list[Policy], env_id: str, n_transitions: int, seed: int, env_kwargs: dict | None = None
) -> dict[str, np.ndarray]:
    """Roll ``policy`` (or one policy per episode, cycling) for ``n_transitions`` steps in D4RL layout; the last
    episode is cut with ``timeouts = True``. Episode i is reset with seed ``seed + i``."""
    env = make_env(env_id, **(env_kwargs or {}))
    policies = policy if isinstance(policy, list) else [policy]
    rows: dict[str, list] = {
        k: [] for k in ("observations", "actions", "next_observations", "rewards", "terminals", "timeouts")
    }
    episode, returns, ret = 0, [], 0.0
    obs, _ = env.reset(seed=seed)
    for t in range(n_transitions):
        o = torch.as_tensor(np.asarray(obs, np.float32)).reshape(1, -1)
        act = policies[episode % len(policies)](o).reshape(-1).clamp(-1, 1).numpy()
        nxt, rew, terminated, truncated, _ = env.step(act)
        truncated = truncated or t == n_transitions - 1
        for k, v in zip(rows, (obs, act, nxt, rew, terminated, truncated and not terminated)):
            rows[k].append(np.asarray(v, np.float32) if k not in ("terminals", "timeouts") else bool(v))
        ret += float(rew)
        obs = nxt
        if terminated or truncated:
            returns.append(ret)
            episode, ret = episode + 1, 0.0
            obs, _ = env.reset(seed=seed + episode)
    env.close()
    out = {
        k: np.stack(v) if k in ("observations", "actions", "next_observations") else np.asarray(v)
        for k, v in rows.items()
    }
    out["infos/action_log_probs"] = np.full(n_transitions, np.nan, np.float32)  # mixture policies: no density
    out["_returns"] = np.asarray(returns)
    return out


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
    """Plain-PyTorch SAC (UTD 1). Returns snapshots ``[(step, return, actor state)]`` and the replay buffer."""
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


def random_return(env_id: str, n_episodes: int = 100, seed: int = 0) -> float:
    env = make_env(env_id)
    env.action_space.seed(seed)
    return float(
        np.mean(
            evaluate(
                lambda o: torch.as_tensor(env.action_space.sample()).unsqueeze(0),
                env_id,
                n_episodes,
                seed_base=seed,
            )
        )
    )


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
    """Generate ``<env>-<level>.hdf5`` (and the ``expert`` level's reference returns) under ``out`` or the cache."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r} is not one of {LEVELS}")
    policy = ("analytic" if env_id == "Pendulum-v1" else "sac") if policy == "auto" else policy
    if policy == "analytic" and env_id != "Pendulum-v1":
        raise ValueError(f"policy='analytic' exists only for Pendulum-v1, not {env_id!r}; use policy='sac'")
    rng = np.random.default_rng(seed)
    expert_return = None
    if policy == "analytic":
        expert = pendulum_swingup
        medium = noisy(pendulum_swingup, 0.8, 0.1, rng)
        by_level = {
            "random": lambda o: torch.as_tensor(rng.uniform(-1, 1, (1, 1)), dtype=torch.float32),
            "medium": medium,
            "expert": expert,
            "medium-replay": [noisy(pendulum_swingup, p, 0.1, rng) for p in np.linspace(1.0, 0.8, 20)],
        }
        algorithm = "analytic swing-up + PD controller"
    else:
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
    if level == "medium-expert":
        parts = [
            rollout(by_level[lv], env_id, n_transitions // 2, seed + 1000 * i)
            for i, lv in enumerate(("medium", "expert"))
        ]
        data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    elif level == "medium-replay" and policy == "sac":
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
        data = rollout(by_level[level], env_id, n_transitions, seed)
    returns = data.pop("_returns")
    path = out or dataset_path(env_id, level)
    write_d4rl(
        path,
        data,
        {
            "algorithm": algorithm,
            "policy_return": float(np.nanmean(returns)),
            "env_id": env_id,
            "seed": seed,
            "level": level,
        },
    )
    log(
        f"wrote {path}: {len(data['observations'])} transitions, mean episode return {np.nanmean(returns):.1f}"
    )
    if level == "expert":
        expert_ret = float(np.nanmean(returns)) if expert_return is None else expert_return
        record_refs(env_id, random_return(env_id, ref_episodes), expert_ret)
    return path


def record_refs(env_id: str, random_ret: float, expert_ret: float) -> None:
    """Add measured (random, expert) returns of a toy env to the cache's ref_scores.json (atomic)."""
    path = cached_refs_path()
    refs = json.loads(path.read_text()) if path.exists() else {}
    refs[env_id] = {
        "random": round(random_ret, 3),
        "expert": round(expert_ret, 3),
        "how": "random: uniform policy, 100 episodes, seed 0; expert: data-factory expert policy",
    }
    atomic_write_text(path, json.dumps(refs, indent=2) + "\n")


def cached_dataset(
    env_id: str, level: str, n_transitions: int = 20_000, seed: int = 0, generate: bool = True
) -> Path:
    """The cached data set, generated on first use when ``generate`` (cheap analytic route only by default)."""
    path = dataset_path(env_id, level)
    if not path.exists() and generate:
        make_dataset(env_id, level, n_transitions, seed, log=lambda *a: None)
    return path
