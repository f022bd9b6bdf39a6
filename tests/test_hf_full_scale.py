"""Full-scale loaders: fail at once without internet, load local folders, build commonsense batches."""

import json
import time

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from litlab.datamodules.commonsense import IGNORE_INDEX, CommonsenseDataModule, format_prompt, load_records
from litlab.lit_modules.core.errors import ModelUnavailableError
from litlab.lit_modules.core.hf import dtype_from_name, load_causal_lm, load_tokenizer

SENTENCES = [
    "Below is an instruction that describes a task . Write a response that appropriately completes the request .",
    "paired with an input that provides further context",
    "### Instruction : ### Input : ### Response :",
    "Is the sky blue ? Answer true or false . the correct answer is true false",
    "Pick the option : option1 option2 the correct answer is option1 option2",
]


def save_tiny_tokenizer(folder) -> transformers.PreTrainedTokenizerFast:
    # No pad token on purpose: like LLaMA's, so the data module must fall back to eos.
    specials = ["<unk>", "<s>", "</s>"]
    words = sorted({word for sentence in SENTENCES for word in sentence.split()})
    vocab = {token: i for i, token in enumerate(specials + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(folder)
    return tokenizer


def save_tiny_llama(folder, vocab_size: int) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(folder)
    return model


def write_records(path, count: int) -> None:
    records = [
        {
            "instruction": "Is the sky blue ? Answer true or false .",
            "input": "",
            "output": "the correct answer is " + ("true" if i % 2 else "false false false"),
            "answer": "true" if i % 2 else "false",
        }
        for i in range(count)
    ]
    records[0]["input"] = "option1 option2"  # one record takes the with-input template
    path.write_text(json.dumps(records))


def test_uncached_hub_model_fails_fast_with_instructions(monkeypatch):
    # Whether offline by switch or by network, the answer must come in seconds, not minutes.
    for offline in ("0", "1"):
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
        start = time.monotonic()
        with pytest.raises(ModelUnavailableError) as caught:
            load_causal_lm("meta-llama/Llama-2-7b-hf-litlab-not-cached")
        assert (
            time.monotonic() - start < 60
        )  # 23 s seen at load 9 with HF_HUB_OFFLINE=0; a retrying hub client takes minutes
        message = str(caught.value)
        assert "meta-llama/Llama-2-7b-hf-litlab-not-cached" in message
        assert "hf download meta-llama/Llama-2-7b-hf-litlab-not-cached" in message
        assert "hf auth login" in message  # meta-llama is gated
    with pytest.raises(ModelUnavailableError, match="offline mode is on"):
        load_tokenizer("Qwen/Qwen3-8B-litlab-not-cached")


def test_missing_local_folder_is_named():
    with pytest.raises(ModelUnavailableError, match="/no/such/folder/model"):
        load_causal_lm("/no/such/folder/model")


def test_dtype_names():
    assert dtype_from_name("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="'fp8'"):
        dtype_from_name("fp8")
    with pytest.raises(ValueError, match="'half'"):
        load_causal_lm("/does/not/matter", dtype="half")


def test_local_folder_round_trip(tmp_path):
    tokenizer = save_tiny_tokenizer(tmp_path)
    model = save_tiny_llama(tmp_path, vocab_size=len(tokenizer))
    loaded = load_causal_lm(str(tmp_path), dtype="bfloat16")
    assert isinstance(loaded, transformers.LlamaForCausalLM)
    assert loaded.dtype == torch.bfloat16
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name].float(), tensor.to(torch.bfloat16).float())

    loaded_tokenizer = load_tokenizer(str(tmp_path))
    text = "Is the sky blue ? the correct answer is true"
    assert loaded_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded_tokenizer.eos_token_id == tokenizer.eos_token_id == 2
    assert loaded_tokenizer.unk_token_id not in loaded_tokenizer(text)["input_ids"]


def test_commonsense_batches_mask_prompt_and_shift(tmp_path):
    tokenizer = save_tiny_tokenizer(tmp_path)
    write_records(tmp_path / "train.json", count=10)
    dm = CommonsenseDataModule(
        model_id=str(tmp_path),
        train_path=str(tmp_path / "train.json"),
        batch_size=4,
        val_size=2,
        num_workers=0,
    )
    dm.setup("fit")
    assert dm.pad_token_id == tokenizer.eos_token_id
    assert len(dm.train_examples) == 8 and len(dm.val_examples) == 2

    batches = list(dm.train_dataloader()) + list(dm.val_dataloader())
    assert sum(len(batch["input_ids"]) for batch in batches) == 10
    prompt_lengths = set()
    for batch in batches:
        assert set(batch) == {"input_ids", "attention_mask", "labels"}
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        assert ids.shape == mask.shape == labels.shape and ids.dtype == labels.dtype == torch.long
        assert (labels[:, -1] == IGNORE_INDEX).all()
        for row in range(len(ids)):
            length = int(mask[row].sum())
            assert mask[row, :length].all() and not mask[row, length:].any()  # right padding
            assert (ids[row, length:] == dm.pad_token_id).all()
            targets = (labels[row] != IGNORE_INDEX).nonzero().flatten()
            # Loss on the response only: a contiguous run ending at the eos, each label the next input.
            assert torch.equal(targets, torch.arange(int(targets[0]), length - 1))
            assert torch.equal(labels[row, targets], ids[row, targets + 1])
            assert ids[row, length - 1] == tokenizer.eos_token_id
            response = tokenizer.decode(ids[row, int(targets[0]) + 1 : length - 1])
            assert response.startswith("the correct answer is")
            prompt_lengths.add(int(targets[0]) + 1)
    assert len(prompt_lengths) == 2  # the with-input record has a longer prompt


def test_truncation_and_separate_eval_file(tmp_path):
    save_tiny_tokenizer(tmp_path)
    write_records(tmp_path / "train.json", count=6)
    write_records(tmp_path / "test.json", count=3)
    dm = CommonsenseDataModule(
        model_id=str(tmp_path),
        train_path=str(tmp_path / "train.json"),
        eval_path=str(tmp_path / "test.json"),
        max_length=40,
        val_size=100,
        num_workers=0,
    )
    # Prompts are 34 tokens, 48 with input: record 0 of each file has no room left for a response.
    with pytest.warns(UserWarning) as warned:
        dm.setup("fit")
    messages = [str(warning.message) for warning in warned]
    assert any("1 of 6 train records dropped" in message for message in messages)
    assert any("1 of 3 validation records dropped" in message for message in messages)
    assert len(dm.train_examples) == 5 and len(dm.val_examples) == 2
    lengths = sorted(len(ids) for ids, _ in dm.train_examples + dm.val_examples)
    assert lengths[0] == 34 + 5 + 1 and lengths[-1] == 40  # "... false false false" cut, so no eos


def test_prompt_template_and_bad_records(tmp_path):
    prompt = format_prompt({"instruction": "Say hi.", "input": "", "output": "hi"})
    assert prompt.startswith("Below is an instruction that describes a task. Write a response")
    assert prompt.endswith("### Instruction:\nSay hi.\n\n### Response:\n")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"instruction": "x"}]))
    with pytest.raises(ValueError, match="record 0"):
        load_records(str(bad))
    with pytest.raises(FileNotFoundError, match="missing.json"):
        load_records(str(tmp_path / "missing.json"))


def test_dataset_id_without_datasets_package_says_how_to_get_the_file(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # absent even where installed
    with pytest.raises(ImportError) as caught:
        load_records("zwhe99/commonsense_170k")
    message = str(caught.value)
    assert "zwhe99/commonsense_170k" in message and "pip install datasets" in message
    assert "hf download zwhe99/commonsense_170k --repo-type dataset" in message
