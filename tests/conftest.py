import os
from pathlib import Path

import pytest

# Two xdist workers (plus the subprocesses some tests start) on two cores: one thread each, or tiny
# matmuls spend their time in thread contention.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Without a GPU the Triton kernels are tested under the interpreter. Triton reads this when a kernel module is
# imported, and any test module may import one (litlab.lit_modules.longctx.sale does): set it before every test module.
import torch  # noqa: E402  (after OMP_NUM_THREADS)

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _shared_model_cache(tmp_path_factory):
    """One cache of locally pre-trained base models for the whole test session (per xdist worker)."""
    if "LITLAB_CACHE" not in os.environ:
        os.environ["LITLAB_CACHE"] = str(tmp_path_factory.mktemp("litlab_cache"))
    yield
