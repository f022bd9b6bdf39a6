"""Commonsense accuracy by generation, the metric of DoRA's commonsense protocol (Liu et al., "DoRA: Weight-Decomposed
Low-Rank Adaptation", arXiv 2402.09353, on LLM-Adapters' Commonsense170K) that LoKRA and CSPLoRA report at full scale.

LLM-Adapters' records end in "the correct answer is <answer>", <answer> one of the eight tasks' labels (true/false,
solution1/2, answer1-5, ending1-4, option1/2). The model writes a response to the prompt; the first label found in
it is its answer (LLM-Adapters' answer extraction, one pattern per task, merged here into one because the
held-out Commonsense170K records mix the tasks), compared with the label in the record's own response.

Reconstructed: greedy decoding of at most ``max_new_tokens`` tokens (the authors' decoding settings were not read).
What the validation records are is the DataModule's: held-out Commonsense170K records, or one task's test file as
``eval_path`` (the paper averages the eight test sets' accuracies, one run of the evaluation per file).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor, nn

IGNORE_INDEX = -100  # labels of the prompt and the padding (datamodules.commonsense)
ANSWER = re.compile(r"true|false|solution[12]|answer[1-5]|ending[1-4]|option[12]")


def commonsense_answer(text: str) -> str:
    """The first label in ``text`` ("" when there is none)."""
    found = ANSWER.search(text.strip())
    return found.group(0) if found else ""


def prompts_left_padded(batch: dict[str, Tensor], pad_id: int) -> tuple[Tensor, Tensor]:
    """(ids, mask) of each record's prompt, left-padded, from a right-padded batch whose ``labels`` are IGNORE_INDEX
    on the prompt (the first response label sits at the prompt's last position)."""
    labels, ids = batch["labels"], batch["input_ids"]
    has_response = labels != IGNORE_INDEX
    if not has_response.any(1).all():
        raise ValueError("a validation record has no response tokens to score")
    lengths = has_response.float().argmax(1) + 1
    width = int(lengths.max())
    out = torch.full((len(ids), width), pad_id, dtype=ids.dtype, device=ids.device)
    mask = torch.zeros_like(out)
    for row, n in enumerate(lengths.tolist()):
        out[row, width - n :] = ids[row, :n]
        mask[row, width - n :] = 1
    return out, mask


@torch.no_grad()
def generated_answers_correct(
    model: nn.Module, tokenizer, batch: dict[str, Tensor], max_new_tokens: int, pad_id: int
) -> Tensor:
    """Per record: the label of the model's greedy response to the prompt equals the label of its response."""
    labels = batch["labels"]
    gold = [
        commonsense_answer(tokenizer.decode(row[row != IGNORE_INDEX], skip_special_tokens=True))
        for row in labels
    ]
    ids, mask = prompts_left_padded(batch, pad_id)
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
    )
    written = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)
    return torch.tensor(
        [g != "" and commonsense_answer(w) == g for w, g in zip(written, gold)], device=labels.device
    )
