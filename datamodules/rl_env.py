"""Environment factory (actions rescaled to [−1, 1]), the training-env collector and deterministic evaluation.

The collector lives in the main process and is stepped from ``training_step`` (never from a DataLoader
worker, whose prefetching would act with a stale policy)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from litlab.datamodules.rl_replay import ReplayBuffer
from litlab.lit_modules.core.errors import EnvUnavailableError

MUJOCO_ENVS = (
    "Hopper",
    "HalfCheetah",
    "Walker2d",
    "Ant",
    "Humanoid",
    "HumanoidStandup",
    "Swimmer",
    "Reacher",
    "Pusher",
    "InvertedPendulum",
    "InvertedDoublePendulum",
)
Policy = Callable[[torch.Tensor], torch.Tensor]  # obs [1, d_s] -> action [1, d_a] in [-1, 1]


class PendulumArray(gym.Env):
    """``n`` independent Pendulum-v1 systems driven by one agent (dynamics of gymnasium's ``PendulumEnv``: g = 10,
    m = l = 1, dt = 0.05, |θ̇| ≤ 8), each with motor limit ``max_torque``; the reward is the mean of the
    Pendulum-v1 rewards. Observation [3n] = (cos θ_i, sin θ_i, θ̇_i) per pendulum, action [n] (torques).
    A harder toy for offline-to-online RL than Pendulum-v1, which any O2O variant solves within a few thousand
    online steps (every run then ends at the expert return): the agent has to learn n swing-ups at once
    from one averaged reward, and a weaker motor needs a longer sequence of energy-pumping swings."""

    metadata = {"render_modes": []}

    def __init__(self, n_pendulums: int = 1, max_torque: float = 2.0):
        self.n, self.max_torque = int(n_pendulums), float(max_torque)
        high = np.tile(np.array([1.0, 1.0, 8.0], np.float32), self.n)
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)
        self.action_space = gym.spaces.Box(-self.max_torque, self.max_torque, (self.n,), np.float32)
        self.state = np.zeros((self.n, 2))

    def _obs(self) -> np.ndarray:
        th, thd = self.state[:, 0], self.state[:, 1]
        return np.stack([np.cos(th), np.sin(th), thd], 1).reshape(-1).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.state = np.stack(
            [self.np_random.uniform(-np.pi, np.pi, self.n), self.np_random.uniform(-1.0, 1.0, self.n)], 1
        )
        return self._obs(), {}

    def step(self, action):
        u = np.clip(np.asarray(action, np.float64).reshape(self.n), -self.max_torque, self.max_torque)
        th, thd = self.state[:, 0], self.state[:, 1]
        angle = ((th + np.pi) % (2 * np.pi)) - np.pi
        cost = angle**2 + 0.1 * thd**2 + 0.001 * u**2
        new_thd = np.clip(thd + (15.0 * np.sin(th) + 3.0 * u) * 0.05, -8.0, 8.0)
        self.state = np.stack([th + new_thd * 0.05, new_thd], 1)
        return self._obs(), -float(cost.mean()), False, False, {}


# id -> (number of pendulums, motor limit)
PENDULUM_ARRAYS = {"LowTorquePendulum-v0": (1, 0.7)}
for _id, (_n, _torque) in PENDULUM_ARRAYS.items():
    if _id not in gym.registry:
        gym.register(
            _id,
            entry_point="litlab.datamodules.rl_env:PendulumArray",
            max_episode_steps=200,
            kwargs={"n_pendulums": _n, "max_torque": _torque},
        )


def check_env_available(env_id: str) -> None:
    if env_id.split("-")[0] in MUJOCO_ENVS and importlib.util.find_spec("mujoco") is None:
        raise EnvUnavailableError(
            f"{env_id} needs MuJoCo, which is not installed: pip install 'gymnasium[mujoco]' "
            "(PyPI wheel, no download at run time)"
        )
    if env_id not in gym.registry:
        raise ValueError(f"env_id={env_id!r} is not a registered gymnasium environment")


def make_env(env_id: str, terminate_when_unhealthy: bool | None = None, **kwargs) -> gym.Env:
    """``gym.make(env_id)`` with actions rescaled to [−1, 1]. ``terminate_when_unhealthy`` is passed
    only to envs that take it (NGT builds MuJoCo envs with fixed-length episodes: False)."""
    check_env_available(env_id)
    if terminate_when_unhealthy is not None:
        try:
            env = gym.make(env_id, terminate_when_unhealthy=terminate_when_unhealthy, **kwargs)
        except TypeError:  # env without a health check (Pendulum, HalfCheetah, ...)
            env = gym.make(env_id, **kwargs)
    else:
        env = gym.make(env_id, **kwargs)
    if not isinstance(env.action_space, gym.spaces.Box):
        raise ValueError(
            f"{env_id} has a {type(env.action_space).__name__} action space; only Box is supported"
        )
    shape = env.action_space.shape
    # callers clip to [-1, 1] (gymnasium's ClipAction would make the space unbounded, which RescaleAction
    # refuses)
    return gym.wrappers.RescaleAction(env, np.full(shape, -1, np.float32), np.full(shape, 1, np.float32))


def env_dims(env: gym.Env) -> tuple[int, int]:
    return int(np.prod(env.observation_space.shape)), int(np.prod(env.action_space.shape))


class Collector:
    """Steps one training env and pushes ``(s, a, r, s', terminal)`` into a replay buffer; time-limit
    truncation is not a termination. ``obs_scale`` divides observations elementwise (fixed input scaling)."""

    def __init__(
        self,
        env: gym.Env,
        buffer: ReplayBuffer,
        seed: int,
        obs_scale: torch.Tensor | None = None,
        reward_scale: float = 1.0,
    ):
        self.env, self.buffer, self.seed = env, buffer, seed
        self.obs_scale, self.reward_scale = obs_scale, reward_scale
        self.env.action_space.seed(seed)
        self.env_steps, self.episodes = 0, 0
        self.episode_return, self.last_episode_return = 0.0, float("nan")
        self._obs = self._reset(seed)

    def scale(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        obs = torch.as_tensor(np.asarray(obs, dtype=np.float32)).reshape(-1)
        return obs / self.obs_scale if self.obs_scale is not None else obs

    def _reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.env.reset(seed=seed)
        return self.scale(obs)

    def step(self, policy: Policy | None) -> dict[str, float]:
        """One env step with ``policy`` (``None``: uniform random actions). Returns episode info when one
        ends."""
        if policy is None:
            act = torch.as_tensor(self.env.action_space.sample(), dtype=torch.float32)
        else:
            act = policy(self._obs.unsqueeze(0)).squeeze(0).cpu().clamp(-1.0, 1.0)
        next_obs, rew, terminated, truncated, _ = self.env.step(act.numpy())
        next_obs = self.scale(next_obs)
        self.buffer.add(
            obs=self._obs,
            act=act,
            rew=float(rew) * self.reward_scale,
            next_obs=next_obs,
            terminal=float(terminated),
        )
        self.env_steps += 1
        self.episode_return += float(rew)
        self._obs = next_obs
        if terminated or truncated:
            self.episodes += 1
            self.last_episode_return, self.episode_return = self.episode_return, 0.0
            self._obs = self._reset()
            return {"episode_return": self.last_episode_return}
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "last_episode_return": self.last_episode_return,
            "env": env_state(self.env) | {"obs": self._obs.clone(), "episode_return": self.episode_return},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Counters, and the episode in progress where the env's state could be saved (``env_state``: the toy
        pendulums, MuJoCo); otherwise a resumed run starts a fresh episode (seeded by the step count)."""
        self.env_steps, self.episodes = int(state["env_steps"]), int(state["episodes"])
        self.last_episode_return = float(state["last_episode_return"])
        self.episode_return = 0.0
        self._obs = self._reset(self.seed + self.env_steps)
        saved = state.get("env") or {}
        if saved.get("restorable"):
            set_env_state(self.env, saved)
            self._obs = saved["obs"].clone()
            self.episode_return = float(saved["episode_return"])


def _bit_generator_state(rng: np.random.Generator | None) -> dict[str, Any] | None:
    return None if rng is None else rng.bit_generator.state


def _wrappers(env: gym.Env):
    while True:
        yield env
        if not hasattr(env, "env"):
            return
        env = env.env


def env_state(env: gym.Env) -> dict[str, Any]:
    """What continues an episode exactly: the simulator state (``state`` array of the pendulums, MuJoCo's
    qpos/qvel), the env's and its action space's generators, the time limit's step count. ``restorable`` is
    False for envs whose state is not one of these."""
    u = env.unwrapped
    out: dict[str, Any] = {"restorable": False}
    if isinstance(getattr(u, "state", None), np.ndarray):
        out["state"] = torch.from_numpy(np.array(u.state))
    elif hasattr(u, "data") and hasattr(u, "set_state"):  # MuJoCo envs
        out["qpos"], out["qvel"] = torch.from_numpy(u.data.qpos.copy()), torch.from_numpy(u.data.qvel.copy())
    else:
        return out
    out["restorable"] = True
    out["np_random"] = _bit_generator_state(getattr(u, "_np_random", None))
    out["action_space"] = _bit_generator_state(getattr(env.action_space, "_np_random", None))
    out["elapsed_steps"] = [int(getattr(w, "_elapsed_steps", None) or 0) for w in _wrappers(env)]
    return out


def set_env_state(env: gym.Env, state: dict[str, Any]) -> None:
    u = env.unwrapped
    if "state" in state:
        u.state = state["state"].numpy().copy()
    else:
        u.set_state(state["qpos"].numpy(), state["qvel"].numpy())
    if state.get("np_random") is not None:
        u.np_random.bit_generator.state = state["np_random"]
    if state.get("action_space") is not None:
        env.action_space.np_random.bit_generator.state = state["action_space"]
    for w, steps in zip(_wrappers(env), state.get("elapsed_steps", [])):
        if hasattr(w, "_elapsed_steps"):
            w._elapsed_steps = steps


def evaluate(
    policy: Policy,
    env_id: str,
    n_episodes: int = 10,
    seed_base: int = 10_000,
    obs_scale: torch.Tensor | None = None,
    env_kwargs: dict | None = None,
) -> list[float]:
    """Returns of ``n_episodes`` episodes on a separate env, episode i reset with seed ``seed_base + i``."""
    env = make_env(env_id, **(env_kwargs or {}))
    returns = []
    for i in range(n_episodes):
        obs, _ = env.reset(seed=seed_base + i)
        done, total = False, 0.0
        while not done:
            o = torch.as_tensor(np.asarray(obs, dtype=np.float32)).reshape(1, -1)
            o = o / obs_scale if obs_scale is not None else o
            obs, rew, terminated, truncated, _ = env.step(policy(o).squeeze(0).cpu().clamp(-1.0, 1.0).numpy())
            total += float(rew)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns
