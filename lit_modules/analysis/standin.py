"""Stand-ins of the analysis cards' full-scale configs (``litlab fit --config configs/<slug>/full.yaml --stand-in``;
the interface is ``litlab.standin``): a tiny random model of the class each full config loads, with a byte-level
tokenizer built here, and a few records of each Hugging Face data set it reads, written in the layout the Hub ships
(parquet shards, or MetaMathQA's one JSON file, with the README ``configs`` that name their files), under
``<workdir>/hub/<dataset id>``, which the DataModules read as a local copy (``data_root``). The overrides returned
change paths and sizes only: the model's class, the data sets, the rendering and the loop stay the full config's.

* diffract: ``Olmo2ForCausalLM`` (allenai/OLMo-2-0425-1B's class); open-web-math, starcoderdata (python),
  tulu-3-sft-mixture and fineweb-edu (sample-10BT), so any domain of the paper runs;
* lock_in: ``Qwen2ForCausalLM`` (Qwen/Qwen2.5-0.5B's class, tied embeddings, grouped KV heads); GSM8K (main) and
  fineweb-edu; the curvature subset is the last block's MLP of the tiny model;
* task_complexity: ``SmolLM3ForCausalLM`` (HuggingFaceTB/SmolLM3-3B's class); MetaMathQA and GSM8K (main).

The texts are made from litlab's local corpus (stdlib docstrings and source) and generated arithmetic, from a
generator seeded here: the same files every time, offline.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import torch
import transformers

from litlab.lit_modules.core.corpus import local_text_corpus
from litlab.lit_modules.core.tiny_hf import byte_level_tokenizer, write_tiny_causal_lm

SEED = 0
CPU_FP32 = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32"]


# ---- the records ------------------------------------------------------------------------------------------------
def _prose(n: int, chars: int = 320) -> list[str]:
    text = local_text_corpus()
    step = len(text) // (n + 1)
    return [text[i * step : i * step + chars] for i in range(n)]


def _code(n: int, chars: int = 320) -> list[str]:
    out = []
    for name in ("textwrap", "fractions", "statistics", "difflib")[: max(1, n)]:
        out.append(inspect.getsource(importlib.import_module(name)))
    src = "\n".join(out)
    step = len(src) // (n + 1)
    return [src[i * step : i * step + chars] for i in range(n)]


def _sums(n: int, gen: torch.Generator) -> list[tuple[int, int]]:
    return [tuple(torch.randint(2, 60, (2,), generator=gen).tolist()) for _ in range(n)]  # type: ignore[misc]


def _math_docs(n: int, gen: torch.Generator) -> list[str]:
    return [
        f"Let a = {a} and b = {b}. Then a + b = {a + b}, a - b = {a - b} and a * b = {a * b}. "
        f"Since {a * b} / {b} = {a}, the product divided by b gives back a." * 3
        for a, b in _sums(n, gen)
    ]


def _gsm8k(n: int, gen: torch.Generator) -> list[dict]:
    return [
        {
            "question": f"Ann has {a} apples and buys {b} more. How many apples does she have?",
            "answer": f"Ann has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
        }
        for a, b in _sums(n, gen)
    ]


def _metamathqa(n: int, gen: torch.Generator) -> list[dict]:
    return [
        {
            "query": f"Tom reads {a} pages on Monday and {b} pages on Tuesday. How many pages does he read?",
            "response": f"He reads {a} + {b} = {a + b} pages.\nThe answer is: {a + b}",
            "type": "GSM_Rephrased",
            "original_question": f"Tom reads {a} pages and then {b} pages. How many pages?",
        }
        for a, b in _sums(n, gen)
    ]


def _tulu(n: int) -> list[dict]:
    words = [w for w in local_text_corpus().split() if w.isalpha()][: 6 * n]
    return [
        {
            "id": f"standin_{i}",
            "messages": [
                {"role": "user", "content": f"Sort the words: {' '.join(words[6 * i : 6 * i + 6])}"},
                {"role": "assistant", "content": " ".join(sorted(words[6 * i : 6 * i + 6]))},
            ],
            "source": "standin",
        }
        for i in range(n)
    ]


# ---- the Hub layout -----------------------------------------------------------------------------------------------
def write_hub_dataset(root: Path, files: dict[str, list[dict]], configs: str | None = None) -> Path:
    """The files of a Hub data set repository under ``root``: ``*.parquet`` shards, ``*.json`` (one JSON list) or
    ``*.jsonl`` files of ``records``, and a README.md whose YAML header holds ``configs`` (the Hub's way of naming
    a data set's configs and their files)."""
    import datasets

    for rel, records in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".parquet"):
            datasets.Dataset.from_list(records).to_parquet(str(path))
        elif rel.endswith(".jsonl"):
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
        else:
            path.write_text(json.dumps(records))
    readme = f"---\nconfigs:\n{configs}---\n" if configs else ""
    (root / "README.md").write_text(readme + "A stand-in: a few records in this data set's layout.\n")
    return root


