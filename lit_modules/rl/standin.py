"""Stand-ins of the RL cards' full configs (``litlab fit --config configs/<slug>/full.yaml --stand-in``): a
D4RL-layout HDF5 file of a few hundred transitions (``write_d4rl``, the layout ``litlab data d4rl`` writes and
D4RL ships) passed as ``data.init_args.offline.path``, 32-wide nets and a loop of a few iterations, so the full
loop (offline file, env, evaluation callback, its checkpoints) runs on the CPU in seconds.

The env: the full configs name ``Hopper-v4``, which needs MuJoCo (``pip install 'gymnasium[mujoco]'``, the ``rl``
extra). Where MuJoCo does not import, the stand-in switches the env to ``Pendulum-v1``, which gymnasium ships
(classic control, continuous actions; its reference returns are in ``ref_scores.json``), and writes its file for
that env: the one change of meaning a stand-in makes here, and only on a machine that cannot run the config's env.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

from litlab.lit_modules.rl.contract import Policy, pendulum_swingup, rollout, write_d4rl

CONFIG_ENV = "Hopper-v4"  # data.init_args.env_id of configs/dare/full.yaml and configs/ngt/full.yaml
FALLBACK_ENV = "Pendulum-v1"  # gymnasium's own: no MuJoCo needed
HIDDEN = "[32,32]"
TRANSITIONS = {CONFIG_ENV: 300, FALLBACK_ENV: 600}  # Pendulum's episodes are 200 steps: 3 of them


def stand_in_env() -> str:
    """The config's env where MuJoCo imports, else ``FALLBACK_ENV``."""
    return CONFIG_ENV if importlib.util.find_spec("mujoco") is not None else FALLBACK_ENV


def uniform_policy(act_dim: int, gen: torch.Generator) -> Policy:
    return lambda obs: torch.rand(len(obs), act_dim, generator=gen) * 2 - 1


def write_offline_file(path: Path, env_id: str, level: str) -> Path:
    """``TRANSITIONS[env_id]`` transitions in D4RL layout: uniform-random actions, except Pendulum's ``expert``
    level, which the analytic swing-up controller plays (as ``litlab data d4rl`` does for it). Hopper's ``expert``
    level is one episode that never ends unhealthy (NGT's config: ``terminate_when_unhealthy: false``, as its
    expert demos of 1000 steps), so every subsampling offset keeps a few transitions. Deterministic: the env
    resets and the actions come from seed 0."""
    if path.exists():
        return path
    act_dim = 3 if env_id == CONFIG_ENV else 1
    expert = env_id == FALLBACK_ENV and level == "expert"
    policy = pendulum_swingup if expert else uniform_policy(act_dim, torch.Generator().manual_seed(0))
    env_kwargs = {"terminate_when_unhealthy": False} if level == "expert" and env_id == CONFIG_ENV else None
    data = rollout(policy, env_id, TRANSITIONS[env_id], seed=0, env_kwargs=env_kwargs)
    returns = data.pop("_returns")
    metadata = {
        "algorithm": "analytic swing-up + PD controller" if expert else "uniform random (stand-in)",
        "policy_return": float(np.mean(returns)),
        "env_id": env_id,
        "seed": 0,
        "level": level,
    }
    return write_d4rl(path, data, metadata)


def _data_args(workdir: Path, level: str) -> list[str]:
    env_id = stand_in_env()
    path = write_offline_file(workdir / f"{env_id}-{level}.hdf5", env_id, level)
    switched = [f"--data.init_args.env_id={env_id}"] if env_id != CONFIG_ENV else []
    # 2 evaluation episodes instead of 10, in the fit (the full configs' one callback is RLEvalCallback) and in
    # `litlab test` (one episode per batch)
    return [
        *switched,
        f"--data.init_args.offline.path={path}",
        "--trainer.callbacks.init_args.n_episodes=2",
        "--trainer.limit_test_batches=2",
    ]


def stand_in_dare(workdir: Path) -> list[str]:
    """DARE+IQL's full config: 8 offline IQL steps, then 8 online env steps, 32-wide nets, batches of 8 offline
    and 4 online rows, so the online buffer holds a batch after 4 env steps and the last 5 steps run DARE's
    sample-level mask (its mechanism numbers reach the summary); the diffusion behaviour model and its 5 steps as
    configured."""
    return [
        *_data_args(workdir, "medium"),
        "--trainer.accelerator=cpu",
        "--model.init_args.offline_steps=8",
        "--model.init_args.online_steps=8",
        f"--model.init_args.networks.hidden={HIDDEN}",
        "--model.init_args.optim.batch_offline=8",
        "--model.init_args.optim.batch_online=4",
        "--model.init_args.log_every=4",
    ]


def stand_in_ngt(workdir: Path) -> list[str]:
    """NGT's full config: 16 env steps (4 of them uniform-random before learning starts), 32-wide SAC nets and
    reward nets, batches of 16; one expert episode subsampled every 20th step as configured."""
    return [
        *_data_args(workdir, "expert"),
        "--trainer.accelerator=cpu",
        f"--model.init_args.sac.hidden={HIDDEN}",
        "--model.init_args.reward_model.hidden=[32,32,32]",
        "--model.init_args.reward_model.out_emb_dim=16",
        "--model.init_args.schedule.env_steps=16",
        "--model.init_args.schedule.batch_size=16",
        "--model.init_args.schedule.expert_batch_size=8",
        "--model.init_args.schedule.learning_starts=4",
        "--model.init_args.log_every=4",
        "--data.init_args.buffer_capacity=16",
    ]
