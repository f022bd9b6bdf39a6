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


def files_missing_from_the_editable_install() -> list[str]:
    """The package files that `make install`'s tree of links (setuptools' strict editable mode, pyproject) lacks, or
    links whose file is gone: a module added since the install fails to import with an error that does not say why."""
    import tomllib

    import litlab

    trees = [Path(p) for p in litlab.__path__ if (Path(p) / "__init__.py").is_symlink()]
    if not trees:
        return []  # installed otherwise (a wheel, setuptools' default editable mode): nothing to compare
    tree = trees[0].parent
    mapping = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    wanted = {
        tree.joinpath(*prefix.split("."), path.relative_to(PROJECT_ROOT / folder))
        for prefix, folder in mapping.items()
        for path in (PROJECT_ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    linked = {p for p in tree.rglob("*.py") if p.is_symlink()}
    added = [str(p.relative_to(tree)) for p in sorted(wanted - linked)]
    removed = [f"{p.relative_to(tree)} (removed)" for p in sorted(linked) if not p.exists()]
    return added + removed


def pytest_configure(config):
    missing = files_missing_from_the_editable_install()
    if missing:
        raise pytest.UsageError(
            f"the editable install lacks {', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}: "
            "run `make install` (its links are made at install time: see pyproject)"
        )


@pytest.fixture(scope="session", autouse=True)
def _shared_model_cache(tmp_path_factory):
    """One cache of locally pre-trained base models for the whole test session, shared by the xdist workers
    (``train_and_cache`` holds a lock while it builds, so a model two workers need is trained once)."""
    if "LITLAB_CACHE" not in os.environ:
        base = tmp_path_factory.getbasetemp()
        if os.environ.get("PYTEST_XDIST_WORKER"):
            base = base.parent  # the session's folder above popen-gw0, popen-gw1, ...
        cache = base / "litlab_cache"
        cache.mkdir(exist_ok=True)
        os.environ["LITLAB_CACHE"] = str(cache)
    yield


# Lightning's DDP launcher writes these into os.environ of the process that fits; a later test's subprocess
# (a killed-and-resumed fit, an sbatch job) would then inherit a fixed MASTER_PORT and can meet EADDRINUSE
# (seen in clean-clone CI runs). Each test gets back the environment it started with.
DDP_ENVIRONMENT = ("MASTER_PORT", "MASTER_ADDR", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "RANK")


@pytest.fixture(autouse=True)
def _no_ddp_environment_left_by_earlier_tests():
    before = {name: os.environ.get(name) for name in DDP_ENVIRONMENT}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    # Nor a process group: a single-device DDP fit leaves one initialised in the test worker, and ranks forked
    # by a later test would inherit it without its threads (a CI run hung in the lordo resume test)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture
def quiet_trainer(tmp_path):
    """``quiet_trainer(**kwargs) -> L.Trainer``: the CPU Trainer most tests build (one device, no logger, no
    checkpoints, no progress bar or model summary), writing under the test's ``tmp_path``; keyword arguments
    override or add any Trainer argument (``max_steps=4``, ``logger=CSVLogger(...)``, ``callbacks=[...]``)."""
    import lightning as L

    def make(**kwargs) -> L.Trainer:
        settings = {
            "accelerator": "cpu",
            "devices": 1,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": tmp_path,
            **kwargs,
        }
        return L.Trainer(**settings)

    return make
