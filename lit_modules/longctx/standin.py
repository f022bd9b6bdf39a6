"""Stand-ins of the long-context family's full configs (``litlab.standin``): xKV and SALE at full scale evaluate
Llama-3.1-8B-Instruct on 64K-token passkey prompts that ``LongContextDataModule`` generates from the model's
tokenizer (there are no data files: the prompts are made from the tokenizer and the run's seed). The stand-in is a
random ``LlamaForCausalLM`` with Llama 3.1's configuration at small sizes (grouped-query attention, the llama3 RoPE
scaling, untied embeddings) and a byte-level tokenizer built here with Llama 3's special tokens, saved together in
one folder that both ``model.init_args.lm.name`` and ``data.init_args.tokenizer_name`` name, as the Hub id does.
"""

from __future__ import annotations

from pathlib import Path

SEED = 0
BOS, EOS = (
    "<|begin_of_text|>",
    "<|eot_id|>",
)  # Llama 3's: every prompt starts with BOS; generation stops at EOT
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 4, 2, 16  # Llama-3.1-8B: 4096, 32, 32, 8, 128
PROMPT_TOKENS = 512  # the full configs' 65,536-token prompts, scaled down (bytes of text: one token each)


def llama3_tokenizer():
    """A byte-level tokenizer of Llama 3's kind (``core.tiny_hf.byte_level_tokenizer``: the 256 bytes, no merges;
    any text encodes, one token per byte) with Llama 3's BOS added in front of every text by the template, and EOT
    as its end token."""
    from tokenizers import processors

    from litlab.lit_modules.core.tiny_hf import byte_level_tokenizer

    tok = byte_level_tokenizer(eos=EOS, bos=BOS)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.bos_token_id)]
    )
    return tok


def write_tiny_llama(folder: Path) -> Path:
    """The tokenizer and a random ``LlamaForCausalLM`` reading it (float32 safetensors, ``core.tiny_hf``: weights
    drawn from ``SEED``, the caller's generator left as it was), in one folder."""
    from transformers import LlamaConfig

    from litlab.lit_modules.core.tiny_hf import write_tiny_causal_lm

    tok = llama3_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=131072,
        rope_parameters={  # Llama 3.1's long-context RoPE
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    return write_tiny_causal_lm(folder, config, tok, SEED)


def _lm_and_prompt_args(folder: Path) -> list[str]:
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_epochs=2",  # training-free methods: one empty step per epoch; two, to resume between them
        f"--model.init_args.lm.name={folder}",
        "--model.init_args.lm.dtype=float32",  # bf16 matmuls on the CPU: slow and not what a GPU computes
        f"--data.init_args.tokenizer_name={folder}",
        f"--data.init_args.lengths=[{PROMPT_TOKENS}]",
        "--data.init_args.num_prompts=2",
    ]


def stand_in_xkv(workdir: Path) -> list[str]:
    """The tiny Llama; xKV-4 at the paper's share of the stacked K/V width (r_k 384 and r_v 576 of 4 x 1024 ->
    12 and 18 of 4 x 32) on two 512-token passkey prompts; the SR budget scaled as the prompt (2048 of 65,536)."""
    folder = write_tiny_llama(workdir / "llama")
    return [
        *_lm_and_prompt_args(folder),
        "--model.init_args.plan.rank_k=12",
        "--model.init_args.plan.rank_v=18",
        "--model.init_args.selective.sparse_budget=64",
    ]


def stand_in_sale(workdir: Path) -> list[str]:
    """The tiny Llama; SALE with the official block geometry on two 512-token passkey prompts and the calibration
    (theta 0.4) on two multi-key prompts; the dense fallback below 256 tokens (the config's 1024 of 65,536
    scaled up to keep the prompts above it), so the sparse path runs."""
    folder = write_tiny_llama(workdir / "llama")
    return [
        *_lm_and_prompt_args(folder),
        "--model.init_args.min_seq_len=256",
        "--data.init_args.calib_prompts=2",
    ]
