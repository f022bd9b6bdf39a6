"""``DecoderLM``: a plain next-token LightningModule on a ``transformers.LlamaForCausalLM`` built from its config
(random init, nothing downloaded), trained with AdamW, linear warm-up and cosine decay to ``min_lr_ratio``·lr.
Two typed groups: ``net: DecoderShape`` (``model.init_args.net.hidden_size``, ...) and ``optim: AdamWSchedule``
(``model.init_args.optim.lr``, ...).

It is the family's harness only in the sense that it is what the quick and full configs train: it knows nothing of
SALAAD. Structure methods decorate it from outside (``salaad.SALAAD`` is a Callback on its linear layers), and the
deployment tools read ``lm_loss`` (``capacity.CapacitySweep``) and ``hf_model`` (``litlab export``).
Sizes: the spec's CPU model (hidden 64, MLP 128, 2 layers, 2 heads, char vocabulary) by default; GaLore's LLaMA
60M/130M/350M/1B (arXiv 2403.03507, Table 1 configs) in ``configs/salaad/full*.yaml``.
"""

from __future__ import annotations

import re

import lightning as L
import torch
import torch.nn.functional as F
import transformers
from torch import Tensor, nn

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.models import tiny_llama
from litlab.lit_modules.core.schedules import warmup_then_decay_lr

BLOCKS = (
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)$"  # a Llama's attention + MLP linear layers
)


def short_name(name: str) -> str:
    """``model.model.layers.0.self_attn.q_proj`` -> ``0.q_proj`` (for metric names and tables)."""
    m = re.search(r"layers\.(\d+)\..*?([A-Za-z_]\w*)$", name)
    return f"{m.group(1)}.{m.group(2)}" if m else name


def find_blocks(module: nn.Module, pattern: str = BLOCKS) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` submodules whose qualified name matches ``pattern`` (``re.search``), in module order."""
    found = {n: m for n, m in module.named_modules() if isinstance(m, nn.Linear) and re.search(pattern, n)}
    if not found:
        raise ValueError(f"blocks={pattern!r} matches no nn.Linear of {type(module).__name__}")
    return found


@config_part
class DecoderShape:
    """The Llama trained from scratch (built from its config, nothing downloaded); ``num_kv_heads`` None: as many as
    ``num_heads``."""

    vocab_size: int = 97
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int | None = None
    max_positions: int = 128

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"net.{name}={getattr(self, name)} must be positive")


@config_part
class AdamWSchedule:
    """AdamW, ``warmup_steps`` of linear warm-up, then cosine decay to ``min_lr_ratio``·lr at the last step."""

    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1


NET, OPTIM = DecoderShape(), AdamWSchedule()


class DecoderLM(L.LightningModule):
    """Causal LM pre-training from scratch on ``{"input_ids", "labels"}`` batches (labels already shifted)."""

    def __init__(self, net: DecoderShape = NET, optim: AdamWSchedule = OPTIM) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net, self.optim = as_config(DecoderShape, net, "net"), as_config(AdamWSchedule, optim, "optim")
        n = self.net
        self.model = tiny_llama(
            n.vocab_size,
            n.hidden_size,
            n.num_layers,
            n.num_heads,
            n.num_kv_heads or n.num_heads,
            n.intermediate_size,
            n.max_positions,
        )

    @property
    def hf_model(self) -> transformers.PreTrainedModel:
        """The Hugging Face model (what ``save_pretrained`` writes)."""
        return self.model

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.model(input_ids=input_ids).logits

    def lm_loss(self, batch: dict[str, Tensor]) -> Tensor:
        """Mean next-token cross-entropy (nats/token) of a batch."""
        logits = self(batch["input_ids"])
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self.lm_loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx: int) -> None:
        loss = self.lm_loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        hp = self.optim
        opt = torch.optim.AdamW(
            self.parameters(), lr=hp.lr, betas=tuple(hp.betas), eps=hp.eps, weight_decay=hp.weight_decay
        )
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        sched = warmup_then_decay_lr(
            opt, warmup_steps=hp.warmup_steps, total_steps=total, decay="cosine", min_ratio=hp.min_lr_ratio
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
