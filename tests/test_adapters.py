"""Adapter core invariants (merge/unmerge, per-module ranks, hooks; LoKRA's adapter modes)."""

import pytest
import torch
from torch import nn

from litlab.lit_modules.core.adapters import (
    AdapterLinear,
    adapter_parameters,
    find_adapters,
    inject_adapters,
    load_adapters,
    save_adapters,
    snapshot_factors,
    transform_adapter_grads,
    transform_adapter_updates,
)
from litlab.lit_modules.core.models import TinyGPT, tiny_llama

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
KINDS = [("lora", {}), ("khatri_rao", {})]


def _gpt(seed=0):
    torch.manual_seed(seed)
    return TinyGPT(vocab_size=97, d_model=32, n_layers=2, n_heads=4, block_size=16).eval()


def _tokens(n=3, t=16, seed=1):
    return torch.randint(0, 97, (n, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind,extra", KINDS)
def test_zero_init_identity_and_freezing_on_tiny_gpt(kind, extra):
    model, x = _gpt(), _tokens()
    before = model(x)
    adapted = inject_adapters(model, TARGETS, rank=4, alpha=8.0, kind=kind, **extra)
    assert len(adapted) == 12 and all(isinstance(m, AdapterLinear) for m in adapted.values())
    assert torch.equal(model(x), before)  # ΔW = 0 exactly at init: bit-for-bit
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".branches." in n for n in trainable)
    assert {id(p) for p in adapter_parameters(adapted)} == {
        id(p) for p in model.parameters() if p.requires_grad
    }


@pytest.mark.parametrize("kind", ["lora", "khatri_rao"])
def test_zero_init_identity_on_hf_llama(kind):
    torch.manual_seed(0)
    model = tiny_llama(
        vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64
    ).eval()
    x = _tokens()
    before = model(x).logits
    adapted = inject_adapters(model, ["q_proj", "v_proj", "down_proj"], rank=4, kind=kind)
    assert len(adapted) == 6 and "model.layers.0.self_attn.q_proj" in adapted
    assert torch.allclose(model(x).logits, before, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["lora", "khatri_rao"])
def test_base_weights_bitwise_unchanged_after_training_steps(kind):
    model, x = _gpt(), _tokens()
    adapted = inject_adapters(model, TARGETS, rank=4, kind=kind)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.AdamW(adapter_parameters(adapted), lr=1e-2)
    for _ in range(5):
        loss = model(x).logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for n, p in model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), n
    assert any(
        b.factors()[k].abs().sum() > 0
        for m in adapted.values()
        for b in m.branches.values()
        for k in b.factors()
    )


@pytest.mark.parametrize("kind", ["lora", "khatri_rao"])
def test_merge_unmerge_round_trip(kind):
    model, x = _gpt(), _tokens()
    adapted = inject_adapters(model, TARGETS, rank=4, kind=kind)
    with torch.no_grad():
        for p in adapter_parameters(adapted):
            p.normal_(0, 0.2)
    base_weights = {n: m.base.weight.detach().clone() for n, m in adapted.items()}
    unmerged = model(x)
    assert not torch.allclose(unmerged, _gpt()(x), atol=1e-3)  # the adapters do something
    for m in adapted.values():
        m.merge()
    assert torch.allclose(model(x), unmerged, atol=1e-5)
    with pytest.raises(RuntimeError, match="already merged"):
        next(iter(adapted.values())).merge("default")
    for m in adapted.values():
        m.unmerge()
    for n, m in adapted.items():  # the round trip restores W₀ to float32 rounding
        assert torch.allclose(m.base.weight, base_weights[n], atol=1e-6, rtol=0)
    assert torch.allclose(model(x), unmerged, atol=1e-5)


def test_merge_with_coefficients_and_remove():
    layer = AdapterLinear(nn.Linear(6, 5))
    branch = layer.add_branch("t0", rank=3, alpha=3.0)
    with torch.no_grad():
        branch.B.normal_()
    coeff = torch.tensor([1.0, 0.0, 2.0])
    expected = layer.base.weight + branch.B @ torch.diag(coeff) @ branch.A
    layer.merge("t0", coeff=coeff, remove=True)
    assert torch.allclose(layer.base.weight, expected, atol=1e-6)
    assert "t0" not in layer.branches


def test_rank_dict_gives_exact_parameter_count():
    model = _gpt()
    plan = {"blocks.0.attn.q_proj": 2, "blocks.1.attn.q_proj": 5, "v_proj": 3, "default": 0}
    adapted = inject_adapters(model, ["q_proj", "v_proj", "up_proj"], rank=plan)
    assert set(adapted) == {
        "blocks.0.attn.q_proj",
        "blocks.1.attn.q_proj",
        "blocks.0.attn.v_proj",
        "blocks.1.attn.v_proj",
    }
    assert adapted["blocks.1.attn.q_proj"].branches["default"].rank == 5
    expected = sum(m.branches["default"].rank * (m.in_features + m.out_features) for m in adapted.values())
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected == (2 + 5 + 3 + 3) * 64


def test_rank_dict_without_entry_names_the_module():
    with pytest.raises(KeyError, match="blocks.0.attn.k_proj"):
        inject_adapters(_gpt(), ["k_proj"], rank={"q_proj": 4})


def test_unknown_target_error_lists_linear_modules():
    with pytest.raises(ValueError, match=r"match no linear module.*blocks\.0\.attn\.q_proj"):
        inject_adapters(_gpt(), ["query"])


