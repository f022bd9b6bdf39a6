"""Domain adaptation: a labelled source domain, unlabelled target domains, one source stage reused by every method.

* ``contract.py``    what the family reads from its DataModule (``DomainData``, ``SourceFreeData``), checked at
                     setup; the only file of the family that imports ``datamodules/``.
* ``nets.py``        the small conv feature extractors of the quick scale and torchvision ResNets by name at
                     full scale (``resnet_weights_file``: fail at once offline naming the file and its URL).
* ``source.py``      the source stage: trained once per (recipe, data, seed) and cached (source once, adapt many).
* ``binning.py``     soft / hard binning of continuous labels, histograms, windowed mode, support interval,
                     normalised entropy (pure functions).
* ``banks.py``       the indexed feature/prediction bank with a kNN query that excludes self.
* ``prototypes.py``  class means of a FIFO feature memory, the prototype-contrastive loss, graph edge labels.
* ``baselines.py``   the standard baselines' pieces: AdaBN, mean teacher (EMA), kNN-mean pseudo-labels, SHOT's
                     information-maximisation losses.
* ``report.py``      figures for the cards' report hooks: per-target bars, PCA of source/target features
                     before and after adaptation (read from the runs' checkpoints).
* methods, one file each, named like their card: ``sfda_regression.py`` (discretised-density-guided
  source-free regression, with source-only / AdaBN / kNN-mean / mean-teacher as switches of one module) and
  ``u3cf.py`` (multi-target adaptation: curriculum with prototype alignment, then a causal stage with a backdoor
  adjustment; source-only / SHOT / prototype-only as switches).
"""
