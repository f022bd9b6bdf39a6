"""The analysis family: measurements of training, not new trainers.

Its users point these at their own checkpoints and runs (``litlab analyze <kind> ...``) or attach them as probes
to any ``litlab fit``:

* ``spectral.py``  the linear algebra of comparing two weight matrices (norms, ranks, Mirsky ratio, singular-vector
  alignment, subspace overlap, the value/vector swap), as pure functions;
* ``heads.py``     per-head views of attention projections (TinyGPT, Llama/OLMo q/k/v/o with GQA, GPT-2 ``c_attn``)
  and head rewinding masks;
* ``checkpoints.py`` plain weights from a Lightning checkpoint (adapters merged), a run folder, a safetensors
  file, a Hugging Face folder or id;
* ``contract.py``  what a family module reads from its DataModule;
* ``diffract.py``  Diffract (where continued pre-training puts its update), its CPT module and analysis.
* ``complexity_coding.py`` the bit accounting of task complexity (arithmetic / KT / prequential codes, frontier);
* ``task_complexity.py`` task complexity (bits to reach a target): the strategies, their rate–accuracy frontiers
  per checkpoint state and the ``TaskComplexity`` module.
* ``curvature.py`` Hessian-vector products (``torch.func``), Lanczos with full re-orthogonalisation, the Rayleigh
  check of eigenpairs, power iteration, Hutchinson's trace;
* ``lock_in.py``   trajectory lock-in: harm signal, stiff-mode fraction, soft-mode projection, collapse and
  bifurcation statistics, the ``LockInFT`` module, and what ``litlab analyze lockin`` compares between runs.
* ``standin.py``   the full-scale configs' stand-ins (``litlab fit --stand-in``): tiny models of the full configs'
  classes and a few records of their Hugging Face data sets in the Hub's layout.
"""
