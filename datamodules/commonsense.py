"""LoKRA's full-scale data: commonsense-reasoning instruction tuning (DoRA / LLM-Adapters protocol).

Paper setting: fine-tune `huggyllama/llama-7b`, `meta-llama/Meta-Llama-3-8B` (gated) or
`Qwen/Qwen3-8B` on the 170k merged training set `zwhe99/commonsense_170k` (LLM-Adapters'
`ft-training_set/commonsense_170k.json`), then score the 8 test sets by generation: BoolQ, PIQA,
SIQA, HellaSwag, WinoGrande, ARC-e, ARC-c, OBQA (LLM-Adapters' `dataset/<name>/test.json`, same
record format; any of them can serve as `eval_path`).

Records are LLM-Adapters JSON: a list of `{"instruction", "input", "output", "answer"}`; the model
learns to write `output` after the Alpaca-style prompt, with no loss on the prompt.
"""

from __future__ import annotations

import json
import os
import random
import warnings
from typing import Any

import lightning as L
import torch
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from torch.utils.data import DataLoader

from litlab.lit_modules.core.errors import DatasetUnavailableError
from litlab.lit_modules.core.hf import (
    check_hub_dataset,
    download_instructions,
    load_tokenizer,
    offline_env_var,
)
from litlab.lit_modules.core.seeding import derive_seed

PROMPT_TEMPLATE = (
    "Below is an instruction that describes a task. Write a response that appropriately completes "
    "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)
PROMPT_TEMPLATE_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
IGNORE_INDEX = -100  # torch cross_entropy's default ignore_index
_TOKENIZE_CHUNK = 1024  # records per tokenizer call: fast batching without a 170k-long list of lists


def format_prompt(record: dict[str, Any]) -> str:
    if record.get("input"):
        return PROMPT_TEMPLATE_WITH_INPUT.format(instruction=record["instruction"], input=record["input"])
    return PROMPT_TEMPLATE.format(instruction=record["instruction"])


def _check_records(records: Any, source: str) -> list[dict[str, Any]]:
    if not isinstance(records, list) or not records:
        raise ValueError(f"{source} must hold a non-empty JSON list of records, got {type(records).__name__}")
    for index, record in enumerate(records):
        if not isinstance(record, dict) or not {"instruction", "output"} <= record.keys():
            raise ValueError(
                f"{source} record {index} must be an object with 'instruction' and 'output' "
                f"(LLM-Adapters format), got {str(record)[:200]!r}"
            )
    return records


def _load_hub_dataset(dataset_id: str) -> list[dict[str, Any]]:
    get_the_file = (
        f"Or get the JSON file instead and pass its path:\n{download_instructions(dataset_id, 'dataset')}"
    )
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            f"data path {dataset_id!r} is a Hugging Face dataset id, which needs the optional `datasets` "
            f"package (pip install datasets). {get_the_file}"
        ) from err
    check_hub_dataset(dataset_id, "load", f". {get_the_file}")
    try:  # offline mode: `datasets` reads only its cache and fails at once when the data is not there
        return datasets.load_dataset(dataset_id, split="train").to_list()
    except Exception as err:
        if offline_env_var() is None:
            raise
        raise DatasetUnavailableError(
            f"cannot load dataset {dataset_id!r} in offline mode ({offline_env_var()}=1): not in the "
            f"`datasets` cache. {get_the_file}"
        ) from err


def load_records(path: str) -> list[dict[str, Any]]:
    """Records from a local LLM-Adapters `.json` file, or from a Hugging Face dataset id."""
    local = os.path.expanduser(path)
    if os.path.isfile(local):
        with open(local, encoding="utf-8") as file:
            try:
                return _check_records(json.load(file), path)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"data file {path!r} is not one JSON list (LLM-Adapters format): {err}"
                ) from err
    try:
        validate_repo_id(path)
        looks_like_id = not path.endswith((".json", ".jsonl"))
    except HFValidationError:
        looks_like_id = False
    if not looks_like_id:
        raise FileNotFoundError(
            f"data path {path!r} is neither an existing file nor a dataset id like 'org/name'"
        )
    return _check_records(_load_hub_dataset(path), path)


def _tokenize_many(
    tokenizer: Any, prompts: list[str], outputs: list[str], max_length: int
) -> list[tuple[list[int], int]]:
    """(ids of prompt + output + eos, number of prompt tokens) per record, as LLM-Adapters' finetune.py.

    The prompt is tokenised alone to find where the response starts, as LLM-Adapters does.
    """
    full = tokenizer([p + o for p, o in zip(prompts, outputs)], truncation=True, max_length=max_length)
    prompt_only = tokenizer(prompts, truncation=True, max_length=max_length)
    examples = []
    for ids, prompt_ids in zip(full["input_ids"], prompt_only["input_ids"]):
        if (not ids or ids[-1] != tokenizer.eos_token_id) and len(ids) < max_length:
            ids = ids + [tokenizer.eos_token_id]
        examples.append((ids, len(prompt_ids)))
    return examples


def shifted_labels(input_ids: torch.Tensor, num_prompt_tokens: int) -> torch.Tensor:
    """labels[t] = input_ids[t + 1] where that token is response, else IGNORE_INDEX (last position too)."""
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:-1] = input_ids[1:]
    labels[: max(num_prompt_tokens - 1, 0)] = IGNORE_INDEX
    return labels


class CommonsenseDataModule(L.LightningDataModule):
    """Batches `{"input_ids", "attention_mask", "labels"}` of `[B, T]`, right-padded, labels already shifted.

    `labels[:, t]` is the token to predict at position t; prompt, padding and the last position are
    IGNORE_INDEX, so the loss covers the response only. Because they are shifted, take
    `cross_entropy(logits.flatten(0, 1), labels.flatten())` yourself; passing them as a
    transformers model's `labels=` would shift them a second time. Without `eval_path`, the last `val_size`
    records of `train_path` after a shuffle (the run seed's `"data.split"` stream) are validation; with it,
    `val_size` records of `eval_path` (all, if fewer) are, and all of `train_path` trains.
    """

    def __init__(
        self,
        model_id: str,
        train_path: str = "zwhe99/commonsense_170k",
        eval_path: str | None = None,
        max_length: int = 256,
        batch_size: int = 16,
        val_size: int = 120,
        num_workers: int = 2,
    ) -> None:
        super().__init__()
        for name, value in [("max_length", max_length), ("batch_size", batch_size), ("val_size", val_size)]:
            if value <= 0:
                raise ValueError(f"{name}={value} must be positive")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        self.save_hyperparameters()
        self.tokenizer: Any = None
        self.pad_token_id: int | None = None
        self.train_examples: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.val_examples: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_examples is not None:
            return
        hp = self.hparams
        self.tokenizer = load_tokenizer(hp.model_id)
        self.pad_token_id = self.tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = self.tokenizer.eos_token_id  # LLaMA tokenizers have no pad token
        if self.pad_token_id is None or self.tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer of {hp.model_id!r} has no eos token, which the response needs")

        records = load_records(hp.train_path)
        order = list(range(len(records)))
        split_seed = derive_seed("data.split")
        random.Random(split_seed).shuffle(order)
        if hp.eval_path is None:
            if hp.val_size >= len(records):
                raise ValueError(
                    f"val_size={hp.val_size} leaves no training data: {hp.train_path!r} has {len(records)} records"
                )
            train = [records[i] for i in order[: -hp.val_size]]
            val = [records[i] for i in order[-hp.val_size :]]
        else:
            train = [records[i] for i in order]
            eval_records = load_records(hp.eval_path)
            eval_order = list(range(len(eval_records)))
            random.Random(split_seed).shuffle(eval_order)
            val = [eval_records[i] for i in eval_order[-hp.val_size :]]
        self.train_examples = self._encode(train, "train")
        self.val_examples = self._encode(val, "validation")

    def _encode(self, records: list[dict[str, Any]], split: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
        examples = []
        for start in range(0, len(records), _TOKENIZE_CHUNK):
            chunk = records[start : start + _TOKENIZE_CHUNK]
            prompts = [format_prompt(record) for record in chunk]
            outputs = [str(record["output"]) for record in chunk]
            for ids, num_prompt in _tokenize_many(self.tokenizer, prompts, outputs, self.hparams.max_length):
                # int32 keeps 170k examples at ~100 MB rather than Python ints at ~1 GB.
                input_ids = torch.tensor(ids, dtype=torch.int32)
                labels = shifted_labels(input_ids, num_prompt)
                if (labels != IGNORE_INDEX).any():
                    examples.append((input_ids, labels))
        dropped = len(records) - len(examples)
        if dropped:
            # A prompt that fills max_length leaves no response to learn, and an all-ignored batch gives NaN loss.
            warnings.warn(
                f"{dropped} of {len(records)} {split} records dropped: their prompt alone fills "
                f"max_length={self.hparams.max_length} tokens",
                stacklevel=2,
            )
        if not examples:
            raise ValueError(f"no {split} record fits in max_length={self.hparams.max_length} tokens")
        return examples

    def collate(self, examples: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
        length = max(len(ids) for ids, _ in examples)
        input_ids = torch.full((len(examples), length), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
        labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
        for row, (ids, target) in enumerate(examples):
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
            labels[row, : len(ids)] = target
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def _loader(self, examples: list | None, shuffle: bool) -> DataLoader:
        if examples is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        return DataLoader(
            examples,
            batch_size=self.hparams.batch_size,
            shuffle=shuffle,
            collate_fn=self.collate,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_examples, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_examples, shuffle=False)
