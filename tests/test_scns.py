"""SCNS (Submodular Concept Neuron Selection, ICML 2026): the acceptance checks of its reconstruction.

Fast: facility-location invariants, greedy correctness (lazy = naive, plain greedy, (1 - 1/e) bound), risk
steering, the stopping rule, the Fisher closed form, the row-delta branch, the config parse and the full-scale
config failing offline. The toy-task checks (sparsity / freezing, fusion-free) run one short stream on a tiny
base; the effect checks against the baselines are ``slow`` (they are the card's claims, run by
``litlab repro scns``).
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from litlab.lit_modules.diffusion.neurons import (
    RowDeltaBranch,
    attach_row_deltas,
    diag_empirical_fisher,
    ground_set,
    merge_row_deltas,
    neuron_fisher,
    per_sample_row_grads,
)
from litlab.lit_modules.diffusion.scns import accumulate_risk, general_neurons, similarity
from litlab.lit_modules.diffusion.submodular import (
    FacilityLocation,
    cost_aware_greedy,
    plain_greedy,
    risk_costs,
)

ROOT = Path(__file__).resolve().parents[1]


def random_fl(n: int, seed: int) -> FacilityLocation:
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(n, n, generator=g, dtype=torch.float64) ** 2
    s.fill_diagonal_(1.0)
    w = torch.rand(n, generator=g, dtype=torch.float64)
    return FacilityLocation(s, w / w.sum())


# ---- §7.1 facility location -------------------------------------------------------------------------
def test_facility_location_by_hand():
    s = torch.tensor([[1.0, 0.5, 0.0], [0.2, 1.0, 0.8], [0.0, 0.4, 1.0]])
    w = torch.tensor([0.5, 0.3, 0.2])
    fl = FacilityLocation(s, w)
    assert fl.value([]) == 0.0
    assert fl.value([1]) == pytest.approx(0.5 * 0.5 + 0.3 * 1.0 + 0.2 * 0.4)
    assert fl.value([0, 2]) == pytest.approx(0.5 * 1.0 + 0.3 * 0.8 + 0.2 * 1.0)
    cur = fl.update(fl.empty(), 1)
    # gain(0 | {1}) = 0.5·(1 − 0.5) + 0.3·relu(0.2 − 1) + 0.2·relu(0 − 0.4) = 0.25
    assert fl.gain(cur, 0) == pytest.approx(0.25)
    assert float(fl.gains(cur)[0]) == pytest.approx(0.25)


@pytest.mark.parametrize("seed", range(5))
def test_facility_location_invariants(seed):
    fl = random_fl(15, seed)
    g = torch.Generator().manual_seed(100 + seed)
    assert fl.value([]) == 0.0
    assert fl.value(range(15)) == pytest.approx(1.0, abs=1e-6)
    for _ in range(20):
        perm = torch.randperm(15, generator=g).tolist()
        b_size = int(torch.randint(1, 13, (1,), generator=g))
        a_size = int(torch.randint(0, b_size + 1, (1,), generator=g))
        B, A, x = perm[:b_size], perm[:a_size], perm[b_size]
        assert fl.value(A) <= fl.value(A + [x]) + 1e-6  # monotone
        assert (
            fl.value(A + [x]) - fl.value(A) >= fl.value(B + [x]) - fl.value(B) - 1e-6
        )  # diminishing returns
        cur = fl.empty()
        for v in A:
            cur = fl.update(cur, v)
        gains = fl.gains(cur)
        assert float(gains[x]) == pytest.approx(fl.value(A + [x]) - fl.value(A), abs=1e-6)
        assert fl.gain(cur, x) == pytest.approx(fl.value(A + [x]) - fl.value(A), abs=1e-6)


# ---- §7.2 greedy correctness ----------------------------------------------------------------------
def test_lazy_equals_naive_on_50_instances():
    for seed in range(50):
        n = 8 + seed % 17
        fl = random_fl(n, seed)
        g = torch.Generator().manual_seed(1000 + seed)
        costs = torch.randint(1, 5, (n,), generator=g).double()
        risk = torch.rand(n, generator=g, dtype=torch.float64)
        kw = dict(lam=float(seed % 3) * 5.0, tau_cov=0.95, delta_min=1e-6)
        lazy = cost_aware_greedy(fl, costs, risk, lazy=True, **kw)
        naive = cost_aware_greedy(fl, costs, risk, lazy=False, **kw)
        assert lazy.selected == naive.selected, seed
        assert lazy.stop == naive.stop


def test_unit_costs_lambda0_is_plain_greedy():
    for seed in range(10):
        fl = random_fl(12, seed)
        k = 5
        res = cost_aware_greedy(
            fl, torch.ones(12), torch.rand(12), lam=0.0, tau_cov=2.0, delta_min=-1.0, max_size=k
        )
        assert res.selected == plain_greedy(fl, k)


def test_greedy_one_minus_one_over_e_of_brute_force():
    for seed in range(8):
        n, k = 10 + seed % 3, 3
        fl = random_fl(n, 200 + seed)
        opt = max(fl.value(c) for c in itertools.combinations(range(n), k))
        got = fl.value(plain_greedy(fl, k))
        res = cost_aware_greedy(
            fl, torch.ones(n), torch.zeros(n), lam=0.0, tau_cov=2.0, delta_min=-1, max_size=k
        )
        assert got >= (1 - 1 / math.e) * opt - 1e-9
        assert res.value >= (1 - 1 / math.e) * opt - 1e-9


# ---- §7.3 risk steering ----------------------------------------------------------------------------
def test_risk_steering():
    s = torch.eye(4, dtype=torch.float64)
    s[:, 1] = s[:, 0]  # candidates 0 and 1 have identical similarity columns
    s[1, 1] = 1.0
    s[0, 1] = 1.0
    w = torch.full((4,), 0.25, dtype=torch.float64)
    fl = FacilityLocation(s, w)
    risk = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    for lam in (0.1, 1.0, 10.0):
        res = cost_aware_greedy(fl, torch.ones(4), risk, lam=lam, tau_cov=0.4)
        assert res.selected[0] == 1  # the r = 0 twin goes first
    # r_max: never a neuron with r > 0.5
    for seed in range(10):
        fl = random_fl(14, seed)
        r = torch.rand(14, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        res = cost_aware_greedy(fl, torch.ones(14), r, lam=3.0, tau_cov=0.99, r_max=0.5, delta_min=0)
        assert all(r[v] <= 0.5 for v in res.selected)
        # lambda = 0: selection independent of the Fisher
        a = cost_aware_greedy(fl, torch.ones(14), r, lam=0.0, tau_cov=0.9)
        b = cost_aware_greedy(
            fl, torch.ones(14), torch.rand(14, dtype=torch.float64) * 100, lam=0.0, tau_cov=0.9
        )
        assert a.selected == b.selected
    assert torch.allclose(
        risk_costs(torch.tensor([2.0, 4.0]), torch.tensor([0.0, 1.0]), 10.0),
        torch.tensor([2 / 3, 4 / 3 * 11], dtype=torch.float64),
    )


# ---- §7.4 stopping rule ----------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(10))
def test_stopping_rule(seed):
    fl = random_fl(20, seed)
    g = torch.Generator().manual_seed(seed)
    costs = torch.randint(1, 4, (20,), generator=g).double()
    tau, budget, dmin = 0.85, [float("inf"), 6.0][seed % 2], 1e-4
    res = cost_aware_greedy(
        fl,
        costs,
        torch.rand(20, generator=g, dtype=torch.float64),
        lam=2.0,
        tau_cov=tau,
        budget=budget,
        delta_min=dmin,
    )
    assert fl.value(res.selected) == pytest.approx(res.value)
    assert res.value >= tau or res.spent >= budget or res.stop in ("delta_min", "exhausted")
    if res.stop == "cover":
        assert res.value >= tau
        assert fl.value(res.selected[:-1]) < tau  # minimal at its last pick
    if res.stop == "budget":
        assert res.spent >= budget


# ---- §7.5 Fisher closed form ----------------------------------------------------------------------
def test_fisher_closed_form_linear_model():
    torch.manual_seed(0)
    lin = nn.Linear(5, 3, bias=False)
    x = torch.randn(7, 5)
    tgt = torch.randn(7, 3)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn2 = nn.Module()
            self.attn2.to_k = lin

    model = Wrap()
    gs = ground_set(model, "kv")
    grads = per_sample_row_grads(model, gs, lambda: 0.5 * ((model.attn2.to_k(x) - tgt) ** 2).sum(1))
    fisher = diag_empirical_fisher(grads)["attn2.to_k"]
    with torch.no_grad():
        expected = (((lin(x) - tgt)[:, :, None] * x[:, None, :]) ** 2).mean(0)
    assert torch.allclose(fisher.float(), expected, atol=1e-5)
    per_neuron = neuron_fisher(gs, {"attn2.to_k": fisher})
    assert torch.allclose(per_neuron, fisher.sum(1))
    assert lin.weight.grad is None


def test_risk_accumulates_max_normalised():
    om = accumulate_risk(torch.zeros(3, dtype=torch.float64), torch.tensor([1.0, 4.0, 2.0]))
    om = accumulate_risk(om, torch.tensor([10.0, 0.0, 5.0]))
    assert torch.allclose(om, torch.tensor([1.25, 1.0, 1.0], dtype=torch.float64))


def test_similarity_and_general_by_hand():
    # probe 1 is 10x larger: raw cosine says all alike, the normalised centred version does not
    a = torch.tensor([[1.0, 2.0, 1.0], [10.0, 10.0, 20.0]])
    raw = similarity(a, "cosine")
    assert torch.all(raw > 0.85)
    s = similarity(a, "pearson")
    # normalised: [[0.75, 1.5, 0.75], [0.75, 0.75, 1.5]]; centred rows: n0 (0, 0), n1 (0.375, −0.375), n2 (−0.375, 0.375)
    assert torch.allclose(torch.diag(s), torch.ones(3, dtype=torch.float64))
    assert s[1, 2] == 0.0 and s[0, 1] == 0.0
    # z-scores within each layer: layer 1 [1, 1, 1, 9] -> max z = 6 / 4 = 1.5; layer 2 [5, 5, 5.1] -> 2/√3
    z = general_neurons([torch.tensor([[1.0, 1.0, 1.0, 9.0]] * 2), torch.tensor([[5.0, 5.0, 5.1]])], 1 / 7)
    assert z.tolist() == [3]


def test_row_delta_branch_merge_is_plain_linear():
    torch.manual_seed(0)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn2 = nn.Module()
            self.attn2.to_k = nn.Linear(6, 4, bias=False)
            self.attn2.to_v = nn.Linear(6, 4, bias=False)

    model = Wrap()
    w0 = model.attn2.to_k.weight.detach().clone()
    adapted = attach_row_deltas(model, {"attn2.to_k": torch.tensor([1, 3])})
    branch = adapted["attn2.to_k"].branches["rows"]
    assert isinstance(branch, RowDeltaBranch)
    with torch.no_grad():
        branch.delta.normal_()
    x = torch.randn(2, 5, 6)
    wrapped = model.attn2.to_k(x)
    merge_row_deltas(model, adapted)
    assert type(model.attn2.to_k) is nn.Linear
    assert torch.allclose(model.attn2.to_k(x), wrapped, atol=1e-6)
    changed = (model.attn2.to_k.weight != w0).any(1)
    assert changed.tolist() == [False, True, False, True]


# ---- configs ---------------------------------------------------------------------------------------
def test_quick_config_parses():
    from jsonargparse import ArgumentParser

    from litlab.datamodules.continual_concepts import ContinualConceptDataModule
    from litlab.lit_modules.diffusion.scns import SCNS

    cfg = yaml.safe_load((ROOT / "configs/scns/quick.yaml").read_text())
    parser = ArgumentParser()
    parser.add_class_arguments(SCNS, "model")
    parser.add_class_arguments(ContinualConceptDataModule, "data")
    ns = parser.parse_object({"model": cfg["model"]["init_args"], "data": cfg["data"]["init_args"]})
    assert ns.model.selection == "scns"
    assert cfg["model"]["class_path"] == "litlab.lit_modules.diffusion.scns.SCNS"


def test_full_config_fails_offline_naming_the_model(monkeypatch, tmp_path):
    from litlab.lit_modules.core.errors import ModelUnavailableError
    from litlab.lit_modules.diffusion.scns import SCNS

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    cfg = yaml.safe_load((ROOT / "configs/scns/full.yaml").read_text())
    model_id = cfg["model"]["init_args"]["pretrained_path"]
    assert model_id == "stable-diffusion-v1-5/stable-diffusion-v1-5"
    with pytest.raises(ModelUnavailableError, match="stable-diffusion-v1-5/stable-diffusion-v1-5"):
        SCNS(pretrained_path=model_id)


def test_concept_folder_missing_fails_at_once(tmp_path):
    from litlab.datamodules.continual_concepts import ContinualConceptDataModule

    with pytest.raises(FileNotFoundError, match="images/<concept>"):
        ContinualConceptDataModule(data_root=str(tmp_path / "cifc"))


# ---- §7.6 sparsity / freezing and §7.7 fusion-free, on a tiny two-concept stream ----------------------
def test_toy_stream_sparsity_freezing_fusion_free(monkeypatch, tmp_path, quiet_trainer):
    import lightning as L

    from litlab.callbacks.frozen_guard import FrozenParamGuard
    from litlab.datamodules.continual_concepts import ContinualConceptDataModule, token_id
    from litlab.lit_modules.core.seeding import derive_seed, seed_ledger
    from litlab.lit_modules.diffusion.ddpm import TinyT2IConfig, pretrained_tiny_t2i
    from litlab.lit_modules.diffusion.scns import SCNS, SelectionConfig

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path / "cache"))
    L.seed_everything(0)
    base_cfg = TinyT2IConfig(pretrain_steps=3, pretrain_batch=4)
    dm = ContinualConceptDataModule(num_concepts=2, steps_per_task=3, batch_size=4, heldout_per_concept=2)
    model = SCNS(base=base_cfg, select=SelectionConfig(num_probes=4, fisher_samples=4), lr_rows=0.05)
    decays = []

    class WatchOptimizer(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if module._opt is not None:
                decays.extend(g["weight_decay"] for g in module._opt.param_groups)

    guard = FrozenParamGuard(["model"], exclude=[r"attn2\.to_[kv]\.", "token_embedding"])  # as quick.yaml
    trainer = quiet_trainer(
        max_epochs=2, reload_dataloaders_every_n_epochs=1, callbacks=[WatchOptimizer(), guard]
    )
    trainer.fit(model, datamodule=dm)  # the guard raises if a tensor outside K/V and the token rows changed
    assert len(guard.before["model"]) > 250 and guard.changed(model) == {"model": []}
    assert decays and all(d == 0.0 for d in decays)
    base = pretrained_tiny_t2i(base_cfg, dm, derive_seed("backbone"))  # the cached base, as before task 1
    before, after = base.state_dict(), model.model.state_dict()
    # fusion-free: same keys and shapes as the base, every projection a plain nn.Linear again
    assert list(before) == list(after)
    assert all(before[k].shape == after[k].shape for k in before)
    assert all(type(model.model.unet.get_submodule(n)) is nn.Linear for n in model.gs.modules)
    selected = sorted({n for s in model.selections for n in s})
    allowed = model.gs.split(selected)
    emb = next(k for k in before if k.endswith("token_embedding.weight"))
    for key in before:
        diff = (
            (before[key] != after[key]).reshape(before[key].shape[0], -1).any(1) if before[key].ndim else None
        )
        if key == emb:
            assert set(torch.nonzero(diff).flatten().tolist()) <= {token_id("<V0>"), token_id("<V1>")}
        elif key.removeprefix("unet.").removesuffix(".weight") in allowed:
            rows = set(torch.nonzero(diff).flatten().tolist())
            assert rows and rows <= set(allowed[key.removeprefix("unet.").removesuffix(".weight")].tolist())
        else:
            assert diff is None or not bool(diff.any()), key
    # the logged fraction is |S_t| c / |UNet| and equals the measured diff of each task (the guard's)
    for t, info in enumerate(model.task_log):
        assert info["changed_frac"] == pytest.approx(len(model.selections[t]) * 32 / model.unet_params)
        assert info["measured_changed_frac"] == pytest.approx(info["changed_frac"])
    # what is kept per concept: indices, one Fisher float per neuron, token rows
    assert model.omega.shape == (model.gs.size,)
    assert trainer.callback_metrics["val/changed_frac"] > 0
    # every random part drew its stream from the run seed, by name (the run's seed ledger)
    streams = {"backbone", "data", "data.order", "prompts", "probes", "fisher", "eval"}
    assert streams <= set(seed_ledger()["components"])


def test_a_checkpoint_inside_a_task_is_refused_on_load_naming_the_way_out(
    tmp_path, monkeypatch, quiet_trainer
):
    """Inside a task the row branches, the token hook and the task's optimizer live only in the process: a
    mid-task checkpoint (mid-epoch, or written at a preemption) cannot resume exactly, so loading it says so."""
    import lightning as L

    from litlab.datamodules.continual_concepts import ContinualConceptDataModule
    from litlab.lit_modules.core.errors import CheckpointError
    from litlab.lit_modules.diffusion.ddpm import TinyT2IConfig
    from litlab.lit_modules.diffusion.scns import SCNS, SelectionConfig

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path / "cache"))
    L.seed_everything(0)

    def build() -> SCNS:
        return SCNS(
            base=TinyT2IConfig(pretrain_steps=3, pretrain_batch=4),
            select=SelectionConfig(num_probes=4, fisher_samples=4),
        )

    model = build()
    dm = ContinualConceptDataModule(num_concepts=2, steps_per_task=3, batch_size=4, heldout_per_concept=2)
    quiet_trainer(max_steps=1, default_root_dir=str(tmp_path)).fit(
        model, datamodule=dm
    )  # 1 of task 0's 3 steps
    mid_task: dict = {"global_step": 1}
    model.on_save_checkpoint(mid_task)
    with pytest.raises(CheckpointError, match="middle of a concept's task.*epoch-end checkpoint"):
        build().on_load_checkpoint(mid_task)
    boundary: dict = {}
    model.merge_rows(0, dm)  # the task's end: no branch left
    model.on_save_checkpoint(boundary)
    build().on_load_checkpoint(boundary)  # a task boundary loads


# ---- one run seed: the data's streams, by name -------------------------------------------------------
def test_data_streams_follow_the_run_seed(monkeypatch):
    """The renders, held-out noise, base-preservation set, calibration prompts and batch order are the run
    seed's (the same for the same seed, other for another seed), each from its named stream."""
    from litlab.datamodules.continual_concepts import ContinualConceptDataModule
    from litlab.lit_modules.core.seeding import reset_ledger, seed_ledger

    def world(seed: int):
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        reset_ledger(seed)
        dm = ContinualConceptDataModule(
            num_concepts=2, images_per_concept=2, heldout_per_concept=2, batch_size=2
        )
        tensors = [
            dm.task_images(0),
            dm.heldout(1)[2],
            dm.base_eval_set()[0],
            next(iter(dm.train_dataloader()))[0],
        ]
        return tensors, dm.calibration_prompts(), seed_ledger()

    (a, prompts_a, ledger), (again, prompts_again, _), (b, prompts_b, _) = world(0), world(0), world(1)
    assert all(torch.equal(x, y) for x, y in zip(a, again)) and prompts_a == prompts_again
    assert not any(torch.equal(x, y) for x, y in zip(a, b)) and prompts_a != prompts_b
    assert set(ledger["components"]) == {"data", "data.order", "prompts"} and ledger["run_seed"] == 0


