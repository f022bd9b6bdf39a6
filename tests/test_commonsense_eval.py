"""Commonsense accuracy by generation (``lit_modules/peft/commonsense_eval.py``, the metric LoKRA's and CSPLoRA's full
configs log as val/commonsense_acc): label extraction, the prompts cut from a Commonsense170K batch, and the scoring
of generated responses, on the PEFT stand-in's records and byte-level tokenizer."""

from __future__ import annotations

import types

import torch

from litlab.lit_modules.peft.commonsense_eval import (
    commonsense_answer,
    generated_answers_correct,
    prompts_left_padded,
)


def test_the_first_label_is_the_answer():
    assert commonsense_answer(" the correct answer is solution2") == "solution2"
    assert commonsense_answer("the correct answer is true, not false") == "true"
    assert commonsense_answer("answer3\n\nanswer1") == "answer3"
    assert commonsense_answer("I do not know") == ""


def test_prompts_and_scoring_on_a_commonsense_batch(tmp_path, monkeypatch):
    from litlab.datamodules.commonsense import CommonsenseDataModule, format_prompt
    from litlab.lit_modules.peft.standin import write_byte_level_tokenizer, write_commonsense_json

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    tok = write_byte_level_tokenizer(tmp_path / "tok", "llama3")
    data = write_commonsense_json(tmp_path / "commonsense_170k.json", 10, torch.Generator().manual_seed(0))
    dm = CommonsenseDataModule(
        model_id=str(tmp_path / "tok"),
        train_path=str(data),
        max_length=512,
        batch_size=4,
        val_size=4,
        num_workers=0,
    )
    dm.setup("fit")
    batch = next(iter(dm.val_dataloader()))
    ids, mask = prompts_left_padded(batch, dm.pad_token_id)
    responses = []
    for row in range(len(ids)):
        text = tok.decode(ids[row][mask[row].bool()])
        assert text.startswith("Below is an instruction") and text.endswith("### Response:\n")
        full = tok.decode(
            batch["input_ids"][row][batch["attention_mask"][row].bool()], skip_special_tokens=True
        )
        responses.append(full[len(text) :])
        assert (
            format_prompt({"instruction": full.split("### Instruction:\n")[1].split("\n\n### Response")[0]})
            == text
        )
    assert all(r.startswith("the correct answer is ") for r in responses)

    def answering(replies: list[str]):
        """A model whose greedy response to prompt i is replies[i]."""

        def generate(input_ids, attention_mask, max_new_tokens, do_sample, pad_token_id):
            assert torch.equal(input_ids, ids) and torch.equal(attention_mask, mask) and not do_sample
            new = [torch.tensor(tok.encode(r, add_special_tokens=False)) for r in replies]
            width = max(len(n) for n in new)
            new = [torch.cat([n, torch.full((width - len(n),), pad_token_id)]) for n in new]
            return torch.cat([input_ids, torch.stack(new)], dim=1)

        return types.SimpleNamespace(generate=generate)

    right = generated_answers_correct(answering(responses), tok, batch, 32, dm.pad_token_id)
    assert right.tolist() == [True] * len(responses)
    wrong = [r.replace("true", "false") if "true" in r else "the correct answer is true" for r in responses]
    wrong[0] = responses[0]
    scored = generated_answers_correct(answering(wrong), tok, batch, 32, dm.pad_token_id)
    assert scored.tolist() == [True] + [False] * (len(responses) - 1)
