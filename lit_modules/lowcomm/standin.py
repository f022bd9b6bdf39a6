"""Stand-in of LoRDO's full config (``litlab.standin``): the 125M LLaMA-style decoder pre-trained on C4 with the
gpt2 tokenizer by 4 GPU workers becomes a LLaMA-style decoder of width 48 (2 layers, 2 heads, MLP 128: the config's
2048 / 768 ratio) trained by 2 CPU workers (gloo, forked as the quick card's) on a few C4-layout records
(``allenai/c4``'s ``en/c4-*.json.gz`` shards, streamed from the local folder by the same ``datasets`` loader as the
Hub's, each worker its share) through a ``GPT2Tokenizer`` built here. The schedule keeps its phases at small
counts: 2 DDP warm-up steps, then local steps synchronised every K = 2 (the config's 2048 and 32), 6 steps in all,
validation at the end (a multiple of K); rank 16 of 48, the config's 256 of 768.
"""

from __future__ import annotations

from pathlib import Path

from litlab.lit_modules.core.standin_text import c4_stand_in_data, write_gpt2_tokenizer


def stand_in_lordo(workdir: Path) -> list[str]:
    vocab, data_args = c4_stand_in_data(workdir, write_gpt2_tokenizer, "gpt2")
    return [
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--trainer.precision=32",
        "--trainer.strategy.init_args.start_method=fork",  # in-process ranks (the config's popen re-runs the command)
        "--trainer.strategy.init_args.sync_every=2",
        "--trainer.strategy.init_args.warmup_ddp_steps=2",
        "--trainer.max_steps=6",
        "--trainer.val_check_interval=6",
        "--trainer.limit_val_batches=2",
        "--trainer.log_every_n_steps=2",
        f"--model.init_args.net.vocab_size={vocab}",
        "--model.init_args.net.d_model=48",
        "--model.init_args.net.n_layers=2",
        "--model.init_args.net.n_heads=2",
        "--model.init_args.net.mlp_hidden=128",
        "--model.init_args.net.block_size=64",
        "--model.init_args.low_rank.rank=16",
        "--model.init_args.warmup_steps=1",
        *data_args,
    ]
