"""litlab: runnable, tested, comparable experiments for ICML 2026 methods, on PyTorch Lightning."""

import sys
from pathlib import Path

# The checkout's top-level folders install as litlab's sub-packages (pyproject: `kernels/` is `litlab.kernels`).
# When the checkout itself is on sys.path (`python -m litlab`, `python -m pytest` or `python -c` run from its root,
# as `litlab repro --jobs` starts its workers), its `kernels/` shadows Hugging Face's `kernels` package, which
# transformers >= 5.25 imports when it loads a model ("cannot import name 'CUDAProperties' from 'kernels'").
# Nothing imports the checkout's folders by their bare names, so the checkout root leaves sys.path here.
_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "kernels" / "__init__.py").exists():
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _CHECKOUT]
