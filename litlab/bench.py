"""``litlab bench <name> [args]``: run ``benchmarks/<name>.py`` (``litlab bench --list`` names them)."""

from __future__ import annotations

import importlib
import pkgutil

import litlab.benchmarks


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(litlab.benchmarks.__path__))


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print("usage: litlab bench <name> [args]\n\nbenchmarks: " + ", ".join(names))
        return 0 if argv else 2
    if argv[0] not in names:
        print(f"litlab bench: no benchmark {argv[0]!r}; there are: {', '.join(names)}")
        return 2
    return int(importlib.import_module(f"litlab.benchmarks.{argv[0]}").main(argv[1:]) or 0)
