"""LoDA (arXiv 2603.00191) checks that need the model: the merge, fixed down-projections, GAO, the statistics
bookkeeping and the ridge. The energy objectives' algebra is tested in tests/test_subspace.py, the effect on
the card by the generic slow card test (tests/test_cards_slow.py)."""

import pytest
import torch

from litlab.datamodules.continual import ContinualDataModule
from litlab.lit_modules.continual.harness import Backbone
from litlab.lit_modules.continual.loda import LoDA

FAST = dict(backbone=Backbone(pretrain_epochs=2))


def _dm():
    dm = ContinualDataModule(epochs_per_task=1, batch_size=32)
    dm.setup()
    return dm


def _start(module, dm, lr=0.01, momentum=0.9):
    torch.manual_seed(0)
    module.build(dm)
    params = module.configure_optimizers().param_groups[0]["params"]
    module._standalone_opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    return module._standalone_opt


def _train_task(module, dm, t, opt):
    opt.state.clear()
    module.on_task_start(t, dm)
    for batch in dm.task_train_loader(t, batch_size=32):
        module.cl_step(batch, opt, lambda loss: loss.backward())
    return module.on_task_end(t, dm)


def test_merge_preserves_function_up_to_recalibration():
    """With c = 1 outputs agree before/after merging (1e-5); with c, W equals the explicit formula."""
    dm, module = _dm(), LoDA(**FAST)
    _start(module, dm)
    module.on_task_start(1, dm)
    torch.manual_seed(1)
    with torch.no_grad():
        for layer in module.adapted.values():
            for b in layer.branches.values():
                b.B.normal_(0, 0.1)
    x = dm.test_sets[0][0][:16]
    module.eval()
    before = module.backbone.forward_features(x)
    layers = list(module.adapted.values())
    for layer in layers:
        layer.fold_in("general")
        layer.fold_in("isolated")
    assert torch.allclose(module.backbone.forward_features(x), before, atol=1e-5)
    layer = layers[0]
    S, P = layer.branches["general"], layer.branches["isolated"]
    with torch.no_grad():
        S.B.normal_(0, 0.1)
        P.B.normal_(0, 0.1)
    c = torch.tensor([1.0, 0.3, 0.0, 0.7])
    W = layer.base.weight.detach().clone()
    expected = (
        W
        + module.g_S * S.B.detach() @ torch.diag(c) @ S.A.detach()
        + module.g_P * P.B.detach() @ P.A.detach()
    )
    layer.fold_in("general", coeff=c)
    layer.fold_in("isolated")
    assert torch.allclose(layer.base.weight, expected, atol=1e-6)


def test_down_projections_frozen_and_old_heads_unchanged():
    """For t >= 1 A_S, A_P are bit-identical before/after training; only B_S, B_P and the current head
    train."""
    dm, module = _dm(), LoDA(**FAST)
    opt = _start(module, dm)
    _train_task(module, dm, 0, opt)
    module.on_task_start(1, dm)
    A = {
        n: {k: layer.branches[k].A.detach().clone() for k in ("general", "isolated")}
        for n, layer in module.adapted.items()
    }
    head = module.head.detach().clone()
    for batch in dm.task_train_loader(1, batch_size=32):
        module.cl_step(batch, opt, lambda loss: loss.backward())
    current = dm.task_classes[1]
    for n, layer in module.adapted.items():
        for k in ("general", "isolated"):
            assert torch.equal(layer.branches[k].A, A[n][k]), (n, k)
            assert torch.count_nonzero(layer.branches[k].B) > 0, (n, k)
    old = [c for c in range(10) if c not in current]
    assert torch.equal(module.head[old], head[old])
    assert not torch.equal(module.head[current], head[current])
    assert torch.count_nonzero(module.adapted[next(iter(module.adapted))].branches["isolated"].A) > 0


