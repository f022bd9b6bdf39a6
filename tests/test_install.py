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
    assert "litlab/py.typed" in names  # type checkers read litlab's annotations in a user's environment

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


# the folders pyproject maps into litlab that share a name with a distribution on PyPI (or could)
SHADOWABLE = ("kernels", "callbacks", "strategies", "benchmarks", "datamodules", "lit_modules")


def tiny_export(tmp_path: Path, quiet_trainer) -> Path:
    """``litlab export`` of a 1-step DecoderLM checkpoint (a 2-layer Llama of hidden size 16): the folder a user
    loads with ``AutoModelForCausalLM.from_pretrained``."""
    import torch
    from torch.utils.data import DataLoader

    from litlab.__main__ import main
    from litlab.lit_modules.structured.lm import DecoderLM, DecoderShape

    module = DecoderLM(net=DecoderShape(hidden_size=16, intermediate_size=32, max_positions=32))
    tokens = torch.randint(0, 97, (4, 17), generator=torch.Generator().manual_seed(0))
    batches = [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(module, DataLoader(batches, batch_size=2))
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    out = tmp_path / "export"
    assert main(["export", "--ckpt", str(ckpt), "--budget", "0.5", "--out", str(out)]) == 0
    return out


def test_python_started_in_the_checkout_root_imports_like_anywhere_else(tmp_path, quiet_trainer):
    """Python started in the checkout's root (``python -c``, a notebook, a script there) has the root first on
    sys.path. Its top-level folders are namespace portions, so an installed package of the same name wins: Hugging
    Face's ``kernels`` (transformers >= 5.25 imports it to build a Llama), and stand-ins for the other names. The
    checkout's ``litlab/`` folder, found first there, joins the installed rest of litlab; an exported model loads."""
    export = tiny_export(tmp_path, quiet_trainer)
    stand_ins = tmp_path / "site"
    for name in SHADOWABLE:
        if name != "kernels":  # the real one is installed with transformers
            (stand_ins / name).mkdir(parents=True)
            (stand_ins / name / "__init__.py").write_text(f"STAND_IN = {name!r}\n")
    probe = f"""
import importlib, sys
from pathlib import Path
import transformers.models.llama.modeling_llama
from transformers import AutoModelForCausalLM
import kernels
assert Path(kernels.__file__).parent.name == "kernels" and Path(kernels.__file__).parent != Path.cwd() / "kernels"
assert hasattr(kernels, "get_kernel"), kernels.__file__  # Hugging Face's
for name in {SHADOWABLE!r}:
    if name != "kernels":
        assert importlib.import_module(name).STAND_IN == name, name
import litlab.kernels.dispatch, litlab.callbacks.run_summary, litlab.strategies.lordo, litlab.datamodules.text
import litlab.benchmarks.rl_loop, litlab.lit_modules.core.io, litlab.lit_modules.structured.lm, litlab.cli
for folder in ("dense", "budget_0.5"):
    model = AutoModelForCausalLM.from_pretrained({str(export)!r} + "/" + folder)
    assert model(input_ids=__import__("torch").tensor([[1, 2, 3]])).logits.shape == (1, 3, 97)
print("ok", sys.path[0] == "")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PYTHONPATH"] = str(stand_ins)
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "True"]  # the root was on sys.path, first