def test_concept_order_picks_each_tasks_concept_and_names_a_bad_order():
    """``concept_order`` maps task t to an entry of CONCEPTS (token <V_t>, that entry's shape as class word);
    the default is entry t; a repeated or out-of-range entry is refused, naming the order."""
    from litlab.datamodules.continual_concepts import CONCEPTS, ContinualConceptDataModule

    dm = ContinualConceptDataModule(num_concepts=3, concept_order=[0, 7, 1])
    assert [dm.concept_prompt(t) for t in range(3)] == ["a <V0> circle", "a <V1> circle", "a <V2> square"]
    assert dm.concept(1)["pattern"] == CONCEPTS[7][1]
    default = ContinualConceptDataModule(num_concepts=2)
    assert [dm.concept(t)["shape"] for t in range(2)] == [CONCEPTS[0][0], CONCEPTS[7][0]]
    assert [default.concept(t)["shape"] for t in range(2)] == [CONCEPTS[0][0], CONCEPTS[1][0]]
    for bad in ([0, 0, 1], [0, 1, 99], [0, 1]):
        with pytest.raises(ValueError, match=str(bad).replace("[", r"\[").replace("]", r"\]")):
            ContinualConceptDataModule(num_concepts=3, concept_order=bad)


def test_backbone_seed_pins_one_base_for_every_run_seed(monkeypatch):
    """Without ``backbone_seed`` each run seed pre-trains its own base (the "backbone" stream); with it every run
    seed gets the base of that one stream, and the ledger records it."""
    from types import SimpleNamespace

    import litlab.lit_modules.diffusion.harness as harness
    from litlab.datamodules.continual_concepts import ContinualConceptDataModule
    from litlab.lit_modules.core.seeding import reset_ledger, seed_ledger
    from litlab.lit_modules.diffusion.scns import SCNS

    class Built(Exception):
        pass

    def base_seed(run_seed: int, backbone_seed: int | None) -> int:
        monkeypatch.setenv("PL_GLOBAL_SEED", str(run_seed))
        reset_ledger(run_seed)
        seeds = []

        def pretrained(cfg, dm, seed):
            seeds.append(seed)
            raise Built

        monkeypatch.setattr(harness, "pretrained_tiny_t2i", pretrained)
        model = SCNS(backbone_seed=backbone_seed)
        model._trainer = SimpleNamespace(datamodule=ContinualConceptDataModule(num_concepts=2))
        with pytest.raises(Built):
            model.setup("fit")
        assert seed_ledger()["components"]["backbone"] == seeds[0]
        return seeds[0]

    assert base_seed(0, None) != base_seed(1, None)
    assert base_seed(0, 0) == base_seed(1, 0) == 0
    assert base_seed(0, 5) == 5


