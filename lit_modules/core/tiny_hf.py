"""Tiny Hugging Face causal LMs and tokenizers built locally, for stand-ins of full-scale configs (``litlab fit
--stand-in``): the real classes of a full config (``Olmo2ForCausalLM``, ``Qwen2ForCausalLM``, ...) with small
widths and depths and random weights, saved with ``save_pretrained`` next to a byte-level BPE tokenizer that is
built here, never downloaded. The same loading code then reads them as it reads the real checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers


def byte_vocab(*extra: str) -> dict[str, int]:
    """GPT-2's byte-level alphabet (one printable character for each of the 256 UTF-8 byte values), sorted, as
    ids 0-255, then the ``extra`` tokens as ordinary vocabulary entries: the vocabulary of a byte-level BPE with no
    merges, which encodes any text one token per byte."""
    from tokenizers import pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for token in extra:
        vocab[token] = len(vocab)
    return vocab


def byte_level_tokenizer(
    eos: str = "<|endoftext|>",
    pad: str | None = None,
    bos: str | None = None,
    *,
    bos_first: bool = False,
    model_max_length: int = 1 << 20,
) -> transformers.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with no merges (``byte_vocab``: every UTF-8 byte one token, as GPT-2-style
    tokenizers fall back to) and the given special tokens after the 256 bytes, in the order eos, pad, bos, or
    bos first (``bos_first``, Llama 3's order): OLMo-2, Qwen2, SmolLM3 and Llama 3 ship tokenizers of this kind."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab=byte_vocab(), merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    order = (bos, eos, pad) if bos_first else (eos, pad, bos)
    tok.add_special_tokens([t for t in order if t is not None])
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=eos, pad_token=pad, bos_token=bos, model_max_length=model_max_length
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
