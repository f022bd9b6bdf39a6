"""The ``litlab`` command: LightningCLI subcommands (fit/validate/test/predict), plus litlab's own tools."""

from __future__ import annotations

import importlib
import os
import signal
import sys

if __name__ == "__main__" and sys.path and sys.path[0] in ("", os.getcwd()):
    # `python -m litlab` put the working directory first on sys.path: a module there named like one litlab, a card
    # or a config imports (netrc.py, yaml.py) would run. litlab never imports from it (README, "What runs code").
    del sys.path[0]

import warnings  # noqa: E402  (after the working directory left sys.path)

from litlab.lit_modules.core.errors import USER_ERRORS, RunPreempted, RunStopped  # noqa: E402
from litlab.runs import wandb_mode

# LightningCLI's subcommands: `litlab.cli` imports Lightning and every method module (seconds), so only these load it
LIGHTNING_SUBCOMMANDS = {
    "fit": "train a model (with validation) from a config: litlab fit --config configs/<slug>/quick.yaml",
    "validate": "one evaluation pass over the validation set",
    "test": "one evaluation pass over the test set",
    "predict": "the model's predictions on the predict set",
}
# Subcommands that are not LightningCLI's: each module has ``main(argv: list[str]) -> int``.
TOOLS = {
    "repro": ("litlab.repro", "run a reproduction card (seeds/<slug>.yaml) and judge its claims"),
    "slurm": ("litlab.slurm", "write/submit an sbatch script for `litlab fit`"),
    "sweep": ("litlab.sweep", "run a wandb sweep file locally, without a wandb server"),
    "data": ("litlab.data", "build data sets locally (e.g. D4RL-layout HDF5)"),
    "bench": ("litlab.bench", "timings: litlab bench <name> (the modules of benchmarks/)"),
    "plan": ("litlab.plan", "CSPLoRA: probe a config's frozen base once, write a rank plan"),
    "analyze": ("litlab.analyze", "training-free analyses of checkpoints: litlab analyze diffract ..."),
    "export": ("litlab.export", "deploy a checkpoint as Hugging Face models (SALAAD budgets)"),
    "report": ("litlab.site", "a static HTML site of every card's verdicts, claims and figures (runs/site)"),
}


def usage() -> str:
    rows = [f"  {name:<10}{text}" for name, text in LIGHTNING_SUBCOMMANDS.items()]
    tools = [f"  {name:<10}{text}" for name, (_, text) in TOOLS.items()]
    return "\n".join(
        [
            "usage: litlab [--debug] <subcommand> [args]   (litlab <subcommand> --help: its options)",
            "",
            "LightningCLI subcommands (Lightning's options, e.g. -c CONFIG, --print_config):",
            *rows,
            "",
            "litlab's tools:",
            *tools,
            "",
            "--stand-in after --config configs/<slug>/full.yaml: that full config on the CPU, offline, on a tiny",
            "random model of its classes and a few records of its data (litlab.standin).",
            "",
            "A user error (bad file, missing model or data, busy run folder) is one line and exit code 2;",
            "--debug or LITLAB_DEBUG=1 shows the traceback.",
        ]
    )


def prepare_process() -> None:
    """What every litlab process sets before a run (also the worker processes of ``litlab repro --jobs``)."""
    # wandb must never block a run for a login prompt: offline unless the user logged in (litlab.runs.wandb_mode).
    os.environ.setdefault("WANDB_MODE", wandb_mode())
    os.environ.setdefault("WANDB_SILENT", "true")
    # Lightning 2.6 on torch 2.13 warns about torch's pytree API once per run: noise in a 20-run repro.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=Warning)


def _preempted_outside_training(signum: int, frame: object) -> None:
    """SIGTERM before Lightning's own handler is installed (building the model, loading data, setup): without this
    Python's default ends the process with no word. Inside a fit Lightning composes this handler after its own;
    then Lightning's path owns the signal (a checkpoint at the step, ``PreemptionCheckpoint``) and this does nothing."""
    if signal.getsignal(signum) is not _preempted_outside_training:
        return
    name = signal.Signals(signum).name
    raise RunPreempted(
        f"preempted by {name} outside the training loop (before it started, or after it ended): no checkpoint "
        "written at this point; relaunch the same command (with --ckpt_path last where a checkpoint exists)",
        status=f"preempted: {name} outside training",
        signal_number=signum,
    )


def main(argv: list[str] | None = None) -> int:
    """Runs a subcommand. A user error (``USER_ERRORS``: bad or missing file, model or data, busy run folder) is one
    line on stderr naming the cause and the file, exit code 2; ``--debug`` or ``LITLAB_DEBUG=1`` shows the
    traceback instead."""
    from_shell = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("LITLAB_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    if from_shell:
        sys.argv[1:] = argv  # LightningCLI reads sys.argv itself (and warns when given args as well)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        prepare_process()
        if argv[0] in TOOLS:
            return importlib.import_module(TOOLS[argv[0]][0]).main(argv[1:])
        if (
            from_shell
            and sys.platform != "win32"
            and signal.getsignal(signal.SIGTERM) in (None, signal.SIG_DFL)
        ):
            signal.signal(
                signal.SIGTERM, _preempted_outside_training
            )  # exit 143 and a message, not a silent death
        from litlab.cli import LitlabCLI  # imports every method module: only for LightningCLI's subcommands
        from litlab.standin import expand_stand_in_flag

        argv = expand_stand_in_flag(argv)  # --stand-in: the card's tiny models and data (litlab.standin)
        if from_shell:
            sys.argv[1:] = argv
        LitlabCLI(args=None if from_shell else argv)
        return 0
    except RunStopped as err:  # diverged, preempted, a failed write: its own exit code (README, run section)
        if debug:
            raise
        print(f"litlab: {short_message(err)}", file=sys.stderr)
        return err.exit_code
    except USER_ERRORS as err:
        if debug:
            raise
        print(f"litlab: error: {short_message(err)}", file=sys.stderr)
        print("(the traceback: rerun with --debug or LITLAB_DEBUG=1)", file=sys.stderr)
        return 2


def short_message(err: BaseException, max_lines: int = 4) -> str:
    """The error's own sentence(s), without the wrapped library error it may quote after them."""
    lines = [line for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    return "\n".join(lines[:max_lines]) + (" [...]" if len(lines) > max_lines else "")


if __name__ == "__main__":
    sys.exit(main())
