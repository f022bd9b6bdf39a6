"""Janus-LoRA (arXiv 2605.28495) checks that need the model: A V constant over a task, the composite-update
invariant, the violation witness over all tasks, the decoupled margin loss (non-zero, and it moves the
factors), and where GR leaves the adapter its plasticity. The rectification's algebra is tested in
tests/test_subspace.py, the effect on the card by the generic slow card test."""

import copy

import pytest
import torch

from litlab.datamodules.continual import ContinualDataModule
from litlab.lit_modules.continual.baselines import LoRAGPM
from litlab.lit_modules.continual.harness import Backbone
from litlab.lit_modules.continual.janus_lora import JanusLoRA, decoupled_margin_loss

# a weak backbone is enough for the mechanism checks; cached per session
FAST = dict(backbone=Backbone(pretrain_epochs=2))


def _dm():
    dm = ContinualDataModule(epochs_per_task=1, batch_size=32)
    dm.setup()
    return dm


def _start(module, dm, opt_cls=torch.optim.SGD, **opt_kw):
    torch.manual_seed(0)
    module.build(dm)
    params = [p for p in module.configure_optimizers().param_groups[0]["params"]]
    module._standalone_opt = opt_cls(params, **(opt_kw or {"lr": 0.01, "momentum": 0.9}))
    return module._standalone_opt


def _train_task(module, dm, t, opt, epochs=1, each_step=None):
    opt.state.clear()
    module.on_task_start(t, dm)
    for _ in range(epochs):
        for batch in dm.task_train_loader(t, batch_size=32):
            before = {n: _factors(m) for n, m in module.adapted.items()}
            module.cl_step(batch, opt, lambda loss: loss.backward())
            if each_step:
                each_step(before)
    return module.on_task_end(t, dm)


def _factors(layer):
    b = layer.branches["default"]
    return b.A.detach().double().clone(), b.B.detach().double().clone(), b.scale


def _composite_violation(module, before):
    """max over layers of ‖(B'A' − BA) V‖_F / ‖B'A' − BA‖_F for one optimizer step."""
    worst = 0.0
    for n, layer in module.adapted.items():
        A0, B0, s = before[n]
        A1, B1, _ = _factors(layer)
        dW = s * (B1 @ A1 - B0 @ A0)
        V = module.memories[n].V
        if V.shape[1] and torch.linalg.matrix_norm(dW) > 0:
            worst = max(worst, float(torch.linalg.matrix_norm(dW @ V) / torch.linalg.matrix_norm(dW)))
    return worst


@pytest.mark.parametrize(
    "opt_cls,opt_kw", [(torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}), (torch.optim.Adam, {"lr": 1e-3})]
)
def test_composite_update_stays_orthogonal_after_real_optimizer_steps(opt_cls, opt_kw):
    """The issue's invariant: ΔW = B'A' − BA (not A, B separately) annihilates V to 1e-5 after every step."""
    dm, module = _dm(), JanusLoRA(factor_dtype="float64", dml_enabled=True, **FAST)
    opt = _start(module, dm, opt_cls, **opt_kw)
    _train_task(module, dm, 0, opt)
    assert min(m.k for m in module.memories.values()) > 0
    worst = []
    logs = _train_task(
        module, dm, 1, opt, each_step=lambda before: worst.append(_composite_violation(module, before))
    )
    assert len(worst) >= 5 and max(worst) <= 1e-5
    assert logs["cl/violation_max"] <= 1e-5  # the same witness, over the whole task, logged by the module


def test_invariant_A_V_constant_over_a_task_in_float32():
    """Over a full task of training, ‖A_end V − A_start V‖ < 1e-5 per layer (fp32 factors)."""
    dm, module = _dm(), JanusLoRA(**FAST)
    opt = _start(module, dm)
    _train_task(module, dm, 0, opt)
    V = {n: m.V.clone() for n, m in module.memories.items()}
    A_start = {n: l.branches["default"].A.detach().double().clone() for n, l in module.adapted.items()}
    _train_task(module, dm, 1, opt, epochs=2)
    for n, layer in module.adapted.items():
        A_end = layer.branches["default"].A.detach().double()
        assert torch.linalg.matrix_norm(A_end @ V[n] - A_start[n] @ V[n]) < 1e-5, n
        assert not torch.equal(A_end, A_start[n])  # it did train


def test_without_gr_the_update_leaks_into_the_protected_subspace():
    dm = _dm()
    for module in (
        JanusLoRA(gr_enabled=False, factor_dtype="float64", **FAST),
        LoRAGPM(factor_dtype="float64", **FAST),
    ):
        opt = _start(module, dm)
        _train_task(module, dm, 0, opt)
        assert _train_task(module, dm, 1, opt)["cl/violation_max"] > 1e-3


