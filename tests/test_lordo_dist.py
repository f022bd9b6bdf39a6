"""LoRDO strategy (arXiv 2602.04396) on 2 gloo processes: no per-step traffic and identical ranks after a sync,
DDP equals the joint batch, the averaging identity, the byte ledger, stagnation at ω = 1, checkpoint/resume.

One ``torch.multiprocessing.spawn`` of 2 ranks runs several Lightning fits back to back, the way torchrun or srun
would (``LOCAL_RANK``/``WORLD_SIZE`` set, so Lightning launches nothing and reuses the process group): one
start-up for all checks. Each rank dumps what it saw to ``tmp_path``; pytest asserts on the files.
"""

import os
import socket

import lightning as L
import pytest
import torch
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader, Dataset

from litlab.lit_modules.lowcomm.lordo import LoRDOLMModule, LowRankSetup, TinyDecoder
from litlab.lit_modules.lowcomm.optim import is_left
from litlab.strategies.lordo import LoRDOStrategy

K = 8
TINY_NET = TinyDecoder(vocab_size=97, d_model=16, n_layers=1, n_heads=2, mlp_hidden=32, block_size=16)


def tiny(qh_omega: float = 0.97, **kwargs) -> LoRDOLMModule:
    return LoRDOLMModule(net=TINY_NET, low_rank=LowRankSetup(rank=4, qh_omega=qh_omega), lr=1e-2, **kwargs)


class RandomTokens(Dataset):
    def __init__(self, n: int = 4096, block: int = 16, seed: int = 0):
        self.ids = torch.randint(0, 97, (n, block + 1), generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i, :-1], "labels": self.ids[i, 1:]}


class Recorder(L.Callback):
    """Parameters after step 1 and after each sync; the inner step of each sync."""

    def __init__(self):
        self.params, self.sync_steps = {}, []

    def on_train_batch_end(self, trainer, pl_module, *args):
        s = trainer.strategy
        theta = parameters_to_vector(pl_module.parameters()).detach().clone()
        if s.inner_step == 1:
            self.params[1] = theta
        if len(self.sync_steps) < s.num_syncs:
            self.sync_steps.append(s.inner_step)
            self.params[s.inner_step] = theta


class RecordingStrategy(LoRDOStrategy):
    """Keeps this rank's pre-sync parameters and the post-sync result."""

    def outer_sync(self, optimizer):
        self.pre_sync = parameters_to_vector(self._params()).detach().clone()
        super().outer_sync(optimizer)
        self.post_sync = parameters_to_vector(self._params()).detach().clone()


def fit(strategy, model, steps, callbacks=(), ckpt_path=None, root=None, batch_size=8):
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=list(callbacks),
        default_root_dir=root,
    )
    trainer.fit(model, DataLoader(RandomTokens(), batch_size=batch_size, shuffle=True), ckpt_path=ckpt_path)
    return trainer


