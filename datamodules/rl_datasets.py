"""D4RL-layout data sets written from policies on this machine (no downloads): rollouts, the cheap analytic
route for the pendulum toys that the data module runs on first use, and the measured reference returns.

Levels follow D4RL (arXiv 2004.07219): ``random``, ``medium`` (a policy at ≈ 1/3 of the expert return),
``medium-replay``, ``expert``, ``medium-expert`` (medium ∪ expert). The ``analytic`` route (Pendulum-v1 and the
``PendulumArray`` envs such as LowTorquePendulum-v0; seconds, deterministic given the seed) takes an
energy-pumping swing-up + PD controller as expert (return ≈ −145 on Pendulum-v1, −307 at motor limit 0.7); medium =
the same controller with actions replaced by uniform-random ones with probability 0.8 plus N(0, 0.1) noise;
medium-replay = random-action probability falling from 1.0 to 0.8 over 20 episodes. The SAC route (any env,
hours on CPU for MuJoCo) needs the RL family's SAC agent: it lives in ``litlab.lit_modules.rl.factory`` and
runs through ``litlab data d4rl``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from litlab.datamodules.rl_d4rl import LEVELS, cached_refs_path, dataset_path, write_d4rl
from litlab.datamodules.rl_env import PENDULUM_ARRAYS, Policy, evaluate, make_env
from litlab.lit_modules.core.errors import DatasetUnavailableError
from litlab.lit_modules.core.io import atomic_write_text


def pendulum_swingup(obs: torch.Tensor, max_torque: float = 2.0) -> torch.Tensor:
    """Energy pumping far from the top, PD control near it. Obs [B, 3] = (cos θ, sin θ, θ̇) -> action [B, 1]
    in [−1, 1] (torque / max_torque). Pendulum-v1: θ̈ = 15 sin θ + 3u, so E = θ̇²/2 + 15 (cos θ − 1) has
    dE/dt = 3 u θ̇."""
    c, s, td = obs[:, 0], obs[:, 1], obs[:, 2]
    theta = torch.atan2(s, c)
    energy = 0.5 * td**2 + 15 * (c - 1)
    pump = -energy * torch.where(td >= 0, 1.0, -1.0)
    u = torch.where(c > 0.85, -(10 * theta + 2 * td), pump)
    return (u.clamp(-max_torque, max_torque) / max_torque).unsqueeze(-1)


def array_swingup(max_torque: float) -> Policy:
    """The same controller on every pendulum of a ``PendulumArray`` env: obs [B, 3n] -> action [B, n]."""

    def act(obs: torch.Tensor) -> torch.Tensor:
        rows = obs.reshape(-1, 3)
        return pendulum_swingup(rows, max_torque).reshape(len(obs), -1)

    return act


ANALYTIC_EXPERTS: dict[str, Policy] = {
    "Pendulum-v1": pendulum_swingup,
    **{env_id: array_swingup(torque) for env_id, (_, torque) in PENDULUM_ARRAYS.items()},
}
ANALYTIC_ENVS = tuple(ANALYTIC_EXPERTS)


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
    """Roll ``policy`` (or one policy per episode, cycling) for ``n_transitions`` steps in D4RL layout; the
    last episode is cut with ``timeouts = True``. Episode i is reset with seed ``seed + i``."""
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


def level_rollout(
    by_level: dict[str, Policy | list[Policy]], env_id: str, level: str, n_transitions: int, seed: int
) -> dict[str, np.ndarray]:
    """Transitions of one level from its policy; ``medium-expert`` is half medium, half expert."""
    if level == "medium-expert":
        parts = [
            rollout(by_level[lv], env_id, n_transitions // 2, seed + 1000 * i)
            for i, lv in enumerate(("medium", "expert"))
        ]
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return rollout(by_level[level], env_id, n_transitions, seed)


def write_level(
    data: dict[str, np.ndarray],
    env_id: str,
    level: str,
    seed: int,
    algorithm: str,
    out: Path | None = None,
    log: Callable[..., None] = print,
    ref_episodes: int = 100,
    expert_return: float | None = None,
) -> Path:
    """Write one level's transitions (with a ``_returns`` entry) to ``out`` or the cache; the ``expert`` level
    also records the env's measured random/expert returns."""
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
    n = len(data["observations"])
    log(f"wrote {path}: {n} transitions, mean episode return {np.nanmean(returns):.1f}")
    if level == "expert":
        expert_ret = float(np.nanmean(returns)) if expert_return is None else expert_return
        record_refs(env_id, random_return(env_id, ref_episodes), expert_ret)
    return path


def make_analytic_dataset(
    env_id: str,
    level: str,
    n_transitions: int = 20_000,
    seed: int = 0,
    out: Path | None = None,
    log: Callable[..., None] = print,
    ref_episodes: int = 100,
) -> Path:
    """``<env>-<level>.hdf5`` from the analytic Pendulum controller (seconds)."""
    if level not in LEVELS:
        raise ValueError(f"level={level!r} is not one of {LEVELS}")
    if env_id not in ANALYTIC_ENVS:
        raise ValueError(
            f"policy='analytic' exists only for {', '.join(ANALYTIC_ENVS)}, not {env_id!r}; use policy='sac'"
        )
    rng = np.random.default_rng(seed)
    expert = ANALYTIC_EXPERTS[env_id]
    by_level = {
        "random": lambda o: torch.as_tensor(rng.uniform(-1, 1, expert(o).shape), dtype=torch.float32),
        "medium": noisy(expert, 0.8, 0.1, rng),
        "expert": expert,
        "medium-replay": [noisy(expert, p, 0.1, rng) for p in np.linspace(1.0, 0.8, 20)],
    }
    data = level_rollout(by_level, env_id, level, n_transitions, seed)
    return write_level(data, env_id, level, seed, "analytic swing-up + PD controller", out, log, ref_episodes)


def missing_dataset_error(env_id: str, level: str, path: Path, why: str) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"no {env_id} {level} data set at {path} ({why}): generate it once with "
        f"`litlab data d4rl --env {env_id} --level {level}` (trains a policy locally; hours on CPU for "
        "MuJoCo), or set data.dataset_path"
    )


def cached_dataset(
    env_id: str, level: str, n_transitions: int = 20_000, seed: int = 0, per_seed: bool = False
) -> Path:
    """The cached data set of ``env_id`` at ``level``, generated on first use where the analytic route exists;
    any other missing data set raises ``DatasetUnavailableError`` naming the command that makes it.
    ``per_seed``: the file of this ``seed`` (``<env>-<level>-seed<k>.hdf5``) instead of the shared one."""
    path = dataset_path(env_id, level, seed=seed if per_seed else None)
    if not path.exists():
        if env_id not in ANALYTIC_ENVS:
            raise missing_dataset_error(
                env_id, level, path, f"only {', '.join(ANALYTIC_ENVS)} are generated on first use"
            )
        make_analytic_dataset(env_id, level, n_transitions, seed, out=path, log=lambda *a: None)
    return path