def test_contract_declares_every_datamodule_member_the_family_reads():
    """Every ``dm.<member>`` that a file of the diffusion family reads is a member of its contract's Protocols
    (no DataModule member read around the contract)."""
    import ast

    from litlab.lit_modules.diffusion.contract import ConceptStreamData, VideoSRData

    declared = set()
    for proto in (ConceptStreamData, VideoSRData):
        declared |= set(proto.__annotations__) | {n for n in vars(proto) if not n.startswith("_")}
    read = set()
    for path in (ROOT / "lit_modules/diffusion").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "dm":
                read.add((path.name, node.attr))
    assert read and {attr for _, attr in read} >= {"data_root", "frame_size", "token_ids", "base_eval_set"}
    assert not sorted(r for r in read if r[1] not in declared)


def test_frontier_keeps_the_runs_nothing_beats_on_both_axes():
    from litlab.lit_modules.diffusion.report import frontier

    # run -> (plasticity, forgetting): higher PL and lower FG are better
    points = {"a": (1.0, 0.5), "b": (2.0, 1.0), "c": (1.5, 1.2), "d": (2.0, 1.0), "e": (0.5, 0.5)}
    assert frontier(points) == ["a", "b", "d"]  # c is beaten by b, e by a; equal points beat neither


# ---- the card's report: sample grids per concept and the frontier ------------------------------------
def _tiny_stream(quiet_trainer, tmp_path: Path, name: str, samples: int, **model_kw):
    """A two-concept stream on a 3-step base; returns (run folder, final metrics)."""
    import json

    import lightning as L

    from litlab.datamodules.continual_concepts import ContinualConceptDataModule
    from litlab.lit_modules.diffusion.ddpm import TinyT2IConfig
    from litlab.lit_modules.diffusion.harness import SamplingConfig
    from litlab.lit_modules.diffusion.scns import SCNS, SelectionConfig

    L.seed_everything(0)
    run_dir = tmp_path / name
    dm = ContinualConceptDataModule(num_concepts=2, steps_per_task=2, batch_size=4, heldout_per_concept=2)
    model = SCNS(
        base=TinyT2IConfig(pretrain_steps=3, pretrain_batch=4),
        select=SelectionConfig(num_probes=4, fisher_samples=4, lambda_risk=model_kw.pop("lam", 10.0)),
        lr_rows=0.05,
        sampling=SamplingConfig(per_concept=samples, steps=20),
        **model_kw,
    )
    trainer = quiet_trainer(
        max_epochs=2, reload_dataloaders_every_n_epochs=1, default_root_dir=str(run_dir), deterministic=True
    )
    trainer.fit(model, datamodule=dm)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps({"status": "finished", "metrics": metrics}))
    return run_dir, metrics


