"""The layout stays true: every import of a project module (top-level or inside a function) points down a layer,
packages form no cycle, and the installed names are the ones pyproject declares.

Layers, top to bottom (docs/adding-a-method.md explains them):

    litlab (CLI: cli, repro, cards, runs, slurm, sweep, data, bench) and benchmarks/
    callbacks, strategies                      Lightning plugins; reach a family through its contract/report
    lit_modules/<family>/<method>.py           one file per method, named by its card's slug (seeds/<slug>.yaml)
    lit_modules/<family>/*.py                  the family's harness, contract, report and shared maths
    datamodules                                data; imports only core (errors, HF loading, cache, atomic writes)
    lit_modules/core                           what several families use
    kernels                                    Triton kernels and their PyTorch references

A family reaches ``datamodules`` only through its ``contract.py``; ``datamodules`` never import a family.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {  # import prefix -> folder, as pyproject's package-dir installs them
    "litlab.benchmarks": "benchmarks",
    "litlab.callbacks": "callbacks",
    "litlab.datamodules": "datamodules",
    "litlab.kernels": "kernels",
    "litlab.strategies": "strategies",
    "litlab.lit_modules": "lit_modules",
    "litlab": "litlab",
}
CARD_SLUGS = {p.stem for p in (ROOT / "seeds").glob("*.yaml")}


def project_modules() -> dict[str, Path]:
    mods = {}
    for prefix, folder in PACKAGE_DIRS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            mods[".".join([prefix, *parts])] = path
    return mods


def layer_of(module: str) -> tuple[str, str | None]:
    """(layer, family) of a project module."""
    parts = module.split(".")
    if module.startswith("litlab.kernels"):
        return "kernels", None
    if module.startswith("litlab.lit_modules.core"):
        return "core", None
    if module.startswith("litlab.datamodules"):
        return "data", None
    if module.startswith("litlab.lit_modules"):
        if len(parts) < 3:
            return "harness", None  # the lit_modules package itself
        family = parts[2]
        if len(parts) == 3:
            return "harness", family
        name = parts[3]
        if name == "contract":
            return "contract", family
        return ("method" if name in CARD_SLUGS else "harness"), family
    if module.startswith(("litlab.callbacks", "litlab.strategies")):
        return "plugin", None
    return "cli", None


RANK = {"kernels": 0, "core": 1, "data": 2, "contract": 3, "harness": 4, "method": 5, "plugin": 6, "cli": 7}


def allowed(src: str, dst: str) -> bool:
    (ls, fs), (ld, fd) = layer_of(src), layer_of(dst)
    if ls == "cli":
        return True
    if ls == "plugin":
        # callbacks import callbacks, strategies import strategies; never the CLI, never a data module directly
        return (
            ld in ("plugin",)
            and src.split(".")[1] == dst.split(".")[1]
            or ld in ("kernels", "core", "contract", "harness", "method")
        )
    if ld == "data":
        return ls in ("data", "contract")  # a family touches data only through its contract
    if ld in ("contract", "harness", "method"):
        if ls in ("kernels", "core", "data"):
            return False
        if fd is not None and fs != fd:
            return False  # families do not import each other; what two families share goes to core
        return RANK[ld] <= RANK[ls]
    return RANK[ld] <= RANK[ls]


def project_imports(path: Path, module: str, known: dict[str, Path]) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        for name in names:
            # the longest project module that the name starts with
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.append((name, node.lineno))
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[str, int]]]:
    known = project_modules()
    return {m: project_imports(p, m, known) for m, p in known.items()}


def test_every_import_points_down_a_layer(graph):
    bad = []
    for src, deps in graph.items():
        for dst, line in deps:
            if not allowed(src, dst):
                bad.append(f"{src}:{line} ({layer_of(src)[0]}) imports {dst} ({layer_of(dst)[0]})")
    assert not bad, "imports that run up a layer or across families:\n" + "\n".join(sorted(set(bad)))


def test_no_cycle_between_packages(graph):
    def package(m: str) -> str:
        return m if (project_modules()[m].name == "__init__.py") else m.rpartition(".")[0]

    edges = defaultdict(set)
    for src, deps in graph.items():
        for dst, _ in deps:
            a, b = package(src), package(dst)
            if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
                edges[a].add(b)
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]) if nxt in stack else nxt)
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "package cycles:\n" + "\n".join(cycles)


def test_layer_rule_rejects_upward_arrows():
    assert allowed("litlab.lit_modules.rl.dare", "litlab.lit_modules.rl.nets")
    assert allowed("litlab.lit_modules.rl.contract", "litlab.datamodules.rl")
    assert not allowed("litlab.lit_modules.rl.nets", "litlab.datamodules.rl")
    assert not allowed("litlab.datamodules.rl", "litlab.lit_modules.rl.replay")
    assert not allowed("litlab.lit_modules.core.pretrain", "litlab.datamodules.text")
    assert not allowed("litlab.lit_modules.rl.nets", "litlab.lit_modules.rl.dare")
    assert not allowed("litlab.lit_modules.rl.dare", "litlab.lit_modules.continual.harness")
    assert not allowed("litlab.callbacks.run_summary", "litlab.runs")
    assert not allowed("litlab.callbacks.continual", "litlab.datamodules.continual")
    assert not allowed("litlab.kernels.lowrank", "litlab.lit_modules.core.models")


def test_pyproject_installs_every_package_folder():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(cfg["packages"])
    assert cfg["package-dir"] == PACKAGE_DIRS | {"litlab": "litlab"}
    found = {m for m, p in project_modules().items() if p.name == "__init__.py"}
    assert declared == found, f"pyproject lists {sorted(declared ^ found)} differently from the folders"
