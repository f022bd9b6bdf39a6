"""The ``litlab`` command: LightningCLI subcommands, plus ``repro``."""

from __future__ import annotations

import os
import sys
import warnings


def main(argv: list[str] | None = None) -> int:
    from_shell = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    # wandb must never block a run for a login prompt: offline unless the user logged in (litlab.runs.wandb_mode).
    from litlab.runs import wandb_mode

    os.environ.setdefault("WANDB_MODE", wandb_mode())
    os.environ.setdefault("WANDB_SILENT", "true")
    # Lightning 2.6 on torch 2.13 warns about torch's pytree API once per run: noise in a 20-run repro.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=Warning)
    if argv and argv[0] == "repro":
        from litlab.repro import main as repro_main

        return repro_main(argv[1:])
    from litlab.cli import LitlabCLI

    LitlabCLI(args=None if from_shell else argv)  # LightningCLI reads sys.argv itself when run from a shell
    return 0


if __name__ == "__main__":
    sys.exit(main())