def test_tangent_mode_and_post_hoc_oe_run_and_stay_safe():
    dm, module = _dm(), JanusLoRA(gr_mode="tangent", oe_source="post", factor_dtype="float64", **FAST)
    opt = _start(module, dm)
    _train_task(module, dm, 0, opt)
    assert _train_task(module, dm, 1, opt)["cl/violation_max"] <= 1e-5


def test_dml_mechanism():
    """L_dml = 0 with no old prototypes; with an old prototype placed at the current feature L_dml > 0
    and one SGD step on the features lowers max cos(z, μ_old)."""
    g = torch.Generator().manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(8, 16, generator=g), dim=-1)
    head, y = torch.randn(4, 16, generator=g), torch.tensor([2, 3] * 4)
    assert decoupled_margin_loss(z, y, torch.zeros(0, 16), head, 0.1) == 0
    old = torch.stack([z[0], torch.nn.functional.normalize(torch.randn(16, generator=g), dim=0)])
    z = z.clone().requires_grad_(True)
    loss = decoupled_margin_loss(z, y, old, head, 0.1)
    assert loss > 0
    loss.backward()
    with torch.no_grad():
        z_new = torch.nn.functional.normalize(z - 0.5 * z.grad, dim=-1)
    assert (z_new @ old.T).max() < (z.detach() @ old.T).max()


def test_dml_is_off_on_the_first_task_and_on_afterwards():
    dm, module = _dm(), JanusLoRA(**FAST)
    opt = _start(module, dm)
    module.on_task_start(0, dm)
    x, y = next(iter(dm.task_train_loader(0, batch_size=16)))
    assert "loss_dml" not in module.cl_step((x, y), opt, lambda loss: loss.backward())
    module.on_task_end(0, dm)
    module.on_task_start(1, dm)
    x, y = next(iter(dm.task_train_loader(1, batch_size=16)))
    assert "loss_dml" in module.cl_step((x, y), opt, lambda loss: loss.backward())


def test_bad_switch_values_are_named():
    with pytest.raises(ValueError, match="gr_mode"):
        JanusLoRA(gr_mode="exact")
    with pytest.raises(ValueError, match="oe_source"):
        JanusLoRA(oe_source="later")


def test_dml_loss_is_non_zero_and_changes_the_factors():
    """From the same state and batch of task 2, one step with DML and one without: L_dml > 0 and the adapter
    factors (A; B is frozen by GR, see the next test) end up different, so DML is not inert in the update."""
    dm = _dm()
    module = JanusLoRA(factor_dtype="float64", **FAST)
    opt = _start(module, dm)
    _train_task(module, dm, 0, opt)
    module.on_task_start(1, dm)
    batch = next(iter(dm.task_train_loader(1, batch_size=32)))
    results = {}
    for dml in (True, False):
        m = copy.deepcopy(module)
        m.hparams.dml_enabled = dml
        params = [p for p in m.configure_optimizers().param_groups[0]["params"]]
        m._standalone_opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
        logs = m.cl_step(batch, m._standalone_opt, lambda loss: loss.backward())
        results[dml] = (logs, {n: _factors(layer) for n, layer in m.adapted.items()})
    assert float(results[True][0]["loss_dml"]) > 0 and "loss_dml" not in results[False][0]
    diff = max(float((results[True][1][n][0] - results[False][1][n][0]).norm()) for n in module.adapted)
    assert diff > 1e-6


def test_gr_freezes_B_once_A_reads_the_protected_subspace():
    """Why DML moved no prediction on the toy: after task 1 every row of the shared A reads V (A V of full
    rank), so exact safety leaves no rank direction where B may move (free_rank_dims = 0); B is bit-identical
    over task 2 and only A changes, inside the complement of V."""
    dm = _dm()
    module = JanusLoRA(factor_dtype="float64", **FAST)
    opt = _start(module, dm)
    assert _train_task(module, dm, 0, opt)["janus/free_rank_dims"] == module.hparams.rank
    B0 = {n: layer.branches["default"].B.detach().clone() for n, layer in module.adapted.items()}
    A0 = {n: layer.branches["default"].A.detach().clone() for n, layer in module.adapted.items()}
    assert _train_task(module, dm, 1, opt)["janus/free_rank_dims"] == pytest.approx(0.0, abs=1e-9)
    for n, layer in module.adapted.items():
        assert torch.allclose(layer.branches["default"].B.detach(), B0[n], atol=1e-12, rtol=0), n
        assert not torch.equal(layer.branches["default"].A.detach(), A0[n]), n


def test_violation_witness_is_the_max_over_tasks_and_layers():
    """cl/violation_max after the last task is the max of every task's per-layer max (not the last task's)."""
    dm = _dm()
    module = LoRAGPM(factor_dtype="float64", **FAST)
    opt = _start(module, dm)
    per_task, running = [], []
    for t in range(3):
        logs = _train_task(module, dm, t, opt)
        per_task.append(logs["cl/violation_task"])
        running.append(logs["cl/violation_max"])
    assert running == [max(per_task[: t + 1]) for t in range(3)]
    assert running[-1] > 1e-3
