"""``RLDataModule``: the offline data set (D4RL layout) and the online replay buffer of an RL run, the
training env and its collector, and a loader of step indices that drives the loop. It implements the RL
family's ``RLData`` contract (``litlab.lit_modules.rl.contract``).

The data module serves data; the method owns its algorithm. The module says how long its loop is and where its
phases switch (``plan``, ``end_chunk_at``, in its ``setup``); the data module sizes the replay buffer from that and
its loader yields iteration indices ``0 .. total_iterations − 1``, starting at the restored counter after a resume,
so ``max_epochs: 1`` bounds the run (Lightning's ``global_step`` counts every optimiser step and cannot). The env is
stepped by the LightningModule inside ``training_step`` through ``collect`` — never in a DataLoader worker. Each
index starts a *chunk* of up to ``steps_per_batch`` iterations (one iteration = one env step online, with its
updates), which the module runs in one ``training_step``: Lightning's fixed cost per loop iteration is paid once
per chunk. A chunk never crosses the end, an iteration given to ``end_chunk_at`` (the method's phase switch) or
a multiple of any cadence registered with ``align_to`` (evaluation, checkpoint and logging cadences, in
iterations), so whatever runs between batches still runs at exactly the iteration it ran at with one iteration
per batch, and every checkpoint falls on a chunk end. ``state_dict`` (saved in every checkpoint) holds the
online buffer as tensors, the iteration counter and the env-step counter, so a resumed run continues the online
phase where it stopped.

Random streams (``litlab.lit_modules.core.seeding``): a generated data set is drawn from the run's ``data``
stream, a random demo-subsampling offset from ``data.subsample``, the training env (its resets and the uniform
exploration actions) from ``env``; the content of the offline data actually used is recorded as the artefact
``data`` (a fingerprint of its arrays), whether it was generated here or read from a shared file.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from litlab.datamodules.rl_d4rl import LEVELS, dataset_path, episode_returns, load_dataset
from litlab.datamodules.rl_datasets import ANALYTIC_ENVS, cached_dataset, missing_dataset_error
from litlab.datamodules.rl_env import Collector, Policy, check_env_available, env_dims, make_env
from litlab.datamodules.rl_replay import ReplayBuffer
from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.errors import DatasetUnavailableError
from litlab.lit_modules.core.seeding import derive_seed, fingerprint, record_artefact


@config_part
class OfflineData:
    """The offline data set, D4RL layout (``level=None``: none, an online-only run). With ``generate`` (the
    analytic pendulum toys only, seconds) every run seed draws its own set of ``size`` transitions from its
    ``data`` stream, cached as ``<cache>/d4rl/<env>-<level>-seed<k>.hdf5``; without it the run reads the shared
    ``<env>-<level>.hdf5`` that ``litlab data d4rl`` writes (the same for every run seed, as a real D4RL set is:
    a card then declares ``data`` shared). ``path``: a D4RL/Minari file of your own instead of a level (also the
    same for every seed)."""

    level: str | None = "medium"
    path: str | None = None
    generate: bool = True
    size: int = 20_000


@config_part
class DemoSelection:
    """The offline transitions kept (expert demos, the GAIL/DAC convention): the first ``num_episodes`` episodes
    (None: all), every ``subsampling_rate``-th transition of each from ``subsampling_offset`` (None: an offset
    drawn from the run's ``data.subsample`` stream)."""

    num_episodes: int | None = None
    subsampling_rate: int = 1
    subsampling_offset: int | None = None


@config_part
class Scaling:
    """Fixed input and reward scales, for offline and online data alike: the observations the policy sees are
    divided by ``obs_scale`` (one entry per dimension; None: unscaled) and rewards multiplied by
    ``reward_scale``; ``iql_reward_norm`` multiplies that by 1000 / (max − min episode return of the offline
    data), IQL's locomotion preprocessing (Kostrikov et al., "Offline Reinforcement Learning with Implicit
    Q-Learning", arXiv 2110.06169, App. B)."""

    obs_scale: tuple[float, ...] | None = None
    reward_scale: float = 1.0
    iql_reward_norm: bool = False


OFFLINE_DATA, ALL_TRANSITIONS, UNSCALED = OfflineData(), DemoSelection(), Scaling()
# ``litlab test``: evaluation episodes of a restored policy (D4RL's count, as the full configs' RLEvalCallback)
TEST_EPISODES = 10


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
        offline: OfflineData = OFFLINE_DATA,
        demos: DemoSelection = ALL_TRANSITIONS,
        scaling: Scaling = UNSCALED,
        buffer_capacity: int = 1_000_000,
        terminate_when_unhealthy: bool | None = None,
    ):
        """``env_id``: a registered gymnasium env (actions rescaled to [−1, 1]); ``buffer_capacity``: the most
        rows the online replay buffer holds (it is never larger than the module's online budget);
        ``terminate_when_unhealthy``: passed to MuJoCo envs that take it (None: the env's default)."""
        super().__init__()
        self.save_hyperparameters()
        self.env_id = env_id
        self.offline_data = as_config(OfflineData, offline, "RLDataModule.offline")
        self.demos = as_config(DemoSelection, demos, "RLDataModule.demos")
        self.scaling = as_config(Scaling, scaling, "RLDataModule.scaling")
        self.buffer_capacity, self.terminate_when_unhealthy = int(buffer_capacity), terminate_when_unhealthy
        check_env_available(env_id)
        if self.offline_data.level is not None and self.offline_data.level not in LEVELS:
            raise ValueError(f"offline.level={self.offline_data.level!r} is not one of {LEVELS}")
        if self.demos.subsampling_rate < 1:
            raise ValueError(f"demos.subsampling_rate must be >= 1, got {self.demos.subsampling_rate}")
        self.data_file, self.data_seed = self._resolve_dataset()
        self.total_iterations = 0  # the module's plan (``plan``) sets the loop's length
        self.iteration = 0
        self.steps_per_batch = 1  # iterations per loader batch; the module sets it (``set_steps_per_batch``)
        self.cadences: set[int] = set()  # chunks end at every multiple of these (``align_to``)
        self.chunk_ends: set[int] = set()  # and at each of these iterations (``end_chunk_at``)
        self.env = None  # the training env, built in ``setup``
        self.offline: dict[str, torch.Tensor] | None = None
        self.online: ReplayBuffer | None = None
        self.collector: Collector | None = None
        self._pending_state: dict | None = None

    def _resolve_dataset(self) -> tuple[Path | None, int | None]:
        """The offline data file and, for a set generated per run seed, the seed it is drawn with."""
        data = self.offline_data
        if data.path:
            path = Path(data.path).expanduser()
            if not path.exists():
                raise DatasetUnavailableError(
                    f"data set {path} does not exist. Generate one locally with `litlab data "
                    f"d4rl --env {self.env_id} --level medium --out {path}`, or give the path of "
                    "a D4RL/Minari HDF5 file you have"
                )
            return path, None
        if data.level is None:
            return None, None
        if not data.generate:
            path = dataset_path(self.env_id, data.level)
            if not path.exists():
                raise missing_dataset_error(self.env_id, data.level, path, "offline.generate is false")
            return path, None
        if self.env_id not in ANALYTIC_ENVS:
            raise missing_dataset_error(
                self.env_id,
                data.level,
                dataset_path(self.env_id, data.level),
                f"only {', '.join(ANALYTIC_ENVS)} are generated per run seed; for the shared file set "
                "offline.generate: false",
            )
        seed = derive_seed("data")  # resolved once: seed_everything has run before the CLI builds the module
        return dataset_path(self.env_id, data.level, seed=seed), seed

    @property
    def env_kwargs(self) -> dict:
        """Arguments of ``make_env`` beyond the id, for the training env and evaluation envs alike."""
        return {"terminate_when_unhealthy": self.terminate_when_unhealthy}

    # ---- data ------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Generate this run seed's analytic data set on first use (the Trainer calls this before ``setup``)."""
        if self.data_seed is not None and not self.data_file.exists():
            data = self.offline_data
            cached_dataset(self.env_id, data.level, data.size, self.data_seed, per_seed=True)

    def setup(self, stage: str | None = None) -> None:
        if self.env is not None:
            return
        scaling = self.scaling
        self.env = make_env(self.env_id, **self.env_kwargs)
        obs_dim, act_dim = env_dims(self.env)
        self.obs_scale = torch.tensor(scaling.obs_scale, dtype=torch.float32) if scaling.obs_scale else None
        if self.obs_scale is not None and self.obs_scale.numel() != obs_dim:
            raise ValueError(
                f"scaling.obs_scale has {self.obs_scale.numel()} entries, {self.env_id} observations have "
                f"{obs_dim}"
            )
        self.reward_scale = scaling.reward_scale
        if self.data_file is not None:
            self.prepare_data()  # a no-op when the Trainer ran it; here for direct ``setup()`` calls
            self.offline = self._load_offline(self.data_file, obs_dim, act_dim)
        self.obs_dim, self.act_dim = obs_dim, act_dim

    def plan(self, iterations: int, env_steps: int) -> None:
        """The module's loop: ``iterations`` in all (the loader yields ``0 .. iterations − 1``), of which at most
        ``env_steps`` step the env (the replay buffer holds ``min(buffer_capacity, env_steps)`` rows). Builds the
        replay buffer and the training env's collector (seeded from the run's ``env`` stream); a checkpointed
        state restored before this is applied here."""
        if iterations < 0 or env_steps < 0:
            raise ValueError(f"a loop needs iterations, env_steps >= 0, got {iterations}, {env_steps}")
        if self.env is None:
            raise RuntimeError("RLDataModule.plan needs setup() first (the env's dimensions)")
        self.total_iterations = int(iterations)
        if self.collector is None:
            self.online = ReplayBuffer(
                self.obs_dim, self.act_dim, min(self.buffer_capacity, max(int(env_steps), 1))
            )
            self.collector = Collector(
                self.env, self.online, derive_seed("env"), self.obs_scale, self.reward_scale
            )
        if self._pending_state is not None:
            self.load_state_dict(self._pending_state)

    def _load_offline(self, path: Path, obs_dim: int, act_dim: int) -> dict[str, torch.Tensor]:
        scaling, demos = self.scaling, self.demos
        data = load_dataset(path)
        # what identifies the content, whoever wrote the file: its arrays
        record_artefact("data", fingerprint({k: torch.as_tensor(v) for k, v in data.items()}))
        if scaling.iql_reward_norm:
            returns = episode_returns(data)
            if len(returns) < 2 or returns.max() == returns.min():
                raise ValueError(
                    f"{path}: iql_reward_norm needs >= 2 complete episodes with different returns"
                )
            self.reward_scale = scaling.reward_scale * 1000.0 / float(returns.max() - returns.min())
        if data["observations"].shape[1] != obs_dim or data["actions"].shape[1] != act_dim:
            raise ValueError(
                f"{path}: observation/action dims {data['observations'].shape[1]}/{data['actions'].shape[1]} "
                f"do not match {self.env_id} ({obs_dim}/{act_dim})"
            )
        keep = np.ones(len(data["rewards"]), bool)
        if demos.num_episodes is not None:
            keep &= data["episode"] < demos.num_episodes
        if (
            demos.subsampling_rate > 1
        ):  # GAIL/DAC convention: every n-th transition of each demo from an offset
            offset = demos.subsampling_offset
            if offset is None:
                offset = int(
                    np.random.default_rng(derive_seed("data.subsample")).integers(demos.subsampling_rate)
                )
            first = np.r_[0, np.flatnonzero(np.diff(data["episode"])) + 1]
            pos = np.arange(len(keep)) - first[data["episode"]]
            keep &= (pos % demos.subsampling_rate) == offset
        if not keep.any():
            raise ValueError(
                f"{path}: no transitions left after demos.num_episodes={demos.num_episodes}, "
                f"demos.subsampling_rate={demos.subsampling_rate}"
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
            raise RuntimeError("this run has no offline data set (offline.level and offline.path are None)")
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

    def end_chunk_at(self, iteration: int) -> None:
        """No chunk crosses ``iteration`` (a method's phase switch: what runs between batches sees it)."""
        if iteration > 0:
            self.chunk_ends.add(int(iteration))

    def chunk_end(self, start: int) -> int:
        """The end (exclusive) of the chunk of iterations that starts at ``start``: ``start +
        steps_per_batch``, cut at the end of the run, at each iteration given to ``end_chunk_at`` and at the
        next multiple of each registered cadence."""
        stop = min(start + self.steps_per_batch, self.total_iterations)
        for end in self.chunk_ends:
            if start < end:
                stop = min(stop, end)
        for every in self.cadences:
            stop = min(stop, (start // every + 1) * every)
        return stop

    def chunk(self, start: int) -> range:
        """The iterations of the chunk that starts at ``start``."""
        return range(int(start), self.chunk_end(int(start)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(StepIndexDataset(self), batch_size=None, num_workers=0)

    def test_dataloader(self) -> DataLoader:
        """``litlab test``: the indices of the evaluation episodes, one per batch (the module plays each)."""
        return DataLoader(torch.arange(TEST_EPISODES), batch_size=None, num_workers=0)

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
        if self.collector is None:  # restored before the module's plan: applied there
            self._pending_state = state
            return
        self._pending_state = None
        self.iteration = int(state["iteration"])
        self.online.load_state_dict(state["online"])
        self.collector.load_state_dict(state["collector"])
