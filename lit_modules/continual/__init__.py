"""Continual learning with LoRA: one frozen backbone, a sequence of tasks, adapters that must not forget.

* ``contract.py``    what the family needs from its DataModule (``ContinualData``) and from a task-end callback
                     (``TaskEndCallback``), checked once at setup.
* ``harness.py``     ``SequentialLoRA``: the LightningModule every method and baseline extends (task hooks,
                     manual optimisation, gradient and update hooks, NCM prototypes).
* ``backbones.py``   the backbones behind one ``forward_features`` (a TinyViT pre-trained here without labels,
                     a Hugging Face ViT, the local TinyGPT).
* ``subspace.py``    subspace algebra several methods share (GPM bases, eigenvectors, the violation witness).
* ``baselines.py``   LoRA-GPM, InfLoRA-style and O-LoRA-style baselines.
* ``report.py``      accuracy-matrix heatmaps and the report of a card (``CardResult`` in, ``ReportExtras`` out).
* methods, one file each, named like their card: ``janus_lora.py`` (arXiv 2605.28495), ``loda.py``
  (arXiv 2603.00191).

A new continual method is a subclass of ``harness.SequentialLoRA`` in ``<slug>.py`` that overrides hooks, not
the loop; docs/adding-a-method.md walks through LoDA as the example.
"""
