"""SPR-RAFT on a frozen Hugging Face causal LM — the paper's scale ("SPR-RAFT: Parameter-Efficient Regression-Aware
Fine-Tuning for Biomedical LLM Regression", ICML 2026 poster 63748; abstract only, no arXiv version or code) with
RAFT's grid expectation (Lukasik et al., "Better autoregressive regression with LLMs via regression-aware
fine-tuning", ICLR 2025).

What both Hugging Face routes of ``spr_raft.SPRRAFT`` share — SmolLM2-135M-Instruct on the CPU
(``backbone="smollm2"``) and the paper's frozen Qwen3-4B in bf16 (any Hugging Face id or folder,
``configs/spr_raft/full.yaml``):

* ``hidden_size``: d, read from the model's config before its weights load (so the trainable P, e_REG and head
  exist at construction); offline and not cached, it fails at once naming the model and how to get it.
* ``load_frozen_lm``: the LM in ``dtype``, eval mode, no gradients.
* ``lm_hidden``: step (2) of the algorithm, the last hidden state of ``inputs_embeds`` with an attention mask
  (left padding of variable-length prompts; positions count only real tokens, so padding changes nothing).
* ``grid_scores``: s(c) = Σ_j log p(c_j | prefix, c_<j) for every candidate answer c, with one forward of the
  prefix (soft prompt ⊕ prompt ⊕ [REG]) and its KV cache repeated for the candidates' tokens (spec §3.2's grid
  version: "all c in one batched pass re-using the prefix KV-cache"). Differentiable: in training the true answer
  rides along as candidate 0, so one pass gives L_ce (−s(y)/J), the grid RAFT term over the training-target
  quantiles and the head's h_REG. Memory: the cache is copied once per candidate, 2·layers·kv_heads·head_dim·T
  numbers per (record, candidate) — for Qwen3-4B (36 layers, 8 KV heads of 128) at T = 200, 64 candidates and
  micro-batch 4, 7.5 GB in bf16, which is why full.yaml accumulates 4 micro-batches of 4.
* ``stand_in_spr_raft``: the full config's stand-in (``litlab fit --config configs/spr_raft/full.yaml
  --stand-in``): a tiny ``Qwen3ForCausalLM``, a byte-level ``Qwen2Tokenizer`` built here (one token per digit, as
  Qwen's), a few rows of MoleculeNet's ESOL file layout.

Reconstructed (spec, beyond the abstract): the layout soft prompt ⊕ prompt ⊕ [REG] ⊕ answer ⊕ <eos>; a signed
fixed-width answer with 2 decimals for the molecular sets; K = 64 training quantiles as the grid; the grid RAFT in
training at full scale (the digit version needs unsigned integer answers).
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch
import transformers
from torch import Tensor

from litlab.lit_modules.core.errors import ModelUnavailableError
from litlab.lit_modules.peft.standin import fit_overrides, write_byte_level_tokenizer

SMOLLM2 = "smollm2"
SMOLLM2_HIDDEN = 576  # SmolLM2-135M's width, checked when it loads (its config sits inside a GGUF file)


def hidden_size(backbone: str) -> int:
    """d of ``backbone`` (``"smollm2"``, a Hugging Face id or a folder), from its config alone."""
    if backbone == SMOLLM2:
        return SMOLLM2_HIDDEN
    from litlab.lit_modules.core.hf import load_from_folder_cache_or_hub

    config = load_from_folder_cache_or_hub(transformers.AutoConfig.from_pretrained, backbone, None, "model")
    d = getattr(config, "hidden_size", None)
    if not isinstance(d, int):
        raise ModelUnavailableError(f"model {backbone!r} has a {type(config).__name__} without hidden_size")
    return d


def load_frozen_lm(backbone: str, dtype: str) -> transformers.PreTrainedModel:
    """The causal LM, frozen (eval mode, requires_grad off); ``ModelUnavailableError`` saying how to get it."""
    from litlab.lit_modules.core import hf

    lm = hf.load_smollm2(dtype)[0] if backbone == SMOLLM2 else hf.load_causal_lm(backbone, dtype=dtype)
    lm.eval().requires_grad_(False)
    if lm.config.hidden_size != hidden_size(backbone):
        raise ValueError(
            f"{backbone!r} loaded with hidden size {lm.config.hidden_size}, not {hidden_size(backbone)}"
        )
    return lm


def sequence_scores(logits: Tensor, answers: Tensor) -> Tensor:
    """Σ_j log p(answers[j] | prefix) for ``logits`` ``[N, J, V]`` at the J answer positions, ``answers`` ``[N, J]``."""
    return logits.float().log_softmax(-1).gather(-1, answers[..., None]).squeeze(-1).sum(-1)


def position_ids(mask: Tensor) -> Tensor:
    """Positions that count only the unmasked tokens (0 on left padding), as generation with padding uses."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def lm_hidden(lm: transformers.PreTrainedModel, emb: Tensor, mask: Tensor | None) -> Tensor:
    """(2) The last hidden state (after the final norm) of ``emb`` ``[B, T, d]``; ``mask`` ``[B, T]`` or None."""
    if mask is None:
        return lm.model(inputs_embeds=emb.to(lm.dtype)).last_hidden_state
    return lm.model(
        inputs_embeds=emb.to(lm.dtype), attention_mask=mask, position_ids=position_ids(mask)
    ).last_hidden_state


