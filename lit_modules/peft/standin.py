"""Stand-ins of the PEFT family's full configs (``litlab fit --config configs/<slug>/full.yaml --stand-in``; the
interface is ``litlab.standin``): tiny random models of the Hugging Face classes the configs name, tokenizers built
here (never downloaded), and a few records of each data set in its on-disk format. They change paths and sizes
only; what the config trains is the same code path.

* ``stand_in_lokra``    configs/lokra/full.yaml: Meta-Llama-3-8B (a ``LlamaForCausalLM`` with grouped KV heads and
  RoPE θ = 500 000, a byte-level BPE tokenizer with Llama 3's special tokens) on Commonsense170K.
* ``stand_in_csplora``  configs/csplora/full.yaml: LLaMA-2-7B (``LlamaForCausalLM``, one KV head per query head,
  RoPE θ = 10 000, a ``LlamaTokenizer`` with a character vocabulary) on Commonsense170K.
* Commonsense170K (LLM-Adapters' ``ft-training_set/commonsense_170k.json``, DoRA's protocol, arXiv 2402.09353):
  one JSON list of ``{"instruction", "input", "output", "answer"}``, written by ``write_commonsense_json`` with
  records shaped like its BoolQ, PIQA and ARC parts (made up here, not the data set's).
* The shared pieces (``write_byte_level_tokenizer``, ``fit_overrides``) also serve SPR-RAFT's stand-in
  (``spr_raft_full.stand_in_spr_raft``).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
import transformers
from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

from litlab.lit_modules.core.io import atomic_write_text
from litlab.lit_modules.core.tiny_hf import byte_level_tokenizer, byte_vocab


def fit_overrides(max_epochs: int, batch: int) -> list[str]:
    """What every PEFT stand-in changes in the trainer: the CPU in fp32 (bf16 autocast of a full config does not
    run there), ``max_epochs`` epochs, micro-batches of ``batch`` without accumulation, validation once an epoch."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.precision=32",
        f"--trainer.max_epochs={max_epochs}",
        "--trainer.accumulate_grad_batches=1",
        "--trainer.val_check_interval=1.0",
        "--trainer.log_every_n_steps=1",
        f"--data.init_args.batch_size={batch}",
    ]


