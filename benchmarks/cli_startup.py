"""Wall time of the ``litlab`` commands that train nothing, against ``python -c "import lightning"`` in the same run.

Each command is a fresh process (``python -m litlab ...``, as the ``litlab`` script starts it); each of ``--repeats``
rounds runs the ``import lightning`` reference and then every command, so that machine load hits both alike; the
table gives each command's median and its ratio to the reference's median. These commands import neither torch nor Lightning
(tests/test_startup.py checks that); the target is 1.5 s on a 2-core CPU machine. ``fit --help`` is listed for
comparison: LightningCLI's help is built from Lightning's and every method's signatures. Decides no card claim.

    litlab bench cli_startup [--repeats 5] [--slug lokra] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from litlab.__main__ import TOOLS


def commands(slug: str) -> list[list[str]]:
    return [
        ["--help"],
        *([tool, "--help"] for tool in TOOLS),
        ["repro", "--list"],
        ["repro", slug, "--null"],
        ["repro", slug, "--plan"],
        ["fit", "--help"],
    ]


def wall_seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="litlab bench cli_startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slug", default="lokra", help="the card of repro <slug> --null / --plan")
    parser.add_argument("--json", action="store_true", help="print the timings as JSON")
    args = parser.parse_args(argv)
    reference = [sys.executable, "-c", "import lightning"]
    runs = {" ".join(c): [sys.executable, "-m", "litlab", *c] for c in commands(args.slug)}
    times: dict[str, list[float]] = {"import lightning": [], **{name: [] for name in runs}}
    for _ in range(args.repeats):
        times["import lightning"].append(wall_seconds(reference))
        for name, cmd in runs.items():
            times[name].append(wall_seconds(cmd))
    medians = {name: statistics.median(t) for name, t in times.items()}
    base = medians["import lightning"]
    if args.json:
        print(
            json.dumps(
                {"medians_s": medians, "ratio_to_import_lightning": {n: m / base for n, m in medians.items()}}
            )
        )
        return 0
    print(f"| command | median wall s ({args.repeats} runs) | / import lightning |")
    print("|---|---|---|")
    for name, median in medians.items():
        print(f"| `{'python -c ' + repr(name) if name == 'import lightning' else 'litlab ' + name}` "
              f"| {median:.2f} | {median / base:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
