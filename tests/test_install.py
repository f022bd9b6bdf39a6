"""What ``pip install litlab`` puts into a user's environment: one import name, ``litlab``, so nothing of ours
shadows a PyPI distribution (Hugging Face's ``kernels``, which transformers imports when present, ``callbacks``,
``strategies``, ``sweeps``, ``seeds``, ``configs``...)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(out: Path) -> Path:
    """Build from a copy of the checkout: setuptools writes build/ and *.egg-info beside the sources."""
    src = out.parent / "src"
    skip = shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "wandb", "__pycache__")
    shutil.copytree(ROOT, src, ignore=skip)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(out),
        str(src),
    ]
    subprocess.run(pip, check=True, capture_output=True)
    (wheel,) = out.glob("litlab-*.whl")
    return wheel


def test_the_wheel_installs_one_top_level_name_beside_hugging_face_kernels(tmp_path):
    wheel = build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"litlab"}, sorted(top)
    assert "litlab/lit_modules/rl/ref_scores.json" in names  # package data travels
    assert "litlab/kernels/dispatch.py" in names and "litlab/benchmarks/kernels.py" in names

    # A site folder holding both: our wheel (a wheel of pure Python is installed by unpacking it) and a stand-in
    # for Hugging Face's `kernels` distribution with its own dist-info.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    (site / "kernels").mkdir()
    (site / "kernels" / "__init__.py").write_text(
        '"""Hugging Face kernel hub (stand-in)."""\nget_kernel = object()\n'
    )
    info = site / "kernels-0.17.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.17.2\n")
    probe = (
        "import importlib.metadata as md, kernels, litlab.kernels.dispatch as ours, litlab.lit_modules.core.io\n"
        "print(kernels.__file__); print(ours.__file__); print(md.version('kernels')); print(hasattr(kernels, 'get_kernel'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out[0] == str(site / "kernels" / "__init__.py")
    assert out[1] == str(site / "litlab" / "kernels" / "dispatch.py")
    # the version read is the first `kernels` distribution on sys.path: the stand-in, or the real one where
    # transformers (>= 5.25 depends on it) installed it into this environment
    assert out[2] != "" and out[3] == "True"


def test_hugging_face_kernels_is_not_shadowed_from_the_checkout_root():
    """From the checkout's root, `python -c` / `python -m litlab` put the checkout on sys.path, where its `kernels/`
    folder would hide Hugging Face's `kernels` (a dependency of transformers >= 5.25, imported when a model loads):
    importing litlab takes the checkout off sys.path first. As `litlab repro --jobs` starts its workers."""
    probe = (
        "import sys, litlab, importlib.util\n"
        "spec = importlib.util.find_spec('kernels')\n"
        "print(spec.origin if spec else None)\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "LlamaForCausalLM(LlamaConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, "
        "num_attention_heads=2, num_key_value_heads=1, vocab_size=11))\n"
        "print('loaded')"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    origin, loaded = out.stdout.split()
    assert (
        Path(origin).resolve() != (ROOT / "kernels" / "__init__.py").resolve() if origin != "None" else True
    )
    assert loaded == "loaded"