def write_byte_level_tokenizer(folder: Path, style: str = "qwen2") -> transformers.PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer with no merges (``core.tiny_hf.byte_vocab``: every byte one token, so every digit
    one token, as Qwen's and Llama 3's split digits) saved in ``folder``: ``style="qwen2"`` a ``Qwen2Tokenizer``
    (its own pre-tokenizer and normaliser) with Qwen3's eos ``<|im_end|>`` and pad ``<|endoftext|>``;
    ``style="llama3"`` ``core.tiny_hf.byte_level_tokenizer`` with Llama 3's ``<|begin_of_text|>`` and
    ``<|end_of_text|>``."""
    tok: transformers.PreTrainedTokenizerBase
    if style == "qwen2":
        tok = transformers.Qwen2Tokenizer(
            vocab=byte_vocab(),
            merges=[],
            unk_token="<|endoftext|>",
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
        )
    elif style == "llama3":
        tok = byte_level_tokenizer(
            eos="<|end_of_text|>",
            bos="<|begin_of_text|>",
            bos_first=True,
            model_max_length=VERY_LARGE_INTEGER,
        )
    else:
        raise ValueError(f"style={style!r}: expected 'qwen2' or 'llama3'")
    tok.save_pretrained(folder)
    return tok


def write_char_llama_tokenizer(folder: Path) -> transformers.PreTrainedTokenizerBase:
    """A ``LlamaTokenizer`` (LLaMA-2's class: ``<s>``, ``</s>``, ``<unk>``, ``▁`` for spaces) whose vocabulary is the
    printable ASCII characters and a newline, saved in ``folder``."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3}
    for ch in string.digits + string.ascii_letters + string.punctuation + "\n":
        vocab.setdefault(ch, len(vocab))
    tok = transformers.LlamaTokenizer(vocab=vocab, merges=[])
    tok.save_pretrained(folder)
    return tok


def write_tiny_llama(folder: Path, tok, generator: torch.Generator, kv_heads: int, rope_theta: float) -> None:
    """A random ``LlamaForCausalLM`` (2 layers, d = 32, 4 query heads, ``kv_heads`` KV heads, the projections the
    full configs adapt: q/k/v/o, gate/up/down) for ``tok``'s vocabulary, saved in ``folder`` with ``tok``."""
    config = transformers.LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=kv_heads, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=None,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
        transformers.LlamaForCausalLM(config).save_pretrained(folder)


COMMONSENSE_SHAPES = (  # (instruction template, output template, answers) like BoolQ, PIQA and ARC records
    (
        "Please answer the following question with true or false, question: is {a} bigger than {b}?\n\n"
        "Answer format: true/false",
        "the correct answer is {ans}",
        ("true", "false"),
    ),
    (
        "Please choose the correct solution to the question: how do you warm up {a}?\n\nSolution1: use {b}\n\n"
        "Solution2: put it in {a}\n\nAnswer format: solution1/solution2",
        "the correct answer is {ans}",
        ("solution1", "solution2"),
    ),
    (
        "Please choose the correct answer to the question: which is made of {a}?\n\nAnswer1: {b} Answer2: {a} "
        "Answer3: water Answer4: air\n\nAnswer format: answer1/answer2/answer3/answer4",
        "the correct answer is {ans}",
        ("answer1", "answer2", "answer3", "answer4"),
    ),
)
WORDS = ("a stone", "a cup", "the sun", "a mouse", "iron", "wood", "a house", "an apple")


def write_commonsense_json(path: Path, n: int, generator: torch.Generator) -> Path:
    """``n`` records in Commonsense170K's layout (one JSON list of instruction / input / output / answer)."""
    records = []
    for i in range(n):
        instruction, output, answers = COMMONSENSE_SHAPES[i % len(COMMONSENSE_SHAPES)]
        a, b, k = torch.randint(0, len(WORDS), (3,), generator=generator).tolist()
        ans = answers[k % len(answers)]
        records.append(
            {
                "instruction": instruction.format(a=WORDS[a], b=WORDS[b]),
                "input": "",
                "output": output.format(ans=ans),
                "answer": ans,
            }
        )
    return atomic_write_text(path, json.dumps(records, indent=1))


def _commonsense_stand_in(workdir: Path, folder_name: str, model_dir_writer) -> list[str]:
    generator = torch.Generator().manual_seed(0)
    model_dir = workdir / folder_name
    model_dir_writer(model_dir, generator)
    data = write_commonsense_json(workdir / "commonsense_170k.json", 10, generator)
    return fit_overrides(max_epochs=1, batch=4) + [
        f"--model.init_args.backbone={model_dir}",
        "--model.init_args.dtype=float32",
        "--model.init_args.adapter.rank=4",
        f"--data.init_args.model_id={model_dir}",
        f"--data.init_args.train_path={data}",
        "--data.init_args.max_length=512",
        "--data.init_args.val_size=2",
        "--data.init_args.num_workers=0",
    ]


def stand_in_lokra(workdir: Path) -> list[str]:
    """configs/lokra/full.yaml on a tiny Meta-Llama-3-8B-shaped ``LlamaForCausalLM`` (2 KV heads for 4 query heads,
    θ = 500 000) and 10 Commonsense170K-layout records (8 train, 2 val): one epoch of 2 steps of 4, rank 4."""

    def write(folder: Path, generator: torch.Generator) -> None:
        write_tiny_llama(folder, write_byte_level_tokenizer(folder, "llama3"), generator, 2, 500000.0)

    return _commonsense_stand_in(workdir, "tiny-llama3", write)


def stand_in_csplora(workdir: Path) -> list[str]:
    """configs/csplora/full.yaml on a tiny LLaMA-2-7B-shaped ``LlamaForCausalLM`` (multi-head attention, θ = 10 000,
    a ``LlamaTokenizer``) and the same 10 records: one epoch of 2 steps of 4, LoRA rank 4 on its seven projections;
    the CSPLoRA probe (``adapter.probe_batches``, 20 in the config) reads the epoch's 2 batches."""

    def write(folder: Path, generator: torch.Generator) -> None:
        write_tiny_llama(folder, write_char_llama_tokenizer(folder), generator, 4, 10000.0)

    return _commonsense_stand_in(workdir, "tiny-llama2", write) + [
        "--model.init_args.adapter.probe_batches=2"
    ]
