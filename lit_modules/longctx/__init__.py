"""Long-context inference on a frozen causal LM: KV-cache compression and sparse prefill attention, nothing trained.

* ``contract.py``    what the family needs from its DataModule (``LongContextData``, ``CalibrationData``, the
                     ``PromptItem`` of a batch), checked once at setup; the family's one door to ``datamodules``.
* ``kv_cache.py``    ``KVMethod``: the one interface every method plugs into (attention function, per-request
                     ``MethodCache``, ``after_prefill`` compression, metrics), and ``greedy_generate``.
* ``harness.py``     ``LongContextEval``: the LightningModule every method extends (frozen model ``FrozenLM``,
                     ``EvalSettings``, accuracy / latency / memory logging), and the tiny passkey Llama.
* ``report.py``      the cards' report helpers (``CardResult`` in, ``ReportExtras`` out).
* methods, one file each, named like their card: ``xkv.py`` (arXiv 2503.18893, with the single-layer SVD,
  MiniCache and ShadowKV-style baselines), ``sale.py`` (arXiv 2505.24179, with a pooled-selection baseline).

A new method is a ``KVMethod`` (a cache layer, an attention function, a compression step) plus a small
``LongContextEval`` subclass in ``<slug>.py`` that builds it from typed ``config_part`` groups.
"""
