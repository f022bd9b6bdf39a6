"""Commands that train nothing answer at once: ``litlab --help``, every tool's ``--help``, ``repro --list``,
``repro <slug> --null`` and ``--plan`` import neither torch nor Lightning (``import lightning`` alone takes seconds).
Their wall time against ``import lightning`` is a benchmark, not a test: ``litlab bench cli_startup``."""

from __future__ import annotations

import json
import subprocess
import sys

from litlab.__main__ import TOOLS

HEAVY = ("torch", "lightning", "transformers")
SLUG = "lokra"  # any card with recorded numbers
COMMANDS = [
    ["--help"],
    *([tool, "--help"] for tool in TOOLS),
    ["repro", "--list"],
    ["repro", SLUG, "--null"],
    ["repro", SLUG, "--plan"],
]


def test_commands_that_train_nothing_import_neither_torch_nor_lightning():
    # one process runs the commands in turn and names, after each, the heavy modules it was the first to load
    probe = f"""
import contextlib, io, json, sys
from litlab.__main__ import main
loaded = {{}}
for argv in {COMMANDS!r}:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            rc = main(list(argv))
        except SystemExit as stop:  # argparse's --help
            rc = stop.code
    heavy = [m for m in {HEAVY!r} if m in sys.modules and m not in loaded]
    loaded.update({{m: " ".join(argv) for m in heavy}})
    assert rc in (0, None), (argv, rc)
print(json.dumps({{m: cmd for m, cmd in loaded.items()}}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {}, "heavy modules loaded by (module: first command that loaded it): " + json.dumps(
        loaded
    )