def split_config(name: str, splits: dict[str, str]) -> str:
    lines = f"- config_name: {name}\n  data_files:\n"
    return lines + "".join(f"  - split: {s}\n    path: {p}\n" for s, p in splits.items())


def write_fineweb_edu(hub: Path, n: int = 16) -> None:
    records = [
        {
            "text": t,
            "id": f"<urn:uuid:{i:08d}>",
            "dump": "CC-MAIN-2024-10",
            "url": f"https://example.org/{i}",
            "file_path": "s3://stand-in",
            "language": "en",
            "language_score": 0.95,
            "token_count": len(t) // 4,
            "score": 3.2,
            "int_score": 3,
        }
        for i, t in enumerate(_prose(n))
    ]
    write_hub_dataset(
        hub / "HuggingFaceFW/fineweb-edu",
        {"sample/10BT/000_00000.parquet": records},
        split_config("sample-10BT", {"train": "sample/10BT/*"}),
    )


def write_gsm8k(hub: Path, gen: torch.Generator, n_train: int = 12, n_test: int = 8) -> None:
    write_hub_dataset(
        hub / "openai/gsm8k",
        {
            "main/train-00000-of-00001.parquet": _gsm8k(n_train, gen),
            "main/test-00000-of-00001.parquet": _gsm8k(n_test, gen),
        },
        split_config("main", {"train": "main/train-*", "test": "main/test-*"}),
    )


# ---- the tiny models ----------------------------------------------------------------------------------------------
def _tiny(folder: Path, config_class: type, eos: str, pad: str | None, **sizes) -> Path:
    tok = byte_level_tokenizer(eos=eos, pad=pad)
    config = config_class(
        vocab_size=len(tok),
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        **sizes,
    )
    return write_tiny_causal_lm(folder, config, tok, SEED)


def tiny_lm_args(model: Path, hub: Path, block_size: int, *model_options: str) -> list[str]:
    """The overrides the cards' stand-ins share: the tiny model in fp32 (then ``model_options``) and its tokenizer,
    the local Hub folder, batches of 2 windows of ``block_size`` tokens, 4 evaluation windows from 4 held-out
    records, a shuffle buffer of 8, 3 steps on the CPU."""
    return [
        f"--model.init_args.backbone={model}",
        "--model.init_args.dtype=float32",
        *model_options,
        f"--data.init_args.tokenizer={model}",
        f"--data.init_args.data_root={hub}",
        f"--data.init_args.block_size={block_size}",
        "--data.init_args.batch_size=2",
        "--data.init_args.val_windows=4",
        "--data.init_args.eval_records=4",
        "--data.init_args.shuffle_buffer=8",
        "--trainer.max_steps=3",
        "--trainer.log_every_n_steps=1",
        *CPU_FP32,
    ]


