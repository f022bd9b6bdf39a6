"""What the RL family needs from the data side, written down: the one module of ``litlab.lit_modules.rl`` that
imports ``litlab.datamodules``.

It re-exports the data-side pieces the family uses (the replay buffer, the env factory and collector, the
D4RL-layout files and the analytic data sets) and states, as the ``RLData`` protocol, what DARE, NGT,
BehaviorCloning and ``RLEvalCallback`` read from ``trainer.datamodule`` (and, as ``ActingModule``, what the
callback needs from the module). A method calls ``check_rl_data`` once in its ``setup()``: a datamodule that
lacks a member fails there, naming the member and its class, instead of deep inside the first training step.
``litlab.datamodules.rl.RLDataModule`` is the implementation shipped here.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from litlab.datamodules.rl_d4rl import (
    LEVELS,
    cached_refs_path,
    dataset_path,
    episode_returns,
    load_dataset,
    read_metadata,
    write_d4rl,
)
from litlab.datamodules.rl_datasets import (
    ANALYTIC_ENVS,
    level_rollout,
    make_analytic_dataset,
    pendulum_swingup,
    random_return,
    rollout,
    write_level,
)
from litlab.datamodules.rl_env import MUJOCO_ENVS, Collector, Policy, env_dims, evaluate, make_env
from litlab.datamodules.rl_replay import ReplayBuffer
from litlab.lit_modules.core.contracts import check_protocol, protocol_members
from litlab.lit_modules.core.errors import ContractError

__all__ = [
    "ANALYTIC_ENVS",
    "ActingModule",
    "LEVELS",
    "MUJOCO_ENVS",
    "Collector",
    "Policy",
    "RLData",
    "ReplayBuffer",
    "cached_refs_path",
    "check_acting_module",
    "check_rl_data",
    "dataset_path",
    "env_dims",
    "episode_returns",
    "evaluate",
    "level_rollout",
    "load_dataset",
    "make_analytic_dataset",
    "make_env",
    "pendulum_swingup",
    "random_return",
    "read_metadata",
    "rollout",
    "write_d4rl",
    "write_level",
]

Batch = dict[str, torch.Tensor]  # obs [n, d_s], act [n, d_a], rew [n], next_obs [n, d_s], terminal [n]


class RLData(Protocol):
    """The datamodule of an RL run, as the family's modules and ``RLEvalCallback`` use it (after its
    ``setup``).

    The data side serves data; the method owns its loop. In its ``setup`` a module ``plan``s the loop (how
    many iterations, how many of them step the env) and marks its phase switch with ``end_chunk_at``; the
    loader then yields iteration indices in ``0 .. total_iterations − 1``. Each index starts a chunk of up to
    ``steps_per_batch`` iterations (``chunk(idx)``) that the module runs in one ``training_step``; a chunk ends
    at every iteration given to ``end_chunk_at`` and at every multiple of a cadence given to ``align_to`` (the
    module's logging cadence, the callback's evaluation and checkpoint cadences). The module steps the training
    env itself (``collect``) and calls ``finish_iteration(idx)`` when an iteration is done; ``iteration`` is
    that counter.
    """

    # the env and its spaces
    env_id: str
    obs_dim: int
    act_dim: int
    obs_scale: torch.Tensor | None  # observations the policy sees are divided by it (None: unscaled)

    @property
    def env_kwargs(self) -> dict[str, Any]: ...  # extra gymnasium.make arguments, for evaluation envs too

    # the loop, as the module plans it, and its counters
    def plan(self, iterations: int, env_steps: int) -> None: ...  # builds the replay buffer and collector

    def end_chunk_at(self, iteration: int) -> None: ...  # no chunk crosses it (a phase switch)

    total_iterations: int
    iteration: int

    @property
    def env_steps(self) -> int: ...

    @property
    def episodes(self) -> int: ...  # training episodes finished so far

    @property
    def last_episode_return(self) -> float: ...  # undiscounted, unscaled; nan before the first episode ends

    def finish_iteration(self, idx: int) -> None: ...

    # the loop's chunks (several iterations per training_step)
    steps_per_batch: int

    def set_steps_per_batch(self, k: int) -> None: ...

    def align_to(self, every: int | None) -> None: ...  # chunks end at every multiple of ``every``

    def chunk(self, start: int) -> range: ...  # the iterations of the chunk the loader's index starts

    # online data
    @property
    def online_size(self) -> int: ...

    def collect(self, policy: Policy | None) -> dict[str, float]: ...  # one env step (None: uniform random)

    def sample_online(self, n: int, device: torch.device | str = "cpu") -> Batch: ...

    def last_transition(self) -> Batch: ...  # the row the last ``collect`` added (unbatched)

    # offline data
    @property
    def offline_size(self) -> int: ...

    def sample_offline(self, n: int, device: torch.device | str = "cpu") -> Batch: ...


class ActingModule(Protocol):
    """What ``RLEvalCallback`` needs from the LightningModule: its policy, on observations as the datamodule
    scales them (``obs [B, d_s] -> action [B, d_a]`` in [−1, 1]; deterministic = the mode), and where its
    offline phase ends (``offline_iterations``: the first online iteration; 0: no offline phase; the loop's
    length for an offline-only method)."""

    offline_iterations: int

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor: ...


OFFLINE_MEMBERS = ("offline_size", "sample_offline")


def check_rl_data(dm: object, needs_offline: bool, user: str) -> RLData:
    """``dm`` as ``RLData``, checked once (after the datamodule's ``setup``): ``ContractError`` naming
    ``dm``'s class and the first member it lacks (the offline members only when ``needs_offline``), or saying
    that it holds no offline data when ``user`` needs some."""
    members = [m for m in protocol_members(RLData) if needs_offline or m not in OFFLINE_MEMBERS]
    check_protocol(dm, RLData, user, members)
    if needs_offline and dm.offline_size == 0:
        raise ContractError(
            f"{type(dm).__qualname__} holds no offline data (offline_size == 0) and {user} needs some: set "
            "data.init_args.offline.level or data.init_args.offline.path"
        )
    return dm  # type: ignore[return-value]


def check_acting_module(module: object, user: str) -> ActingModule:
    """``module`` as ``ActingModule``; ``ContractError`` naming its class when it has no ``act`` method."""
    check_protocol(module, ActingModule, user)
    return module  # type: ignore[return-value]
