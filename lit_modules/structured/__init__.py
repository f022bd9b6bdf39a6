"""Structured-weight training: dense weight matrices trained under a sparse + low-rank structure and deployed at a
parameter budget.

* ``sparse_lowrank`` — the pure maths: proximal operators (singular-value thresholding, soft thresholding, hard
  cut), effective ranks, the integral threshold controller, one block's ADMM state and update, the Homomorphic
  Parameter Allocation (HPA) shrink rule, surrogates and post-hoc compression of a dense matrix.
* ``lm`` — ``DecoderLM``, a plain next-token LightningModule on a Llama built from its config (the family's
  harness: the method decorates it, it knows nothing of the method).
* ``capacity`` — ``CapacitySweep``, the validation loss at parameter budgets (HPA on a structured surrogate, or
  post-hoc compression of the dense weights when the run has none).
* ``salaad`` — SALAAD (arXiv 2602.00942), a Callback that runs the ADMM schedule on any LightningModule's linear
  layers.
* ``adhoc`` — the ad-hoc baselines trained for one budget (projected gradient descent onto a rank or sparsity
  constraint), what SALAAD's "comparable to ad-hoc methods" is measured against.
* ``report`` — the card report (loss-vs-budget curve, learned ranks/densities heatmap, export byte ratios).
"""
