"""Parameter-efficient fine-tuning: trainable adapters on a frozen model, one file per method.

``lokra.py``: LoKRA / LoKRA+ ("LoKRA / LoKRA+: Low Kruskal-Rank Adaptation", ICML 2026). The adapter layer
itself (LoRA and Khatri–Rao branches, injection, merging) is shared with other families:
``litlab.lit_modules.core.adapters``.
"""