class LinearSGD(L.LightningModule):
    """mean-squared error of a linear map, plain SGD."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(6, 3)

    def training_step(self, batch, _):
        x, y = batch
        return (self.lin(x) - y).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def ddp_data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(5, 16, 6, generator=g), torch.randn(5, 16, 3, generator=g)


def worker(rank: int, port: int, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        NODE_RANK="0",
        OMP_NUM_THREADS="1",
    )
    res = {}
    L.seed_everything(0)
    # checks 1, 3 (average), 6: lordo, K = 8, 24 steps
    rec, strat = Recorder(), RecordingStrategy(mode="lordo", sync_every=K)
    model = tiny()
    fit(strat, model, 24, [rec])
    res["lordo"] = dict(
        params=rec.params,
        sync_steps=rec.sync_steps,
        ledger=strat.ledger.state_dict(),
        pre=strat.pre_sync,
        post=strat.post_sync,
        total=strat.ledger.total,
        low=[tuple(p.shape) for n, p in model.model.named_parameters() if n in model.low_rank_names],
        P=sum(p.numel() for p in model.parameters()),
    )
    # (Nesterov with outer lr 1, momentum 0 == averaging)
    strat = RecordingStrategy(mode="diloco", sync_every=4, outer="nesterov", outer_lr=1.0, outer_momentum=0.0)
    fit(strat, tiny(optimizer="adamw"), 4)
    res["nesterov"] = dict(pre=strat.pre_sync, post=strat.post_sync)
    # DDP mode, 2 ranks x 8 rows of each 16-row batch
    x, y = ddp_data()
    model = LinearSGD()
    strat = LoRDOStrategy(mode="ddp")
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strat,
        max_steps=5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    shard = list(zip(x[:, rank * 8 : (rank + 1) * 8], y[:, rank * 8 : (rank + 1) * 8]))
    trainer.fit(model, DataLoader(shard, batch_size=None))
    res["ddp"] = dict(
        params=parameters_to_vector(model.parameters()).detach().clone(),
        total=strat.ledger.total,
        P=sum(p.numel() for p in model.parameters()),
    )
    # stagnation with omega = 1 (weight decay 0, EF on), and its absence with omega = 0.97
    for omega in (1.0, 0.97):
        strat = LoRDOStrategy(mode="lordo", sync_every=4)
        fit(strat, tiny(qh_omega=omega, weight_decay=0.0), 24)
        res[f"similarity_{omega}"] = list(strat.similarities)
        res[f"metrics_{omega}"] = strat.comm_metrics()
    # checkpoint/resume at a step that is not a sync: the resumed run syncs at the same steps
    root = os.path.join(out, "resume")
    L.seed_everything(0)
    trainer = fit(LoRDOStrategy(mode="lordo", sync_every=K), tiny(), 12, root=root)
    ckpt = os.path.join(root, "step12.ckpt")
    trainer.save_checkpoint(ckpt)
    rec, strat = Recorder(), LoRDOStrategy(mode="lordo", sync_every=K)
    rec.sync_steps = [8]  # the sync the first attempt did
    model = tiny()
    fit(strat, model, 24, [rec], ckpt_path=ckpt, root=root)
    opt = model.trainer.optimizers[0]
    res["resumed"] = dict(
        sync_steps=rec.sync_steps,
        total=strat.ledger.total,
        inner_step=strat.inner_step,
        has_projectors=opt.projectors_ready(),
        saved_inner=torch.load(ckpt, weights_only=True)["lowcomm"]["inner_step"],
    )
    torch.save(res, os.path.join(out, f"rank{rank}.pt"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("lordo_dist")
    torch.multiprocessing.spawn(worker, args=(_free_port(), str(out)), nprocs=2, join=True)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_no_per_step_traffic_and_bitwise_equal_after_sync(ranks):
    """3 syncs in 24 steps, no gradient all-reduce; ranks differ after step 1, equal after syncs."""
    a, b = ranks[0]["lordo"], ranks[1]["lordo"]
    assert a["sync_steps"] == [8, 16, 24] and b["sync_steps"] == [8, 16, 24]
    assert a["ledger"]["calls"].get("pseudo_gradient") == 3 and "gradient" not in a["ledger"]["calls"]
    assert not torch.equal(a["params"][1], b["params"][1])
    for step in (8, 16, 24):
        assert torch.equal(a["params"][step], b["params"][step]), (
            f"ranks differ right after the sync at {step}"
        )


def test_averaging_identity(ranks):
    """θ after sync = mean of the ranks' pre-sync θᵐ, for plain averaging and Nesterov(1, 0)."""
    for key in ("lordo", "nesterov"):
        pre_mean = (ranks[0][key]["pre"] + ranks[1][key]["pre"]) / 2
        assert torch.allclose(ranks[0][key]["post"], pre_mean, atol=1e-6), key
        assert torch.equal(ranks[0][key]["post"], ranks[1][key]["post"])


def test_ddp_mode_equals_single_process_on_the_joint_batch(ranks):
    """5 SGD steps, 2 ranks x 8 rows == one process on the 16 rows (mean-reduced gradients)."""
    x, y = ddp_data()
    ref = LinearSGD()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for i in range(5):
        opt.zero_grad()
        ref.training_step((x[i], y[i]), i).backward()
        opt.step()
    expected = parameters_to_vector(ref.parameters()).detach()
    for r in ranks:
        assert torch.allclose(r["ddp"]["params"], expected, atol=1e-5)
    assert ranks[0]["ddp"]["total"] == 5 * 4 * ranks[0]["ddp"]["P"]  # DDP: steps·b·P


def test_byte_ledger_matches_the_formula(ranks):
    """bytes = S·B_sync + b·P_lr (start-up projector), B_sync = b[P + P_lr + 2Σ r·d_i + 2 P_fr]."""
    res, b, r = ranks[0]["lordo"], 4, 4  # batch 4 per rank, rank r = 4 (tiny())
    P = res["P"]
    P_lr = sum(p * q for p, q in res["low"])
    r_d = sum(r * (q if is_left(torch.Size((p, q))) else p) for p, q in res["low"])
    B_sync = b * (P + P_lr + 2 * r_d + 2 * (P - P_lr))
    assert res["total"] == 3 * B_sync + b * P_lr
    assert res["ledger"]["bytes"]["projector_init"] == b * P_lr


def test_stagnation_with_omega_one_and_exploration_with_qh(ranks):
    """ω = 1 → every refresh after the first has similarity 1 (1e-5); ω = 0.97 → < 0.99 at least once."""
    stuck, moving = ranks[0]["similarity_1.0"], ranks[0]["similarity_0.97"]
    assert len(stuck) == 6 and all(abs(s - 1.0) < 1e-5 for s in stuck[1:]), stuck
    assert min(moving[:5]) < 0.99, moving
    # what the card's *_sim_min entries read: the extremes over the refreshes after the first
    for omega, sims in ((1.0, stuck), (0.97, moving)):
        metrics = ranks[0][f"metrics_{omega}"]
        assert metrics["lordo/subspace_similarity_min"] == min(sims[1:])
        assert metrics["lordo/subspace_similarity_max"] == max(sims[1:])


def test_resume_keeps_sync_schedule_anchor_and_optimizer_state(ranks):
    res = ranks[0]["resumed"]
    assert res["saved_inner"] == 12 and res["inner_step"] == 24
    assert res["sync_steps"] == [8, 16, 24]
    assert res["has_projectors"]
    assert res["total"] == ranks[0]["lordo"]["total"]  # same ledger as the uninterrupted run
