"""Shared RL core: replay buffer, HDF5 reader/writer (D4RL and Minari), scores, env factory, data factory,
data module, `litlab data d4rl`."""

import io
import math

import h5py
import numpy as np
import pytest
import torch

from litlab.datamodules.rl import DemoSelection, OfflineData, RLDataModule, Scaling
from litlab.datamodules.rl_d4rl import episode_returns, load_dataset, read_metadata, write_d4rl
from litlab.datamodules.rl_datasets import pendulum_swingup
from litlab.datamodules.rl_env import Collector, evaluate, make_env
from litlab.datamodules.rl_replay import ReplayBuffer
from litlab.lit_modules.core.errors import EnvUnavailableError
from litlab.lit_modules.rl.factory import make_dataset
from litlab.lit_modules.rl.nets import TanhGaussianActor
from litlab.lit_modules.rl.scores import D4RL_REF_SCORES, normalized_score, ref_returns

NO_OFFLINE_DATA = OfflineData(level=None)


@pytest.fixture(autouse=True)
def _run_seed_restored(monkeypatch):
    """``seed_everything`` exports the run seed (``PL_GLOBAL_SEED``); each test gets back the one it found."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")


def test_replay_ring_and_weights_only_state_dict():
    buf = ReplayBuffer(2, 1, capacity=5)
    for i in range(7):
        buf.add(obs=[i, i], act=[0.1 * i], rew=float(i), next_obs=[i + 1, i + 1], terminal=0.0)
    assert len(buf) == 5 and buf.ptr == 2
    state = buf.state_dict()
    assert state["rew"].tolist() == [2, 3, 4, 5, 6]  # oldest first
    blob = io.BytesIO()
    torch.save(state, blob)
    blob.seek(0)
    restored = ReplayBuffer(2, 1, capacity=5)
    restored.load_state_dict(torch.load(blob, weights_only=True))
    assert len(restored) == 5 and sorted(restored.data["rew"].tolist()) == [2, 3, 4, 5, 6]
    batch = restored.sample(16)
    assert batch["obs"].shape == (16, 2) and batch["terminal"].shape == (16,)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(2, 1, capacity=6).load_state_dict(state)


def test_tanh_gaussian_log_prob_matches_sample():
    torch.manual_seed(0)
    actor = TanhGaussianActor(3, 2, (16, 16))
    obs = torch.randn(64, 3)
    act, logp = actor.sample(obs)
    assert act.abs().max() < 1
    assert torch.allclose(actor.log_prob(obs, act, eps=1e-7), logp, atol=1e-3)


def test_d4rl_hdf5_roundtrip_keys_and_metadata(tmp_path):
    path = make_dataset(
        "Pendulum-v1", "medium", n_transitions=450, seed=3, out=tmp_path / "p.hdf5", log=lambda *a: None
    )
    with h5py.File(path) as f:  # D4RL v2 layout (arXiv 2004.07219)
        for key in (
            "observations",
            "actions",
            "next_observations",
            "rewards",
            "terminals",
            "timeouts",
            "infos/action_log_probs",
            "metadata/algorithm",
            "metadata/policy_return",
            "metadata/env_id",
            "metadata/seed",
        ):
            assert key in f, key
        assert (
            f["observations"].dtype == np.float32
            and f["terminals"].dtype == bool
            and f["timeouts"].dtype == bool
        )
    meta = read_metadata(path)
    assert meta["env_id"] == "Pendulum-v1" and meta["seed"] == 3
    data = load_dataset(path)
    assert data["observations"].shape == (450, 3) and data["actions"].shape == (450, 1)
    assert np.abs(data["actions"]).max() <= 1
    assert data["timeouts"].sum() == 3 and not data["terminals"].any()  # 200 + 200 + a cut 50-step episode
    assert np.allclose(
        data["next_observations"][:-1][~data["timeouts"][:-1]],
        data["observations"][1:][~data["timeouts"][:-1]],
    )
    assert len(episode_returns(data)) == 3


def test_minari_layout_loads_through_the_same_reader(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "main_data.hdf5"
    with h5py.File(path, "w") as f:
        for i, (T, term) in enumerate([(5, True), (4, False)]):
            g = f.create_group(f"episode_{i}")
            g["observations"] = rng.normal(size=(T + 1, 3)).astype(np.float32)
            g["actions"] = rng.uniform(-1, 1, (T, 1)).astype(np.float32)
            g["rewards"] = np.ones(T)
            g["terminations"] = np.r_[np.zeros(T - 1, bool), term]
            g["truncations"] = np.r_[np.zeros(T - 1, bool), not term]
    data = load_dataset(tmp_path)  # a Minari data-set folder works too
    assert (
        data["observations"].shape == (9, 3) and data["terminals"].sum() == 1 and data["timeouts"].sum() == 1
    )
    with h5py.File(path) as f:
        assert np.allclose(data["next_observations"][:5], f["episode_0/observations"][1:])
    assert episode_returns(data).tolist() == [5.0, 4.0]


def test_old_d4rl_file_without_next_observations(tmp_path):
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)
    write_d4rl(
        tmp_path / "old.hdf5",
        {
            "observations": obs,
            "actions": np.zeros((6, 1)),
            "rewards": np.ones(6),
            "terminals": np.array([0, 0, 1, 0, 0, 0], bool),
            "timeouts": np.array([0, 0, 0, 0, 0, 1], bool),
        },
        {"env_id": "x"},
    )
    data = load_dataset(tmp_path / "old.hdf5")
    assert len(data["observations"]) == 5  # the time-limited last row has no s'
    assert np.allclose(data["next_observations"][0], obs[1])


def test_reference_scores():
    assert ref_returns("Hopper-v4") == D4RL_REF_SCORES["hopper"] == (-20.272305, 3234.3)
    assert normalized_score("halfcheetah-medium-v2", 12135.0) == pytest.approx(100.0)
    assert normalized_score("Walker2d-v5", 1.629008) == pytest.approx(0.0)
    assert ref_returns("antmaze-medium-play-v2") == (0.0, 1.0)
    lo, hi = ref_returns("Pendulum-v1")  # measured, shipped in ref_scores.json
    assert -1300 < lo < -1100 and -200 < hi < -100
    assert ref_returns("Humanoid-v4", table="ngt") == (119.77, 6192.6)
    with pytest.raises(KeyError, match="litlab data d4rl"):
        ref_returns("MountainCarContinuous-v0")


def test_d4rl_reference_table_matches_d4rl_infos():
    try:
        import d4rl.infos as infos  # optional extra; `import d4rl` crashes without the MuJoCo 2.1 binary
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"d4rl not importable: {err}")
    for family, (lo, hi) in D4RL_REF_SCORES.items():
        if family == "antmaze":
            continue
        key = f"{family}-medium-v2"
        assert infos.REF_MIN_SCORE[key] == pytest.approx(lo) and infos.REF_MAX_SCORE[key] == pytest.approx(hi)


def test_env_factory_collector_and_evaluation():
    env = make_env("Pendulum-v1")
    assert env.action_space.low.tolist() == [-1.0] and env.action_space.high.tolist() == [1.0]
    buf = ReplayBuffer(3, 1, 500)
    col = Collector(env, buf, seed=0, reward_scale=0.1)
    for _ in range(250):
        col.step(None)
    assert col.env_steps == 250 and col.episodes == 1 and len(buf) == 250
    assert buf.data["terminal"][:250].sum() == 0  # Pendulum's time limit is truncation, not termination
    assert math.isclose(buf.data["rew"][:200].sum().item() * 10, col.last_episode_return, rel_tol=1e-4)
    returns = evaluate(pendulum_swingup, "Pendulum-v1", n_episodes=2)
    assert np.mean(returns) > -300  # the analytic expert swings up
    with pytest.raises(ValueError, match="not a registered"):
        make_env("NoSuchEnv-v0")


def test_pendulum_array_is_pendulum_v1_per_pendulum():
    """``PendulumArray`` with one pendulum at Pendulum-v1's motor limit follows gymnasium's Pendulum-v1 step
    for step; with n pendulums the reward is the mean of the n Pendulum-v1 rewards."""
    import gymnasium as gym

    from litlab.datamodules.rl_env import PendulumArray

    ref, one = gym.make("Pendulum-v1").unwrapped, PendulumArray(1, 2.0)
    assert np.array_equal(ref.reset(seed=3)[0], one.reset(seed=3)[0])
    rng = np.random.default_rng(0)
    for _ in range(200):
        u = rng.uniform(-2, 2, 1).astype(np.float32)
        (o1, r1, *_), (o2, r2, *_) = ref.step(u), one.step(u)
        assert np.allclose(o1, o2, atol=1e-5) and math.isclose(r1, r2, rel_tol=1e-5, abs_tol=1e-5)
    three, singles = PendulumArray(3, 1.0), [PendulumArray(1, 1.0) for _ in range(3)]
    three.reset(seed=0)
    for i, env in enumerate(singles):
        env.reset(seed=0)
        env.state = three.state[i : i + 1].copy()
    u = rng.uniform(-1, 1, 3)
    rewards = [env.step(u[i : i + 1])[1] for i, env in enumerate(singles)]
    assert math.isclose(three.step(u)[1], float(np.mean(rewards)), rel_tol=1e-9)


def test_generated_data_set_follows_the_run_seed_and_is_in_the_ledger(monkeypatch, tmp_path):
    """A generated set is drawn from the run's ``data`` stream (one file per run seed, reused by every run of
    that seed) and recorded as the artefact ``data``; a shared file (``generate: false``) is the same for every
    run seed, and its fingerprint says so."""
    import lightning as L

    from litlab.lit_modules.core.seeding import derive_seed, reset_ledger, seed_ledger

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))
    obs, ledgers = {}, {}
    for run, seed in (("a", 0), ("b", 0), ("c", 1)):
        L.seed_everything(seed, verbose=False)
        reset_ledger(seed)
        dm = RLDataModule(env_id="LowTorquePendulum-v0", offline=OfflineData(level="medium", size=400))
        dm.setup("fit")
        obs[run], ledgers[run] = dm.offline["obs"], seed_ledger()
        assert ledgers[run]["components"]["data"] == derive_seed("data") == dm.data_seed
    assert sorted(p.name for p in (tmp_path / "d4rl").glob("*.hdf5")) == sorted(
        f"LowTorquePendulum-v0-medium-seed{ledgers[run]['components']['data']}.hdf5" for run in "ac"
    )
    assert torch.equal(obs["a"], obs["b"]) and not torch.equal(obs["a"], obs["c"])
    assert (
        ledgers["a"] == ledgers["b"]
        and ledgers["a"]["artefacts"]["data"] != ledgers["c"]["artefacts"]["data"]
    )

    make_dataset("LowTorquePendulum-v0", "medium", n_transitions=300, seed=5, log=lambda *a: None)
    shared = {}
    for seed in (0, 1):
        L.seed_everything(seed, verbose=False)
        reset_ledger(seed)
        dm = RLDataModule(env_id="LowTorquePendulum-v0", offline=OfflineData(level="medium", generate=False))
        dm.setup("fit")
        assert dm.offline_size == 300 and "data" not in seed_ledger()["components"]
        shared[seed] = seed_ledger()["artefacts"]["data"]
    assert shared[0] == shared[1]  # the same file for every seed: a card must declare data shared


def test_mujoco_env_builds_or_says_how_to_install():
    try:
        env = make_env("Hopper-v4", terminate_when_unhealthy=False)
    except EnvUnavailableError as err:
        assert "gymnasium[mujoco]" in str(err)
        return
    assert env.observation_space.shape == (11,) and env.action_space.shape == (3,)
    env.reset(seed=0)
    env.step(env.action_space.sample())


def test_datamodule_subsamples_20_expert_transitions():
    dm = RLDataModule(
        env_id="Pendulum-v1",
        offline=OfflineData(level="expert"),
        demos=DemoSelection(num_episodes=1, subsampling_rate=10, subsampling_offset=3),
        scaling=Scaling(obs_scale=(1.0, 1.0, 8.0)),
    )
    dm.setup("fit")
    dm.plan(10, env_steps=10)
    assert dm.offline_size == 20 and dm.online.capacity == 10
    assert torch.equal(dm.offline["episode"], torch.zeros(20, dtype=torch.long))
    assert dm.offline["obs"][:, 2].abs().max() <= 1.0  # scaled by obs_scale
    dm.collect(None)
    assert dm.env_steps == 1 and len(dm.online) == 1
    state = dm.state_dict()
    assert set(state) == {"iteration", "collector", "online"} and state["online"]["size"] == 1


def test_missing_full_scale_dataset_fails_at_once(tmp_path):
    from litlab.lit_modules.core.errors import DatasetUnavailableError

    with pytest.raises(
        DatasetUnavailableError, match="litlab data d4rl --env Pendulum-v1 --level medium-expert"
    ):
        RLDataModule(env_id="Pendulum-v1", offline=OfflineData(level="medium-expert", generate=False))
    with pytest.raises(DatasetUnavailableError, match="does not exist"):
        RLDataModule(env_id="Pendulum-v1", offline=OfflineData(path=str(tmp_path / "nope.hdf5")))
    with pytest.raises(ValueError, match="offline.level"):
        RLDataModule(env_id="Pendulum-v1", offline={"level": "mediocre"})
    with pytest.raises(ValueError, match="unknown keys .'dataset_seed'."):
        RLDataModule(env_id="Pendulum-v1", offline={"level": "medium", "dataset_seed": 3})


def test_litlab_data_d4rl_command(tmp_path, capsys):
    from litlab.data import main

    out = tmp_path / "pend-random.hdf5"
    assert main(["d4rl", "--env", "Pendulum-v1", "--level", "random", "--n", "400", "--out", str(out)]) == 0
    assert load_dataset(out)["observations"].shape == (400, 3)
    assert main(["d4rl", "--info", str(out)]) == 0
    assert "400 transitions" in capsys.readouterr().out
    assert main(["d4rl", "--env", "Hopper-v4", "--level", "medium", "--policy", "analytic"]) == 2


def test_loop_benchmark_runs_both_loops():
    from litlab.benchmarks.rl_loop import benchmark

    res = benchmark(steps=120, rounds=1, hidden=[16, 16], batch_size=16, learning_starts=40)
    assert res["plain_steps_per_s_cpu"][0] > 0 and res["lightning_steps_per_s_cpu"][0] > 0
    assert res["overhead_ratio_cpu_median"] > 0


def test_sac_route_of_the_data_factory(tmp_path):
    """The route used for MuJoCo tasks (SAC trained here, medium = first snapshot at 1/3 of the expert
    return), exercised on Pendulum with a tiny budget: the pipeline, not the policy quality."""
    path = make_dataset(
        "Pendulum-v1",
        "medium-replay",
        n_transitions=200,
        policy="sac",
        sac_steps=300,
        out=tmp_path / "mr.hdf5",
        log=lambda *a: None,
        ref_episodes=3,
    )
    data = load_dataset(path)
    assert len(data["observations"]) <= 300 and data["timeouts"][-1]
    assert "SAC" in read_metadata(path)["algorithm"]


def test_replay_last_row_is_the_latest_add():
    buf = ReplayBuffer(2, 1, capacity=3)
    with pytest.raises(RuntimeError, match="empty"):
        buf.last()
    for i in range(5):  # wraps around the ring
        buf.add(obs=[i, -i], act=[0.0], rew=float(i), next_obs=[i, i], terminal=0.0)
    assert buf.last()["obs"].tolist() == [4.0, -4.0] and buf.last()["rew"].item() == 4.0


def test_rl_data_contract_names_the_class_and_the_missing_member(quiet_trainer):
    from litlab.lit_modules.core.errors import ContractError
    from litlab.lit_modules.rl.contract import check_rl_data
    from litlab.lit_modules.rl.ngt import BehaviorCloning

    class HalfData:
        env_id, obs_dim, act_dim = "Pendulum-v1", 3, 1

    with pytest.raises(ContractError, match=r"HalfData lacks 'obs_scale', which DARE needs"):
        check_rl_data(HalfData(), needs_offline=True, user="DARE")
    online_only = RLDataModule(env_id="Pendulum-v1", offline=NO_OFFLINE_DATA)
    online_only.setup("fit")
    check_rl_data(online_only, needs_offline=False, user="OnlineSAC")
    with pytest.raises(ContractError, match="RLDataModule holds no offline data"):
        check_rl_data(online_only, needs_offline=True, user="BehaviorCloning")
    trainer = quiet_trainer(max_epochs=1)
    with pytest.raises(ContractError, match="BehaviorCloning needs some"):
        trainer.fit(BehaviorCloning(hidden=(8, 8), steps=3), online_only)


def test_chunks_end_at_the_phase_switch_the_end_and_every_cadence():
    dm = RLDataModule(env_id="Pendulum-v1", offline=NO_OFFLINE_DATA)
    dm.setup("fit")
    dm.plan(55, env_steps=45)  # a module's loop: 10 offline iterations, then 45 env steps
    dm.end_chunk_at(10)
    dm.set_steps_per_batch(8)
    dm.align_to(25)
    dm.align_to(None)
    starts, i = [], 0
    while i < dm.total_iterations:
        starts.append(i)
        assert len(dm.chunk(i)) >= 1
        i = dm.chunk_end(i)
    assert starts == [0, 8, 10, 18, 25, 33, 41, 49, 50]
    with pytest.raises(ValueError, match="steps_per_batch must be >= 1"):
        dm.set_steps_per_batch(0)


@pytest.mark.parametrize("module", ["dare", pytest.param("ngt", marks=pytest.mark.slow)])
def test_steps_per_batch_changes_no_number_and_no_logging_step(module, tmp_path, quiet_trainer):
    """Several iterations per training_step (and one backward for disjoint losses) give bit for bit the
    weights, optimiser states, data-module state and logged (metric, step) entries of one iteration per
    step, with evaluation and checkpoint cadences that are not multiples of steps_per_batch."""
    import csv

    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from litlab.callbacks.rl_eval import RLEvalCallback
    from litlab.lit_modules.rl import dare, ngt

    def run(k: int, log_every_n_steps: int):
        L.seed_everything(0, verbose=False)
        if module == "dare":
            dm = RLDataModule(env_id="Pendulum-v1", offline=OfflineData(level="medium"))
            model = dare.DARE(
                offline_steps=12,
                online_steps=20,
                networks=dare.Networks(hidden=(8, 8)),
                optim=dare.Optim(batch_offline=8, batch_online=8),
                log_every=10,
                steps_per_batch=k,
            )
        else:
            dm = RLDataModule(
                env_id="Pendulum-v1",
                offline=OfflineData(level="expert"),
                demos=DemoSelection(num_episodes=1, subsampling_rate=10),
            )
            model = ngt.NGT(
                reward_model=ngt.RewardModel(hidden=(8, 8), out_emb_dim=4),
                sac=ngt.SACSettings(hidden=(8, 8)),
                schedule=ngt.Schedule(env_steps=50, batch_size=8, expert_batch_size=8, learning_starts=10),
                log_every=10,
                steps_per_batch=k,
            )
        out = tmp_path / f"k{k}"
        trainer = quiet_trainer(
            max_epochs=1,
            logger=CSVLogger(out, name="", version=""),
            log_every_n_steps=log_every_n_steps,
            callbacks=[
                RLEvalCallback(every_n_iterations=15, n_episodes=1, checkpoint_every_n_iterations=None)
            ],
        )
        trainer.fit(model, dm)
        with open(out / "metrics.csv") as f:
            logged = {
                (k, r["step"], v) for r in csv.DictReader(f) for k, v in r.items() if v and k != "epoch"
            }
        state = {
            **model.state_dict(),
            **{f"opt{i}": o.state_dict() for i, o in enumerate(trainer.optimizers)},
        }
        return state, dm.state_dict(), logged

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and torch.equal(a, b)
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b or (a != a and b != b)  # nan == nan

    one, many = run(1, 10), run(8, 1)
    assert same(many[0], one[0]) and same(many[1], one[1])
    assert many[2] == one[2] and any(k == "eval/return" for k, _, _ in one[2])
    # DARE logs from the first iteration, NGT after learning_starts
    train_steps = {"9", "19", "29"} if module == "dare" else {"19", "29", "39", "49"}
    assert {s for k, s, _ in one[2] if k.startswith("train/")} == train_steps


def test_missing_data_set_without_an_analytic_route_names_the_command(tmp_path, monkeypatch):
    from litlab.lit_modules.core.errors import DatasetUnavailableError

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))
    with pytest.raises(
        DatasetUnavailableError, match="litlab data d4rl --env MountainCarContinuous-v0 --level medium"
    ):
        RLDataModule(env_id="MountainCarContinuous-v0", offline=OfflineData(level="medium", generate=True))


def test_litlab_bench_rl_loop_entry_point(capsys):
    from litlab.bench import main

    args = ["rl_loop", "--steps", "30", "--rounds", "1", "--hidden", "8", "8", "--batch-size", "8"]
    assert main(args) == 0
    assert '"overhead_ratio_cpu_median"' in capsys.readouterr().out


def test_eval_callback_names_a_module_without_act():
    from litlab.lit_modules.core.errors import ContractError
    from litlab.lit_modules.rl.contract import check_acting_module

    class NoPhases:
        def act(self, obs, deterministic=False):
            return obs

    class NoPolicy:
        offline_iterations = 0

    with pytest.raises(
        ContractError, match="NoPhases lacks 'offline_iterations', which RLEvalCallback needs"
    ):
        check_acting_module(NoPhases(), user="RLEvalCallback")
    with pytest.raises(ContractError, match="NoPolicy lacks 'act', which RLEvalCallback needs"):
        check_acting_module(NoPolicy(), user="RLEvalCallback")
