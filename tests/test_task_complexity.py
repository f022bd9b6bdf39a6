"""Task complexity (analysis family): the strategies' bit accounting through the module (spec checks §7.1-7.6 on
the module's coder, LoRA layer and prequential loop; the closed forms of the maths are in test_complexity_coding),
the sums task, a fit + ``litlab analyze complexity`` on its checkpoint, and the effect checks of §7.7 (slow)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from litlab.datamodules.sums_task import SumsTaskDataModule, pretraining_text, task_pairs
from litlab.lit_modules.analysis import complexity_coding as TC
from litlab.lit_modules.analysis import task_complexity as T
from litlab.lit_modules.core.adapters import find_adapters

ROOT = Path(__file__).resolve().parent.parent
V = T.TOKENIZER.vocab_size


def _tiny(seed: int = 0):
    torch.manual_seed(seed)
    return T.SumsBase()._build().eval()


class _ZeroLogits(torch.nn.Module):
    block_size = 64

    def forward(self, x):
        return torch.zeros(*x.shape, V)


def _examples(monkeypatch, run_seed: int) -> list:
    monkeypatch.setenv("PL_GLOBAL_SEED", str(run_seed))
    return SumsTaskDataModule("words").examples()


def test_sums_task_universe_and_seeded_order(monkeypatch):
    pairs = task_pairs("words")
    assert len(pairs) == 50 and pairs[0] == ("5+0=", "five\n") and pairs[-1] == ("9+9=", "eighteen\n")
    assert task_pairs("digits")[-1] == ("9+9=", "18\n")
    a, b = _examples(monkeypatch, 0), _examples(monkeypatch, 1)  # the run seed's data.order stream
    assert sorted(a) == sorted(pairs) and a != b and a == _examples(monkeypatch, 0)
    lines = pretraining_text(4000, 0.25, 0).splitlines()
    words = sum(not line.split("=")[1].isdigit() for line in lines) / len(lines)
    assert len(lines) == 4000 and abs(words - 0.25) < 0.03


def test_prompt_bits_match_the_exact_arithmetic_coder():  # §7.1 through the module's log-probabilities
    model = _tiny().double()

    def probs(prefix):
        with torch.no_grad():
            return torch.softmax(model(torch.tensor([list(prefix)]))[0, -1], -1)

    for text in ("3+4=seven\n", "9+9=18\n1+2=three\n"):
        ids = T.TOKENIZER.encode(text).tolist()
        _, width, bits = TC.arithmetic_encode(ids, probs)
        payload = T.prompt_bits(model, text) - T.FIRST_TOKEN_BITS
        assert abs(payload - math.ceil(-math.log2(width))) <= 1
        # an arithmetic code is at most 2 bits over -log2(width); it can be shorter when the final interval
        # happens to hold a short binary fraction (seen: 100 bits for a width of 2^-102.3), so the bound is one-sided
        assert 0 < bits <= payload + 2


def test_uniform_model_prompt_payload():  # §7.2
    text = "5+5=ten\n6+1=seven\n"
    assert T.prompt_bits(_ZeroLogits(), text) == T.FIRST_TOKEN_BITS + TC.uniform_prompt_bits(len(text), V)
    long = "1+1=two\n" * 12  # longer than the context: scored with a sliding window, still uniform
    assert T.prompt_bits(_ZeroLogits(), long) == T.FIRST_TOKEN_BITS + TC.uniform_prompt_bits(len(long), V)
    # the released coder sends the first token free (the card's accounting since issue 34)
    assert T.prompt_bits(_ZeroLogits(), text, charge_first_token=False) == TC.uniform_prompt_bits(
        len(text), V
    )


def test_lora_accounting_frozen_base_and_trainable_factors():  # §7.3
    model = _tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = T.StrategyPlan(lora_rank=2)
    m, params = T.add_lora(model, plan)
    adapted = find_adapters(m)
    assert len(adapted) == 2 * 6  # q, k, v, o, up, down of each block (TinyGPT has no gate_proj)
    trainable = [p for p in m.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in params}
    assert TC.lora_payload_bits(params) == 16 * sum(
        2 * (a.in_features + a.out_features) for a in adapted.values()
    )
    base_before = {n: a.base.weight.clone() for n, a in adapted.items()}
    pairs = task_pairs("words")[:10]
    T.fit_examples(m, pairs, params, steps=3, lr=1e-2, batch_size=5, seed=0)
    assert all(torch.equal(a.base.weight, base_before[n]) for n, a in adapted.items())
    assert any(not torch.equal(p, torch.zeros_like(p)) for p in params if p.shape[1] <= 2)  # B moved off 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the source model untouched


def test_lora_q_at_16_bits_is_within_one_step_and_evaluates_dequantised():  # §7.4 on real LoRA factors
    m, params = T.add_lora(_tiny(), T.StrategyPlan())
    for p in params:
        x = torch.randn_like(p)
        _, deq = TC.quantize_uniform(x, 16)
        assert float((deq - x).abs().max()) <= float(x.max() - x.min()) / 65535 + 1e-7


def test_prequential_scores_each_batch_before_its_step_and_is_deterministic(monkeypatch):  # §7.5
    trace: list = []
    real_step = torch.optim.AdamW.step

    def spy(self, *a, **k):
        trace.append(("step", sum(1 for e in trace if e[0] == "step")))
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", spy)
    pairs = task_pairs("words")[:23]  # 3 batches of 10, 10, 3 in epoch 1
    model = _tiny()
    bits = T.fit_examples(model, pairs, list(model.parameters()), 7, 1e-3, 10, seed=0, code=True, trace=trace)
    assert trace[:6] == [("score", 0), ("step", 0), ("score", 1), ("step", 1), ("score", 2), ("step", 2)]
    assert [e for e in trace[6:] if e[0] == "score"] == [] and len(trace) == 6 + 4  # epochs 2+ add no bits
    model2 = _tiny()
    again = T.fit_examples(model2, pairs, list(model2.parameters()), 7, 1e-3, 10, seed=0, code=True)
    assert bits == again and bits > 23 * T.FIRST_TOKEN_BITS
    model3 = _tiny()  # the released coder: each example's first token free, 7 bits less per example exactly
    free = T.fit_examples(
        model3, pairs, list(model3.parameters()), 7, 1e-3, 10, seed=0, code=True, charge_first_token=False
    )
    assert bits - free == 23 * T.FIRST_TOKEN_BITS
    with pytest.raises(ValueError, match="one epoch"):
        T.fit_examples(_tiny(), pairs, [], 2, 1e-3, 10, seed=0, code=True)


def test_summary_reads_complexity_off_the_frontier():  # §7.6 on rows
    rows = [T._row("baseline", "", 0, 0.1), T._row("icl", "k=1", 16, 0.3), T._row("online", "n=5", 80, 0.5)]
    s = T.summarize(rows, (0.25, 0.5, 0.9))
    assert s["log2_C_025"] == 4.0 and s["log2_C_050"] == pytest.approx(math.log2(80))
    # not reached: censored (inf, never a stand-in length to average) and reached_090 = 0
    assert s["log2_C_090"] == math.inf and s["reached_090"] == 0.0 and s["max_perf"] == 0.5
    assert T.complexity_text(rows, (0.25, 0.9)) == "C(0.25) = 16 bits, C(0.90) not reached"
    pre = [T._row("online", "n=5", 800, 0.5)]
    assert T.reductions({"pretrained": pre, "posttrained": rows})["R_pretrained_to_posttrained"] == 10.0
    assert rows[1]["bits_total"] == rows[1]["bits_script"] + 16 == T.script_bits("icl") + 16


def test_fit_then_analyze_complexity_reproduces_the_logged_frontier(tmp_path, monkeypatch):
    from litlab.__main__ import main

    monkeypatch.chdir(ROOT)
    knobs = ["--model.init_args.plan.icl_k=[1]", "--model.init_args.plan.online_n=[5]"]
    knobs += ["--model.init_args.plan.steps=3", "--model.init_args.plan.lora_examples=5"]
    knobs += ["--model.init_args.plan.lora_bits=[2]"]
    # payload bits with the first token charged, as `litlab analyze complexity` counts (the card counts the authors')
    knobs += ["--model.init_args.count_script_bits=false", "--model.init_args.plan.charge_first_token=true"]
    args = ["fit", "--config", "configs/task_complexity/quick.yaml", f"--runs_dir={tmp_path}", "--run_id=pre"]
    args += ["--model.init_args.base.pretrain_steps=30", "--trainer.enable_progress_bar=false", *knobs]
    assert main(args) == 0
    run = tmp_path / "task_complexity" / "pre"
    logged = json.loads((run / "task_complexity.json").read_text())["rows"]
    assert [r["strategy"] for r in logged] == ["baseline", "icl", "online", "lora", "lora_q"]
    summary = json.loads((run / "summary.json").read_text())["metrics"]
    assert summary["tc/icl[k=1]/bits"] == logged[1]["bits_payload"] and "tc/log2_C_040" in summary
    out = tmp_path / "report"
    argv = [
        "analyze",
        "complexity",
        "--checkpoints",
        f"pre={run / 'checkpoints' / 'last.ckpt'}",
        f"post={run}",
    ]
    argv += ["--icl-k", "1", "--online-n", "5", "--steps", "3", "--lora-examples", "5", "--lora-bits", "2"]
    assert main(argv + ["--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["frontiers"]["pre"] == logged == res["frontiers"]["post"]  # the checkpoint holds the state
    assert (out / "frontier.png").exists() and "R_pretrained_to_posttrained" in (
        out / "report.md"
    ).read_text()


def test_full_config_fails_offline_naming_the_model(tmp_path, monkeypatch, capsys):
    from litlab.__main__ import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(ROOT)
    args = ["fit", "--config", "configs/task_complexity/full.yaml", f"--runs_dir={tmp_path}"]
    assert main(args + ["--trainer.accelerator=cpu", "--trainer.precision=32"]) != 0
    err = capsys.readouterr().err
    assert "HuggingFaceTB/SmolLM3-3B" in err and "hf download" in err


# ---- effect checks on the CPU recipe (spec §7.7; slow: three checkpoints and their frontiers, seed 0) -------------
@pytest.fixture(scope="module")
def frontiers():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PL_GLOBAL_SEED", "0")  # run seed 0: its checkpoints, example order and LoRA init
        dm, base = SumsTaskDataModule("words"), T.SumsBase()
        return {
            s: T.measure_frontier(base.checkpoint(s), dm.examples(), dm.eval_pairs(), T.StrategyPlan())
            for s in T.STATES
        }


@pytest.mark.slow
def test_post_and_pre_training_shorten_the_programs(frontiers):  # §7.7
    # the spec's checks in payload bits (the first character charged), run seed 0 only: 71 vs 1102 bits at 0.25,
    # 0 (the bare question) vs 71 at 0.40. The card counts the authors' way since issue 34 (payload + script bits):
    # there the same frontiers differ by < 2x at 0.40 and the headline target is the pre-trained best
    # (seeds/task_complexity.yaml)
    pts = {s: [(r["bits_payload"], r["perf"]) for r in rows] for s, rows in frontiers.items()}
    assert TC.complexity(pts["pretrained"], 0.25) <= TC.complexity(pts["random"], 0.25) / 5
    assert TC.complexity(pts["posttrained"], 0.40) <= TC.complexity(pts["pretrained"], 0.40) / 5


@pytest.mark.slow
def test_lora_q2_keeps_accuracy_at_a_quarter_of_the_bits(frontiers):  # §7.7
    rows = {(r["strategy"], r["knob"]): r for r in frontiers["pretrained"]}
    lora, q2 = rows[("lora", "r=1")], rows[("lora_q", "r=1,b=2")]
    assert q2["perf"] >= 0.85 * lora["perf"] and q2["bits_payload"] <= lora["bits_payload"] / 4


@pytest.mark.slow
def test_random_init_frontier_stays_low(frontiers):  # §7.7
    # holds at run seed 0 (best 0.30: online coding of 15 examples); not at the card's seeds 1 and 2, where online
    # coding of all 50 task examples lifts the random init to 0.44 and 0.50 (3501 and 3527 payload bits; the
    # spec's prototype: 0.26 at 4041 bits)
    assert max(r["perf"] for r in frontiers["random"]) <= 0.40


def test_lora_q2_codes_the_factors_in_at_most_a_quarter_of_the_16_bit_payload():
    """The card's former claim lora_q2_quarter_bits (issue 28: an invariant is a test, not evidence): the 2-bit
    KT-coded payload of the card's LoRA (r 1 on every block linear of the quick TinyGPT) is at most 1/4 of its 16-bit
    payload whatever the factors hold (recorded: 0.1388, 0.1390, 0.1379), since each number costs about 2 of 16 bits
    plus a 64-bit header per tensor."""
    _, params = T.add_lora(_tiny(), T.StrategyPlan(lora_rank=1))
    g = torch.Generator().manual_seed(0)
    for fill in ("normal", "uniform_symbols"):
        with torch.no_grad():
            for p in params:
                draw = torch.randn if fill == "normal" else torch.rand
                p.copy_(draw(p.shape, generator=g))
        ratio = TC.lora_q_payload_bits([p.detach() for p in params], 2) / TC.lora_payload_bits(params)
        assert ratio <= 0.25, (fill, ratio)