def test_gao_with_zero_rho_is_two_plain_steps():
    """GAO with rho = 0 — one GAO batch equals two plain steps on the two class groups."""
    dm = _dm()
    gao, plain = LoDA(gao_rho_max=0.0, **FAST), LoDA(gao_enabled=False, **FAST)
    opt_g, opt_p = _start(gao, dm), _start(plain, dm)
    gao.on_task_start(0, dm)
    plain.on_task_start(0, dm)
    x, y = next(iter(dm.task_train_loader(0, batch_size=32)))
    torch.manual_seed(5)
    gao.cl_step((x, y), opt_g, lambda loss: loss.backward())
    torch.manual_seed(5)
    classes = y.unique()
    classes = classes[torch.randperm(len(classes))]
    first = torch.isin(y, classes[:1])
    for mask in (~first, first):  # GAO steps on the target group: g2 (src g1) first, then g1
        plain.cl_step((x[mask], y[mask]), opt_p, lambda loss: loss.backward())
    for (n, p), (_, q) in zip(gao.named_parameters(), plain.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), n


def test_gao_update_is_the_target_gradient_at_the_shifted_point():
    """GAO: the update equals −lr · ∇L_tgt(θ + e), e = ρ g_src/‖g_src‖, and θ is restored but for the step."""
    dm, module = _dm(), LoDA(**FAST)
    opt = _start(module, dm, lr=0.05, momentum=0.0)
    _train_task(module, dm, 0, opt)
    module.on_task_start(1, dm)
    x, y = next(iter(dm.task_train_loader(1, batch_size=32)))
    first = y == y[0]
    src, tgt, rho = (x[first], y[first]), (x[~first], y[~first]), -0.3
    params = module._shifted_params()
    trainable = opt.param_groups[0]["params"]
    theta = [p.detach().clone() for p in trainable]
    # manual: shift the B factors, take the target gradient there, restore, step
    g = torch.autograd.grad(module.loss(*src)[0], params)
    shifts = {id(p): rho * gi / (gi.norm() + 1e-12) for p, gi in zip(params, g)}
    with torch.no_grad():
        for p in params:
            p.add_(shifts[id(p)])
    grads = torch.autograd.grad(module.loss(*tgt)[0], trainable, allow_unused=True)
    with torch.no_grad():
        for p in params:
            p.sub_(shifts[id(p)])
    frozen = {id(layer.branches["general"].A) for layer in module.adapted.values()}  # A_S fixed for t >= 1
    expected = [
        t if (gi is None or id(p) in frozen) else t - 0.05 * gi for p, t, gi in zip(trainable, theta, grads)
    ]
    assert all(torch.equal(p, t) for p, t in zip(trainable, theta))  # the manual computation left θ as it was
    module.gao_half_step(src, tgt, rho, opt, lambda loss: loss.backward())
    for p, e in zip(trainable, expected):
        assert torch.allclose(p, e, atol=1e-6, rtol=0)


def test_statistics_bookkeeping():
    """After task t, M_prev is the sum of the step-(4) and step-(7) moments of tasks 0..t (float64)."""
    dm, module = _dm(), LoDA(**FAST)
    opt = _start(module, dm)
    recorded = []
    collect = module.collect_stats

    def spy(loader):
        out = collect(loader)
        recorded.append(out)
        return out

    module.collect_stats = spy
    for t in range(2):
        _train_task(module, dm, t, opt)
        # per task: (1) at start, (4) and (7) at the end
        ends = [r for i, r in enumerate(recorded) if i % 3 != 0]
        for n, M in module.M_prev.items():
            assert torch.allclose(M, sum(r[n] for r in ends), atol=1e-8, rtol=0), (t, n)


def test_ridge_keeps_the_isolated_branch_active_and_recalibration_shrinks():
    """Without the ridge the quotient picks near-null directions of M_prev (isolated branch inactive);
    with ridge 1e-3 the isolated directions carry a clearly larger share of the current task's energy."""
    dm, ratios = _dm(), {}
    for ridge in (0.0, 1e-3):
        module = LoDA(ridge=ridge, **FAST)
        opt = _start(module, dm)
        _train_task(module, dm, 0, opt)
        logs = _train_task(module, dm, 1, opt)
        ratios[ridge] = logs["loda/isolated_energy_ratio"]
        assert 0.0 < logs["loda/recal_coeff_mean"] < 1.0
    assert ratios[0.0] < 1e-4 and ratios[1e-3] > 10 * ratios[0.0] and ratios[1e-3] > 1e-3, ratios


def test_bad_configuration_is_named():
    with pytest.raises(ValueError, match="use_general"):
        LoDA(use_general=False, use_isolated=False)
