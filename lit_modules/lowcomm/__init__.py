"""Low-communication distributed training: methods whose point is how little the workers exchange.

``lordo.py``: LoRDO's LightningModule ("LoRDO: Distributed Low-Rank Optimization with Infrequent
Communication", arXiv 2602.04396); ``optim.py``: its low-rank quasi-hyperbolic AdamW; ``contract.py``: what the
strategy (``litlab.strategies.lordo.LoRDOStrategy``, which issues every collective) needs from the optimizer and
what the module reads from the strategy; ``report.py``: the card's loss-vs-bytes report.
"""
