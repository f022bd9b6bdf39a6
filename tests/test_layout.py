"""The layout stays true: every import of a project module (top-level or inside a function) points down a layer,
modules form no cycle, and the installed names are the ones pyproject declares.

Layers, top to bottom (docs/adding-a-method.md explains them):

    litlab (CLI: cli, repro, cards, runs, slurm, sweep, data, bench) and benchmarks/
    callbacks, strategies                      Lightning plugins; reach a family through its contract/report
    lit_modules/<family>/<method>.py           one method, one file named by its card's slug (seeds/<slug>.yaml);
                                               <slug>_full.py, its full-scale loop, and <slug>_curve.py, its
                                               several-budget evaluation, are the method's too
    lit_modules/<family>/*.py                  the family's harness, contract, report and shared maths
    datamodules                                data; imports only core (errors, HF loading, cache, atomic writes)
    lit_modules/core                           what several families use
    kernels                                    Triton kernels and their PyTorch references

A family reaches ``datamodules`` only through its ``contract.py``; ``datamodules`` never import a family.

Import names resolve to files through pyproject's ``package-dir`` (``litlab.kernels`` is ``kernels/``). The folders
it maps into ``litlab`` have no ``__init__.py`` (namespace portions), so that Python started in the checkout's root
does not take them for installed distributions of the same name (tests/test_install.py runs that).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
# import prefix -> folder, longest prefix first (a name resolves through the most specific mapping)
PACKAGE_DIRS: dict[str, str] = dict(sorted(SETUPTOOLS["package-dir"].items(), key=lambda kv: -len(kv[0])))
CARD_SLUGS = {p.stem for p in (ROOT / "seeds").glob("*.yaml")}


def installed_name(folder: Path) -> str | None:
    """The import name of a folder of the checkout, through the package-dir mapping (None: not installed)."""
    for prefix, top in PACKAGE_DIRS.items():
        if folder == ROOT / top or (ROOT / top) in folder.parents:
            return ".".join([prefix, *folder.relative_to(ROOT / top).parts])
    return None


def package_folders() -> dict[str, Path]:
    """Every installed package: import name -> folder (a mapped folder, or one under it holding a .py file; with or
    without __init__.py)."""
    out = {prefix: ROOT / top for prefix, top in PACKAGE_DIRS.items()}
    for top in PACKAGE_DIRS.values():
        for path in (ROOT / top).rglob("*.py"):
            if "__pycache__" not in path.parts:
                out[installed_name(path.parent)] = path.parent
    return out


def project_modules() -> dict[str, Path]:
    """Every installed module: import name -> file (a package's name -> its __init__.py)."""
    mods = {}
    for package, folder in package_folders().items():
        for path in folder.glob("*.py"):
            mods[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return mods


def namespace_packages() -> set[str]:
    return {name for name, folder in package_folders().items() if not (folder / "__init__.py").exists()}


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
        stem = name.removesuffix("_full").removesuffix("_curve").removesuffix("_medium")
        return ("method" if stem in CARD_SLUGS else "harness"), family
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


def project_imports(
    path: Path, module: str, known: dict[str, Path], namespaces: set[str]
) -> list[tuple[str, int]]:
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
            # the longest project module that the name starts with; a namespace package runs no code
            while name and name not in known and name not in namespaces:
                name = name.rpartition(".")[0]
            if name and name != module and name not in namespaces:
                out.append((name, node.lineno))
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, list[tuple[str, int]]]:
    known, namespaces = project_modules(), namespace_packages()
    return {m: project_imports(p, m, known, namespaces) for m, p in known.items()}


def test_every_import_points_down_a_layer(graph):
    bad = []
    for src, deps in graph.items():
        for dst, line in deps:
            if not allowed(src, dst):
                bad.append(f"{src}:{line} ({layer_of(src)[0]}) imports {dst} ({layer_of(dst)[0]})")
    assert not bad, "imports that run up a layer or across families:\n" + "\n".join(sorted(set(bad)))


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (each holds a cycle): Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


def one_cycle(edges: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the component's first node (breadth first, inside the component)."""
    start, inside = component[0], set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges.get(node, set()) & inside):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return path[::-1]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def described_cycles(graph: dict[str, list[tuple[str, int]]], node_of) -> list[str]:
    """One cycle per strongly connected part of the graph with its nodes mapped by ``node_of``, each arrow with the
    import that makes it: 'module:line -> ...', or 'package (module:line) -> ...'."""
    edges: dict[str, set[str]] = defaultdict(set)
    line: dict[tuple[str, str], str] = {}
    for src, deps in graph.items():
        for dst, lineno in deps:
            a, b = node_of(src), node_of(dst)
            if a != b and not b.startswith(a + ".") and not a.startswith(b + "."):
                edges[a].add(b)
                line.setdefault((a, b), f"{src}:{lineno}")
    out = []
    for component in strongly_connected(edges):
        path = one_cycle(edges, component)
        where = [line[a, b] for a, b in zip(path, path[1:] + path[:1])]
        steps = [w if w.startswith(a + ":") else f"{a} ({w})" for a, w in zip(path, where)]
        out.append(" -> ".join(steps) + f" -> {path[0]}")
    return out


def test_no_cycle_between_modules(graph):
    """Two modules that import each other (at the top or inside a function) are one idea split in two files, or a
    shared part that belongs below both."""
    cycles = described_cycles(graph, lambda module: module)
    assert not cycles, "module cycles (module:line of the import -> ...):\n" + "\n".join(cycles)


def test_no_cycle_between_packages(graph):
    modules = project_modules()

    def package(m: str) -> str:
        return m if modules[m].name == "__init__.py" else m.rpartition(".")[0]

    cycles = described_cycles(graph, package)
    assert not cycles, "package cycles (package (module:line of the import) -> ...):\n" + "\n".join(cycles)


def test_cycle_finder_finds_a_cycle_and_only_cycles():
    graph = {
        "a": [("b", 1)],
        "b": [("c", 2), ("d", 3)],
        "c": [("a", 4)],
        "d": [],
        "e": [("d", 5)],
    }
    assert described_cycles(graph, lambda m: m) == ["a:1 -> b:2 -> c:4 -> a"]
    assert described_cycles({"a": [("b", 1)], "b": []}, lambda m: m) == []


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
    declared, found = set(SETUPTOOLS["packages"]), set(package_folders())
    assert declared == found, f"pyproject lists {sorted(declared ^ found)} differently from the folders"
    holding_python = {
        d.name
        for d in ROOT.iterdir()
        if d.is_dir() and not d.name.startswith(".") and (any(d.glob("*.py")) or any(d.glob("*/*.py")))
    }
    assert holding_python - {"tests", "build"} == set(PACKAGE_DIRS.values())


def test_folders_mapped_into_litlab_are_namespace_portions():
    """With an ``__init__.py``, ``kernels/`` is imported as ``kernels`` by Python started in the checkout's root, in
    place of Hugging Face's installed ``kernels`` (transformers imports it): a regular package found later on
    sys.path wins over a namespace portion found first, never over a regular package."""
    regular = [
        top
        for prefix, top in PACKAGE_DIRS.items()
        if prefix != "litlab" and (ROOT / top / "__init__.py").exists()
    ]
    assert not regular, f"{regular}: remove their __init__.py (a README.md can say what the folder holds)"
    assert (
        ROOT / "litlab" / "__init__.py"
    ).exists()  # litlab itself: the installed name, and it joins the rest
