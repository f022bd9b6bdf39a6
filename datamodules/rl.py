"""``RLDataModule``: the offline data set (D4RL layout) and the online replay buffer of an RL run, the
training env and its collector, and a loader of step indices that drives the loop. It implements the RL
family's ``RLData`` contract (``litlab.lit_modules.rl.contract``).

The env is stepped by the LightningModule inside ``training_step`` through ``collect`` — never in a DataLoader
worker. The loader only yields iteration indices in ``0 .. n_offline_steps + n_online_steps − 1``, starting at
the restored counter after a resume, so ``max_epochs: 1`` bounds the run (Lightning's ``global_step`` counts
every optimiser step and cannot). Each index starts a *chunk* of up to ``steps_per_batch`` iterations (one
iteration = one env step online, with its updates), which the module runs in one ``training_step``: Lightning's
fixed cost per loop iteration is paid once per chunk. A chunk never crosses the offline→online switch, the end,
or a multiple of any cadence registered with ``align_to`` (evaluation, checkpoint and logging cadences, in
iterations), so whatever runs between batches still runs at exactly the iteration it ran at with one iteration
per batch, and every checkpoint falls on a chunk end. ``state_dict`` (saved in every checkpoint) holds the
online buffer as tensors, the iteration counter and the env-step counter, so a resumed run continues the online
phase where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from litlab.datamodules.rl_d4rl import LEVELS, dataset_path, episode_returns, load_dataset
from litlab.datamodules.rl_datasets import ANALYTIC_ENVS, cached_dataset, missing_dataset_error
from litlab.datamodules.rl_env import Collector, Policy, check_env_available, env_dims, make_env
from litlab.datamodules.rl_replay import ReplayBuffer
from litlab.lit_modules.core.errors import DatasetUnavailableError


class StepIndexDataset(IterableDataset):
    def __init__(self, dm: RLDataModule):
        self.dm = dm

    def __iter__(self):
        # Lightning asks for the next index before running the current step: the chunks are a function of their
        # start (``chunk_end``), so they are issued here, and the module advances ``dm.iteration`` (the
        # checkpointed counter) as it runs each iteration of a chunk.
        start = self.dm.iteration
        while start < self.dm.total_iterations:
            yield start
            start = self.dm.chunk_end(start)


class RLDataModule(L.LightningDataModule):
    def __init__(
        self,
        env_id: str = "Pendulum-v1",
        dataset_path: str | None = None,
        dataset_level: str | None = "medium",
        generate_dataset: bool = True,
        dataset_size: int = 20_000,
        dataset_seed: int | Literal["run"] | None = None,
        num_demos: int | None = None,
        subsampling_rate: int = 1,
        subsampling_offset: int | None = None,
        n_offline_steps: int = 0,
        n_online_steps: int = 10_000,
        buffer_capacity: int = 1_000_000,
        obs_scale: list[float] | None = None,
        reward_scale: float = 1.0,
        iql_reward_norm: bool = False,
        terminate_when_unhealthy: bool | None = None,
        env_seed: int | None = None,
    ):
        """``dataset_path`` (a D4RL/Minari HDF5 file) or ``dataset_level``
        (``<cache>/d4rl/<env>-<level>.hdf5``; when missing and ``generate_dataset``, generated on first use
        for Pendulum-v1 and LowTorquePendulum-v0 — seconds, analytic controller —, otherwise ``litlab data d4rl`` makes it);
        ``dataset_seed``: seed of a generated data set — None: seed 0, the shared file ``<env>-<level>.hdf5``;
        k: ``<env>-<level>-seed<k>.hdf5`` generated with seed k; ``run``: the run's seed (``seed_everything``),
        so every seed of a card draws its own data; ``num_demos``/``subsampling_rate``/``subsampling_offset`` keep the first episodes and every n-th
        transition from a random (or given) offset (expert demos); ``iql_reward_norm`` multiplies
        ``reward_scale`` by 1000 / (max − min episode return of the offline data), IQL's locomotion
        preprocessing (Kostrikov et al., "Offline Reinforcement Learning with Implicit Q-Learning", arXiv
        2110.06169, App. B), for offline and online rewards alike; ``env_seed`` defaults to
        ``seed_everything``'s seed."""
        super().__init__()
        self.save_hyperparameters()
        check_env_available(env_id)
        if dataset_level is not None and dataset_level not in LEVELS:
            raise ValueError(f"dataset_level={dataset_level!r} is not one of {LEVELS}")
        if subsampling_rate < 1:
            raise ValueError(f"subsampling_rate must be >= 1, got {subsampling_rate}")
        if n_offline_steps < 0 or n_online_steps < 0:
            raise ValueError(
                f"step counts must be >= 0, got {n_offline_steps} offline, {n_online_steps} online"
            )
        self.dataset_seed = (
            int(torch.initial_seed() % 2**31) if dataset_seed == "run" else dataset_seed
        )  # resolved once: seed_everything has run before the CLI builds the data module
        self.data_file = self._resolve_dataset()
        self.n_offline_steps, self.n_online_steps = n_offline_steps, n_online_steps
        self.total_iterations = n_offline_steps + n_online_steps
        self.iteration = 0
        self.steps_per_batch = 1  # iterations per loader batch; the module sets it (``set_steps_per_batch``)
        self.cadences: set[int] = set()  # chunks end at every multiple of these (``align_to``)
        self.offline: dict[str, torch.Tensor] | None = None
        self.online: ReplayBuffer | None = None
        self.collector: Collector | None = None
        self._pending_state: dict | None = None

    def _resolve_dataset(self) -> Path | None:
        hp = self.hparams
        if hp.dataset_path:
            path = Path(hp.dataset_path).expanduser()
            if not path.exists():
                raise DatasetUnavailableError(
                    f"data set {path} does not exist. Generate one locally with `litlab data "
                    f"d4rl --env {hp.env_id} --level medium --out {path}`, or give the path of "
                    "a D4RL/Minari HDF5 file you have"
                )
            return path
        if hp.dataset_level is None:
            return None
        path = dataset_path(hp.env_id, hp.dataset_level, seed=self.dataset_seed)
        if not path.exists() and not hp.generate_dataset:
            raise missing_dataset_error(hp.env_id, hp.dataset_level, path, "generate_dataset is false")
        if not path.exists() and hp.env_id not in ANALYTIC_ENVS:
            raise missing_dataset_error(
                hp.env_id,
                hp.dataset_level,
                path,
                f"only {', '.join(ANALYTIC_ENVS)} are generated on first use",
            )
        return path

    @property
    def env_id(self) -> str:
        return self.hparams.env_id

    @property
    def env_kwargs(self) -> dict:
        """Arguments of ``make_env`` beyond the id, for the training env and evaluation envs alike."""
        return {"terminate_when_unhealthy": self.hparams.terminate_when_unhealthy}

    # ---- data ------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Generate the cached analytic data set on first use (the Trainer calls this before ``setup``)."""
        if self.data_file is not None and not self.data_file.exists():
            hp = self.hparams
            seed = 0 if self.dataset_seed is None else self.dataset_seed
            cached_dataset(
                hp.env_id, hp.dataset_level, hp.dataset_size, seed, per_seed=self.dataset_seed is not None
            )

    def setup(self, stage: str | None = None) -> None:
        if self.collector is not None:
            return
        hp = self.hparams
        seed = hp.env_seed if hp.env_seed is not None else int(torch.initial_seed() % 2**31)
        env = make_env(hp.env_id, **self.env_kwargs)
        obs_dim, act_dim = env_dims(env)
        self.obs_scale = torch.tensor(hp.obs_scale, dtype=torch.float32) if hp.obs_scale else None
        if self.obs_scale is not None and self.obs_scale.numel() != obs_dim:
            raise ValueError(
                f"obs_scale has {self.obs_scale.numel()} entries, {hp.env_id} observations have {obs_dim}"
            )
        self.reward_scale = hp.reward_scale
        if self.data_file is not None:
            self.prepare_data()  # a no-op when the Trainer ran it; here for direct ``setup()`` calls
            self.offline = self._load_offline(self.data_file, seed, obs_dim, act_dim)
        self.online = ReplayBuffer(obs_dim, act_dim, min(hp.buffer_capacity, max(hp.n_online_steps, 1)))
        self.collector = Collector(env, self.online, seed, self.obs_scale, self.reward_scale)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        if self._pending_state is not None:
            self.load_state_dict(self._pending_state)

    def _load_offline(self, path: Path, seed: int, obs_dim: int, act_dim: int) -> dict[str, torch.Tensor]:
        hp = self.hparams
        data = load_dataset(path)
        if hp.iql_reward_norm:
            returns = episode_returns(data)
            if len(returns) < 2 or returns.max() == returns.min():
                raise ValueError(
                    f"{path}: iql_reward_norm needs >= 2 complete episodes with different returns"
                )
            self.reward_scale = hp.reward_scale * 1000.0 / float(returns.max() - returns.min())
        if data["observations"].shape[1] != obs_dim or data["actions"].shape[1] != act_dim:
            raise ValueError(
                f"{path}: observation/action dims {data['observations'].shape[1]}/{data['actions'].shape[1]} "
                f"do not match {hp.env_id} ({obs_dim}/{act_dim})"
            )
        keep = np.ones(len(data["rewards"]), bool)
        if hp.num_demos is not None:
            keep &= data["episode"] < hp.num_demos
        if hp.subsampling_rate > 1:  # GAIL/DAC convention: every n-th transition of each demo from an offset
            offset = (
                hp.subsampling_offset
                if hp.subsampling_offset is not None
                else int(np.random.default_rng(seed).integers(hp.subsampling_rate))
            )
            first = np.r_[0, np.flatnonzero(np.diff(data["episode"])) + 1]
            pos = np.arange(len(keep)) - first[data["episode"]]
            keep &= (pos % hp.subsampling_rate) == offset
        if not keep.any():
            raise ValueError(
                f"{path}: no transitions left after num_demos={hp.num_demos}, "
                f"subsampling_rate={hp.subsampling_rate}"
            )
        scale = self.obs_scale if self.obs_scale is not None else 1.0
        t = lambda k: torch.as_tensor(data[k][keep], dtype=torch.float32)  # noqa: E731
        return {
            "obs": t("observations") / scale,
            "act": t("actions"),
            "rew": t("rewards") * self.reward_scale,
            "next_obs": t("next_observations") / scale,
            "terminal": t("terminals"),
            "episode": torch.as_tensor(data["episode"][keep]),
        }

    @property
    def offline_size(self) -> int:
        return 0 if self.offline is None else len(self.offline["obs"])

    @property
    def online_size(self) -> int:
        return 0 if self.online is None else len(self.online)

    @property
    def env_steps(self) -> int:
        return 0 if self.collector is None else self.collector.env_steps

    @property
    def episodes(self) -> int:
        return 0 if self.collector is None else self.collector.episodes

    @property
    def last_episode_return(self) -> float:
        return float("nan") if self.collector is None else self.collector.last_episode_return

    def sample_offline(self, n: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        if self.offline is None:
            raise RuntimeError("this run has no offline data set (dataset_level/dataset_path are None)")
        idx = torch.randint(0, self.offline_size, (n,))
        return {k: v[idx].to(device) for k, v in self.offline.items() if k != "episode"}

    def sample_online(self, n: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return self.online.sample(n, device)

    def collect(self, policy: Policy | None) -> dict[str, float]:
        """One training-env step with ``policy`` (None: uniform random), pushed into the online buffer."""
        return self.collector.step(policy)

    def last_transition(self) -> dict[str, torch.Tensor]:
        """The transition the last ``collect`` pushed (obs scaled, reward scaled)."""
        return self.online.last()

    def finish_iteration(self, idx: int) -> None:
        self.iteration = int(idx) + 1

    # ---- the loop's chunks -----------------------------------------------------------------------
    def set_steps_per_batch(self, k: int) -> None:
        """Up to ``k`` iterations per loader batch (``training_step``)."""
        if k < 1:
            raise ValueError(f"steps_per_batch must be >= 1, got {k}")
        self.steps_per_batch = int(k)

    def align_to(self, every: int | None) -> None:
        """Chunks end at every multiple of ``every`` iterations (None/0: no constraint)."""
        if every:
            self.cadences.add(int(every))

    def chunk_end(self, start: int) -> int:
        """The end (exclusive) of the chunk of iterations that starts at ``start``: ``start +
        steps_per_batch``, cut at the end of the run, at the offline→online switch and at the next multiple
        of each registered cadence."""
        stop = min(start + self.steps_per_batch, self.total_iterations)
        if start < self.n_offline_steps:
            stop = min(stop, self.n_offline_steps)
        for every in self.cadences:
            stop = min(stop, (start // every + 1) * every)
        return stop

    def chunk(self, start: int) -> range:
        """The iterations of the chunk that starts at ``start``."""
        return range(int(start), self.chunk_end(int(start)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(StepIndexDataset(self), batch_size=None, num_workers=0)

    # ---- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if self.collector is None:
            return {}
        return {
            "iteration": self.iteration,
            "collector": self.collector.state_dict(),
            "online": self.online.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if self.collector is None:  # restored before setup: apply then
            self._pending_state = state
            return
        self._pending_state = None
        self.iteration = int(state["iteration"])
        self.online.load_state_dict(state["online"])
        self.collector.load_state_dict(state["collector"])