def test_report_writes_sample_grid_and_frontier(monkeypatch, tmp_path, quiet_trainer):
    from safetensors.torch import load_file

    from litlab.lit_modules.core.results import CardResult, RunResult, SeedRun
    from litlab.lit_modules.diffusion.report import CONCEPT_SAMPLES_FILE
    from litlab.lit_modules.diffusion.scns import report

    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path / "cache"))
    scns_dir, with_samples = _tiny_stream(quiet_trainer, tmp_path, "scns10", samples=2)
    _, without = _tiny_stream(quiet_trainer, tmp_path, "scns10_nosamples", samples=0)
    kv_dir, _ = _tiny_stream(quiet_trainer, tmp_path, "all", samples=2, selection="all")
    sweep_dir, _ = _tiny_stream(quiet_trainer, tmp_path, "scns1000", samples=0, lam=1000.0)
    # the samples use their own generator: every number of the stream is the same without them
    assert with_samples == without
    assert not (tmp_path / "scns10_nosamples" / CONCEPT_SAMPLES_FILE).exists()
    s, kv = load_file(str(scns_dir / CONCEPT_SAMPLES_FILE)), load_file(str(kv_dir / CONCEPT_SAMPLES_FILE))
    assert sorted(s) == sorted(f"{kind}_{k}" for kind in ("ref", "base", "after", "final") for k in (0, 1))
    for v in s.values():
        assert v.shape == (2, 3, 16, 16) and float(v.abs().max()) <= 1.0
    # same base, same noise per concept: the base column is one column for every method; the last concept's
    # samples right after its task are its samples after the last task (another batch: equal up to rounding)
    for k in (0, 1):
        assert torch.equal(s[f"base_{k}"], kv[f"base_{k}"])
    torch.testing.assert_close(s["after_1"], s["final_1"], atol=1e-4, rtol=0)
    assert not torch.equal(s["after_0"], kv["after_0"])  # another update, another sample

    def entry(name: str, run_dir: Path) -> RunResult:
        return RunResult(name, "val/forgetting", [0], [0.0], 0.0, 0.0, [SeedRun(0, 0.0, run_dir)])

    runs = {"scns10": scns_dir, "full_kv": kv_dir, "scns1000": sweep_dir}
    result = CardResult(
        slug="scns",
        title="t",
        claim="c",
        scale="quick",
        seeds=[0],
        metric_name="val/forgetting",
        metric_mode="min",
        runs={n: entry(n, d) for n, d in runs.items()},
        date="2026-12-04",
        wall_time_s=0.0,
    )
    out = tmp_path / "report"
    out.mkdir()
    extras = report(result, out)
    assert [p.name for p in extras.figures] == ["scns_frontier.png", "scns_samples.png"]
    for p in extras.figures:
        assert p.exists() and p.stat().st_size > 1000
    # every run of the result, by its card name; the sample grid shows the runs that saved samples
    assert all(f"| {n} |" in extras.markdown for n in runs) and "### Samples per concept" in extras.markdown
    assert "scns10, full_kv. Each sample" in extras.markdown


def test_step_benchmark_times_the_quick_backbone():
    """``litlab bench scns_step``: the quick config's UNet (272,515 parameters, as its header says) and a positive
    CPU time per step; the K/V weights it differentiates are exactly the ``kv`` ground set."""
    from litlab.benchmarks.scns_step import measure

    res = measure(steps=2, warmup=1)
    assert res["unet_params"] == 272_515 and 0 < res["step_cpu_s_min"] <= res["step_cpu_s_median"]