def test_regex_targets_and_keep_trainable():
    model = _gpt()
    adapted = inject_adapters(model, r"blocks\.1\.mlp\..*", rank=2, keep_trainable=["lm_head"])
    assert list(adapted) == ["blocks.1.mlp.up_proj", "blocks.1.mlp.down_proj"]
    assert model.lm_head.weight.requires_grad and not model.blocks[0].attn.q_proj.weight.requires_grad


def test_second_injection_adds_a_branch_not_a_wrapper():
    model = _gpt()
    inject_adapters(model, ["q_proj"], rank=2, branch="task0")
    adapted = inject_adapters(model, ["q_proj"], rank=3, branch="task1")
    layer = adapted["blocks.0.attn.q_proj"]
    assert list(layer.branches) == ["task0", "task1"] and isinstance(layer.base, nn.Linear)
    assert len(find_adapters(model)) == 2


def test_save_load_adapters_apart_from_base(tmp_path):
    model, x = _gpt(), _tokens()
    adapted = inject_adapters(model, TARGETS, rank=4, kind="khatri_rao")
    with torch.no_grad():
        for p in adapter_parameters(adapted):
            p.normal_(0, 0.1)
    path = save_adapters(adapted, tmp_path / "adapters.safetensors", extra={"method": "lokra_plus"})
    assert path.stat().st_size < sum(p.numel() for p in model.parameters()) * 4  # factors only, not the base
    fresh = _gpt()
    load_adapters(fresh, path)
    assert torch.allclose(fresh(x), model(x), atol=1e-6)
    with pytest.raises(ValueError, match="not a litlab adapter file"):
        from safetensors.torch import save_file

        save_file({"w": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
        load_adapters(_gpt(), tmp_path / "other.safetensors")


def test_input_second_moment_statistics():
    layer = AdapterLinear(nn.Linear(4, 3))
    layer.add_branch("default", rank=2)
    layer.stats_mode = "accumulate"
    x1, x2 = torch.randn(5, 4), torch.randn(2, 7, 4)
    layer(x1)
    layer(x2)
    flat = torch.cat([x1, x2.reshape(-1, 4)]).double()
    assert layer.n_tokens == 19
    assert torch.allclose(layer.input_second_moment, flat.T @ flat / 19, atol=1e-12)


def test_orthonormal_in_complement_init():
    V, _ = torch.linalg.qr(torch.randn(16, 5))
    layer = AdapterLinear(nn.Linear(16, 8))
    branch = layer.add_branch("default", rank=4, init="orthonormal_in_complement", complement_basis=V)
    A = branch.A.detach()
    assert torch.allclose(A @ A.T, torch.eye(4), atol=1e-5) and (A @ V).abs().max() < 1e-5
    assert torch.equal(layer.delta_weight(), torch.zeros(8, 16))


def test_gradient_and_update_hooks():
    model, x = _gpt(), _tokens()
    adapted = inject_adapters(model, ["q_proj"], rank=2)
    model(x).sum().backward()
    transform_adapter_grads(adapted, lambda m, b, br, g: {k: torch.zeros_like(v) for k, v in g.items()})
    assert all(p.grad.abs().sum() == 0 for p in adapter_parameters(adapted))
    before = snapshot_factors(adapted)
    with torch.no_grad():
        for p in adapter_parameters(adapted):
            p.add_(1.0)
    transform_adapter_updates(
        adapted, before, lambda m, b, br, old, new: {"A": old["A"]}
    )  # undo A's update only
    layer = adapted["blocks.0.attn.q_proj"].branches["default"]
    assert torch.equal(layer.A, before[("blocks.0.attn.q_proj", "default")]["A"])
    assert torch.equal(layer.B, before[("blocks.0.attn.q_proj", "default")]["B"] + 1.0)


def test_bad_branch_arguments_are_named():
    layer = AdapterLinear(nn.Linear(8, 8))
    with pytest.raises(ValueError, match="rank must be >= 1, got 0"):
        layer.add_branch("a", rank=0)
    with pytest.raises(ValueError, match="unknown branch kind 'dora'"):
        layer.add_branch("b", kind="dora")
    with pytest.raises(ValueError, match="unknown adapter init 'xavier'"):
        layer.add_branch("c", init="xavier")
    with pytest.raises(TypeError, match="wraps nn.Linear, got Conv1d"):
        AdapterLinear(nn.Conv1d(2, 2, 1))


def test_float32_factors_on_a_bfloat16_base():
    layer = AdapterLinear(nn.Linear(8, 4).to(torch.bfloat16))
    branch = layer.add_branch("default", rank=2)
    with torch.no_grad():
        branch.B.normal_()
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and branch.A.dtype == torch.float32
    expected = layer.base(x).float() + x.float() @ branch.delta_weight().T
    assert torch.allclose(y.float(), expected, atol=0.1)


def test_merged_state_survives_a_state_dict_round_trip():
    model, x = _gpt(), _tokens()
    adapted = inject_adapters(model, ["q_proj"], rank=2)
    with torch.no_grad():
        for p in adapter_parameters(adapted):
            p.normal_(0, 0.2)
    expected = model(x)
    for m in adapted.values():
        m.merge()
        m.merge()  # merging "all" again skips what is merged already
    state = model.state_dict()
    fresh = _gpt(seed=5)
    inject_adapters(fresh, ["q_proj"], rank=2)
    fresh.load_state_dict(state)
    assert torch.allclose(fresh(x), expected, atol=1e-5)  # not counted twice
    for m in find_adapters(fresh).values():
        m.unmerge()
    assert torch.allclose(fresh(x), expected, atol=1e-5)
