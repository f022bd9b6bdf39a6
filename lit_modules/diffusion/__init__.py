"""Diffusion models on diffusers: continual personalisation by row-selective updates (SCNS).

* ``contract.py``    what the family reads from its DataModule (``ConceptStreamData``), checked at setup; the
                     only file of the family that imports ``datamodules/``.
* ``ddpm.py``        DDPM ε-loss on diffusers' ``DDPMScheduler``; the quick-scale text-to-image base (a
                     diffusers ``UNet2DConditionModel`` + a ``transformers.CLIPTextModel`` built from configs,
                     pre-trained here and cached once per seed); ``LatentT2I``, a full-scale diffusers
                     checkpoint (UNet, CLIP text encoder and tokenizer, VAE, scheduler) as the latent base.
* ``neurons.py``     cross-attention neurons (K/V rows): ground set, per-sample gradients in one backward,
                     saliency, diagonal Fisher, and ``RowDeltaBranch``, a row-selective branch of the adapter
                     core's ``AdapterLinear`` (merged in place and unwrapped: fusion-free).
* ``submodular.py``  facility location and the cost-aware (lazy) greedy (pure functions).
* ``harness.py``     ``ContinualNeuronTuning``: the concept-stream loop inside one fit, calling a method's
                     ``begin_task`` / ``training_step`` / ``end_task``, and the tools they call (token init, row
                     deltas and their optimiser, masked DDPM loss, merge and freezing guard, held-out loss,
                     samples); forgetting / plasticity metrics.
* ``report.py``      the stability-plasticity figure and table for the cards' report hooks.
* methods, one file each, named like their card: ``scns.py`` (SCNS, with all-K/V, random and top-k saliency
  selection as switches of one module).
"""