def grid_scores(
    lm: transformers.PreTrainedModel, emb: Tensor, mask: Tensor | None, candidates: Tensor
) -> tuple[Tensor, Tensor]:
    """(h, s): the prefix's last hidden state ``[b, T, d]`` and s ``[b, C]``, the log-likelihood of each candidate
    answer ``candidates[i, c]`` (``[b, C, J]`` tokens: the answer then <eos>) after the prefix ``emb`` ``[b, T, d]``
    that ends at [REG]. One forward of the prefix with its KV cache, then the C candidates' first J − 1 tokens on C
    copies of the cache."""
    b, C, J = candidates.shape
    if mask is None:
        mask = torch.ones(emb.shape[:2], dtype=torch.long, device=emb.device)
    pos = position_ids(mask)
    out = lm.model(inputs_embeds=emb.to(lm.dtype), attention_mask=mask, position_ids=pos, use_cache=True)
    h = out.last_hidden_state
    first = lm.lm_head(h[:, -1]).float().log_softmax(-1)  # [b, V]: the first answer token, read at [REG]
    scores = first.gather(1, candidates[:, :, 0])
    if J > 1:
        cache = out.cache
        cache.batch_repeat_interleave(C)
        rest_mask = torch.cat([mask.repeat_interleave(C, 0), mask.new_ones(b * C, J - 1)], dim=1)
        rest_pos = pos[:, -1:].repeat_interleave(C, 0) + torch.arange(1, J, device=pos.device)
        tokens = candidates.flatten(0, 1)
        rest = lm.model(
            input_ids=tokens[:, :-1],
            attention_mask=rest_mask,
            position_ids=rest_pos,
            cache=cache,
            use_cache=True,
        )
        scores = scores + sequence_scores(lm.lm_head(rest.last_hidden_state), tokens[:, 1:]).view(b, C)
    return h, scores


# ---- the stand-in of configs/spr_raft/full.yaml ------------------------------------------------------------------
# MoleculeNet's ESOL as DeepChem serves it (datamodules/regression_csv.py reads it)
ESOL_FILE = "delaney-processed.csv"
ESOL_COLUMNS = (
    "Compound ID",
    "ESOL predicted log solubility in mols per litre",
    "Minimum Degree",
    "Molecular Weight",
    "Number of H-Bond Donors",
    "Number of Rings",
    "Number of Rotatable Bonds",
    "Polar Surface Area",
    "measured log solubility in mols per litre",
    "smiles",
)
STAND_IN_SMILES = (
    "CCO", "CC(C)O", "c1ccccc1", "Cc1ccccc1", "CCCCCC", "CC(=O)O", "OCC(O)CO", "c1ccc2ccccc2c1",
    "ClC(Cl)Cl", "CCN(CC)CC", "O=C1CCCCC1", "Oc1ccccc1", "CCOC(C)=O", "CCCCO", "Nc1ccccc1", "CC#N",
)  # fmt: skip


def write_esol_rows(path: Path, generator: torch.Generator) -> None:
    """``len(STAND_IN_SMILES)`` rows in the layout of MoleculeNet's delaney-processed.csv (its ten columns, the
    measured solubility and the SMILES last), with targets drawn in ESOL's range (−11.6 to 2.2 log mol/L); not the
    real measurements."""
    y = -11.6 + 13.8 * torch.rand(len(STAND_IN_SMILES), generator=generator, dtype=torch.float64)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(ESOL_COLUMNS)
        for i, (smiles, target) in enumerate(zip(STAND_IN_SMILES, y.tolist())):
            writer.writerow([f"mol{i}", f"{target + 0.3:.3f}", 1, f"{12.0 * len(smiles):.3f}", 0, 0, 0, "0.0",
                             f"{target:.2f}", smiles])  # fmt: skip


def stand_in_spr_raft(workdir: Path) -> list[str]:
    """A tiny Qwen3ForCausalLM (Qwen3-4B's class: 2 layers, d = 32, 4 query / 2 KV heads, tied embeddings) with a
    byte-level Qwen2Tokenizer, and 16 ESOL-layout rows; the overrides run configs/spr_raft/full.yaml on them for 2
    epochs of 3 steps (batch 4) in fp32 on the CPU, 4 soft-prompt vectors, a 16-wide head, a grid of 8 quantiles."""
    generator = torch.Generator().manual_seed(0)
    model_dir, data_dir = workdir / "tiny-qwen3", workdir / "moleculenet"
    data_dir.mkdir(parents=True, exist_ok=True)
    tok = write_byte_level_tokenizer(model_dir)
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=generator)))
        config = transformers.Qwen3Config(
            vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=256, tie_word_embeddings=True,
            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
        )  # fmt: skip
        transformers.Qwen3ForCausalLM(config).save_pretrained(model_dir)
    write_esol_rows(data_dir / ESOL_FILE, generator)
    return fit_overrides(max_epochs=2, batch=4) + [
        f"--model.init_args.backbone={model_dir}",
        "--model.init_args.backbone_dtype=float32",
        "--model.init_args.prompt_len=4",
        "--model.init_args.head_hidden=16",
        f"--data.init_args.data_dir={data_dir}",
        f"--data.init_args.tokenizer={model_dir}",
        "--data.init_args.task=esol",
        "--data.init_args.grid_size=8",
        "--data.init_args.max_prompt_tokens=160",
    ]