# ---- the cards ----------------------------------------------------------------------------------------------------
def stand_in_diffract(workdir: Path) -> list[str]:
    """A tiny ``Olmo2ForCausalLM`` (d 32, 2 layers, 4 heads) and the four CPT corpora; 3 steps of 2 windows of 32
    tokens, 4 evaluation windows from 4 held-out records."""
    gen = torch.Generator().manual_seed(SEED)
    model = _tiny(
        workdir / "olmo2", transformers.Olmo2Config, "<|endoftext|>", "<|pad|>", num_key_value_heads=4
    )
    hub = workdir / "hub"
    write_fineweb_edu(hub)
    owm = [
        {"text": t, "url": f"https://example.org/m{i}", "date": "2023-01-01", "metadata": "{}"}
        for i, t in enumerate(_math_docs(16, gen))
    ]
    write_hub_dataset(
        hub / "open-web-math/open-web-math",
        {"data/train-00000-of-00114.parquet": owm},
        split_config("default", {"train": "data/train-*"}),
    )
    code = [
        {
            "max_stars_repo_path": f"pkg/mod{i}.py",
            "max_stars_repo_name": "stand/in",
            "max_stars_count": 1,
            "id": str(i),
            "content": c,
        }
        for i, c in enumerate(_code(16))
    ]
    write_hub_dataset(hub / "bigcode/starcoderdata", {"python/train-00000-of-00059.parquet": code})
    write_hub_dataset(
        hub / "allenai/tulu-3-sft-mixture",
        {"data/train-00000-of-00006.parquet": _tulu(16)},
        split_config("default", {"train": "data/train-*"}),
    )
    return tiny_lm_args(model, hub, 32)


def stand_in_lock_in(workdir: Path) -> list[str]:
    """A tiny ``Qwen2ForCausalLM`` (d 32, 2 layers, 4 query and 2 KV heads, tied embeddings), GSM8K and fineweb-edu;
    3 steps of 2 GSM8K windows of 192 tokens (bytes), probes every step against a 4-pair Lanczos basis (8 iterations, 4
    calibration windows) of the last block's MLP."""
    gen = torch.Generator().manual_seed(SEED + 1)
    model = _tiny(
        workdir / "qwen2",
        transformers.Qwen2Config,
        "<|endoftext|>",
        "<|endoftext|>",
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    hub = workdir / "hub"
    write_fineweb_edu(hub)
    write_gsm8k(hub, gen)
    return tiny_lm_args(
        model,
        hub,
        192,
        r"--model.init_args.curvature_params=^model\.layers\.1\.mlp\.",
        "--model.init_args.curvature.k=4",
        "--model.init_args.curvature.lanczos_iters=8",
        "--model.init_args.curvature.n_cal_windows=4",
        "--model.init_args.eval_every=1",
    )


def stand_in_task_complexity(workdir: Path) -> list[str]:
    """A tiny ``SmolLM3ForCausalLM`` (d 32, 2 layers, 4 query and 2 KV heads), MetaMathQA and GSM8K; every strategy
    of the full plan at small sizes (ICL k 1 and 2, online coding of 4 examples and LoRA on 4, 2 AdamW steps each,
    quantised to 16 and 2 bits), 4 evaluation questions, 4 new tokens."""
    gen = torch.Generator().manual_seed(SEED + 2)
    model = _tiny(
        workdir / "smollm3", transformers.SmolLM3Config, "<|im_end|>", "<|im_end|>", num_key_value_heads=2
    )
    hub = workdir / "hub"
    write_hub_dataset(hub / "meta-math/MetaMathQA", {"MetaMathQA-395K.json": _metamathqa(12, gen)})
    write_gsm8k(hub, gen)
    return [
        f"--model.init_args.backbone={model}",
        "--model.init_args.dtype=float32",
        "--model.init_args.plan.icl_k=[1, 2]",
        "--model.init_args.plan.online_n=[4]",
        "--model.init_args.plan.steps=2",
        "--model.init_args.plan.batch_size=2",
        "--model.init_args.plan.lora_examples=4",
        "--model.init_args.plan.lora_bits=[16, 2]",
        "--model.init_args.plan.max_new_tokens=4",
        f"--data.init_args.data_root={hub}",
        "--data.init_args.n_examples=8",
        "--data.init_args.n_eval=4",
        *CPU_FP32,
    ]
