"""Tiny Hugging Face causal LMs and tokenizers built locally, for stand-ins of full-scale configs (``litlab fit
--stand-in``): the real classes of a full config (``Olmo2ForCausalLM``, ``Qwen2ForCausalLM``, ...) with small
widths and depths and random weights, saved with ``save_pretrained`` next to a byte-level BPE tokenizer that is
built here, never downloaded. The same loading code then reads them as it reads the real checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers


def byte_level_tokenizer(
    eos: str = "<|endoftext|>", pad: str | None = None, bos: str | None = None
) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with no merges (every UTF-8 byte one token, as GPT-2-style tokenizers fall back
    to) and the given special tokens after the 256 bytes: OLMo-2, Qwen2 and SmolLM3 ship tokenizers of this kind."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = [t for t in (eos, pad, bos) if t is not None]
    tok.add_special_tokens(specials)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, pad_token=pad, bos_token=bos, model_max_length=1 << 20
    )


def write_tiny_causal_lm(
    folder: Path,
    config: transformers.PretrainedConfig,
    tokenizer: transformers.PreTrainedTokenizerBase,
    seed: int,
) -> Path:
    """``AutoModelForCausalLM.from_config(config)`` initialised from ``seed`` (the caller's random state is left as
    it was), saved with the tokenizer in ``folder`` (safetensors, fp32); returns ``folder``."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
