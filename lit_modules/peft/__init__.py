"""Parameter-efficient fine-tuning: trainable adapters on a frozen model, one file per method.

``lokra.py``: LoKRA / LoKRA+ ("LoKRA / LoKRA+: Low Kruskal-Rank Adaptation", ICML 2026).
``csplora.py``: CSPLoRA's rank plans on its CPU task ("CSPLoRA: Confidence-Guided Structural Planning for
Low-Rank Adaptation", ICML 2026); the planner itself is ``litlab.lit_modules.core.rank_plan``.
``gap_init.py``: Gap-Init ("When Is Rank-1 Enough? Geometry-Guided Initialization for Parameter-Efficient
Fine-Tuning", ICML 2026, arXiv 2602.01522).
``spr_raft.py``: SPR-RAFT ("SPR-RAFT: Parameter-Efficient Regression-Aware Fine-Tuning for Biomedical LLM
Regression", ICML 2026): soft prompt + [REG] readout + RAFT loss on a frozen LM.
The adapter layer itself (LoRA and Khatri–Rao branches, injection, merging) is shared with other families:
``litlab.lit_modules.core.adapters``; PEFT's on-disk layout: ``litlab.lit_modules.core.peft_format``.
"""
