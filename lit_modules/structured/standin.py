"""Stand-in of SALAAD's full config (``litlab.standin``): GaLore's LLaMA-60M pre-trained on C4 with the t5-base
tokenizer becomes a LLaMA of width 64 (MLP ratio 2.69 and 8 heads of 64 -> 2 heads of 32, as the config's 512 / 1376
/ 8), 2 layers, trained on a few C4-layout records (``allenai/c4``'s ``en/c4-*.json.gz`` shards, streamed from the
local folder by the same ``datasets`` loader as the Hub's) through a ``T5Tokenizer`` built here; 2 optimiser steps
of 2 accumulated batches of 2 sequences of 64 tokens, then validation on 2 batches and the capacity sweep.
"""

from __future__ import annotations

from pathlib import Path

from litlab.lit_modules.core.standin_text import c4_stand_in_data, write_t5_tokenizer


def stand_in_salaad(workdir: Path) -> list[str]:
    vocab, data_args = c4_stand_in_data(workdir, write_t5_tokenizer, "t5-base")
    return [
        "--trainer.accelerator=cpu",
        "--trainer.precision=32",
        "--trainer.max_steps=2",
        "--trainer.accumulate_grad_batches=2",
        "--trainer.val_check_interval=4",  # in batches: after the 2nd optimiser step
        "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=1",
        f"--model.init_args.net.vocab_size={vocab}",
        "--model.init_args.net.hidden_size=64",
        "--model.init_args.net.intermediate_size=172",
        "--model.init_args.net.num_layers=2",
        "--model.init_args.net.num_heads=2",
        "--model.init_args.net.max_positions=64",
        "--model.init_args.optim.warmup_steps=1",
        *data_args,
    ]
