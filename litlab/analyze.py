"""``litlab analyze <kind>``: training-free analyses of saved checkpoints (the analysis family,
``litlab.lit_modules.analysis``). Each writes a report folder (``report.md``, ``results.json``, figures).

    litlab analyze diffract --base <src> --tuned <src> [--tuned <src> ...] [--domain code] [--out DIR]
    litlab analyze complexity --checkpoints pre=<src> post=<src> random=<src> [--task words] [--out DIR]
    litlab analyze lockin --run [NAME=]<run> [--run [NAME=]<run> ...] [--task-domain D] [--broad-domain D] [--out DIR]

A source is a Lightning checkpoint (``.ckpt``; adapters merged; ``<ckpt>#base`` is the module as its constructor
builds it, before training: the frozen base of an adapter run, θ0 of a litlab CPT run), a run folder (its
``checkpoints/last.ckpt``), or a Hugging Face folder / hub id. With two or more ``--tuned`` the report adds the
interpolation between the first two (and between the base and the first). Losses (swap test, head rewinding,
interpolation) are evaluated on the local domain corpora (``litlab.datamodules.domain_corpus``) for models with
litlab's character vocabulary; other models get the spectral table and head heatmaps (``--domain none``).
``complexity`` measures each checkpoint's rate–accuracy frontier (baseline, ICL k, online coding n, LoRA and its
quantised payloads; ``lit_modules.analysis.task_complexity``) on a local sums task and reads C(δ) off it; the
names ``pre``/``post``/``random`` also give the reductions R.
``lockin`` (``lit_modules.analysis.lock_in``) takes fine-tuning runs (run folders of ``litlab fit``, e.g. of
``configs/lock_in/quick.yaml``, or their ``.ckpt``; θ0 is the checkpoint's ``#base``): per distinct θ0, the top-k
basis of the broad-loss Hessian by Lanczos (a ``LockInFT`` run with its own plan and windows reuses the basis its
fit cached) and the Rayleigh check of each pair with a fresh Hessian product; per run, the final point recomputed
from the weights (L_T, L_B, drift, harm h, stiff-mode fraction f against the random floor k/P, compared with the
logged trajectory); pooled over the runs' trajectories, the linear fit of L_B on h_t (R², Spearman); and the
bifurcation comparison of every run against the first (final differences, drift-paradox witness, departure from
the first run's degradation curve, matched-task-loss broad loss, the spec's §7.6 check). Runs of other cards work
when their base is a TinyGPT: L_T needs a task domain (the run's DataModule's ``domain``, or ``--task-domain``);
without a logged trajectory the report uses θ0 and the final weights.
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

# each kind's arguments take their defaults from the analysis family (torch: seconds), so they are added only for
# the kind named: `litlab analyze --help` lists the kinds at once
KINDS = {
    "diffract": "spectra, swap test, head rewinding, interpolation of CPT checkpoints",
    "complexity": "rate–accuracy frontiers and C(target) of checkpoints on a task",
    "lockin": "curvature basis, stiff-mode fraction, harm-signal fit and bifurcation of fine-tuning runs",
}


def _analyses() -> ModuleType:
    """``litlab.analyses``: the analyses, torch and the analysis family (seconds to import)."""
    from litlab import analyses

    return analyses


def _diffract_arguments(p: argparse.ArgumentParser, analyses: ModuleType) -> None:
    p.add_argument(
        "--base", required=True, help="checkpoint / run folder / HF id of θ0 (append #base: see above)"
    )
    p.add_argument("--tuned", required=True, action="append", help="a tuned checkpoint (repeat for several)")
    p.add_argument(
        "--domain",
        action="append",
        choices=[*analyses.DOMAINS, "none"],
        help="the CPT domain of each --tuned (one value: for all; default code; none: spectra only)",
    )
    p.add_argument(
        "--general", default="text", choices=analyses.DOMAINS, help="the general domain (default text)"
    )
    p.add_argument(
        "--tokenizer",
        help="evaluate in this LM's tokens (smollm2, a Hugging Face id or folder); default: characters, which only "
        "litlab's char-level models read (other models then get spectra and head ratios only)",
    )
    p.add_argument(
        "--criteria", nargs="+", default=list(analyses.D.DEFAULT_CRITERIA), choices=analyses.D.CRITERIA
    )
    p.add_argument("--n-random", type=int, default=3)
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="run seed whose rewind.random_order stream draws the random orderings (as a fit of that seed does)",
    )
    p.add_argument("--windows", type=int, default=64, help="evaluation windows per domain")
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--alphas", type=int, default=11, help="points of the interpolation grid [0, 1]")
    p.add_argument("--out", default="runs/analyze/diffract", help="report folder")


def _complexity_arguments(p: argparse.ArgumentParser, analyses: ModuleType) -> None:
    p.add_argument(
        "--checkpoints", nargs="+", required=True, metavar="NAME=SRC", help="pre=… post=… random=…"
    )
    p.add_argument("--task", default="words", choices=sorted(analyses.TASKS))
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help="run seed whose streams draw the examples' order, the later epochs' order and the LoRA init (as a "
        "fit of that seed does)",
    )
    p.add_argument("--deltas", type=float, nargs="+", default=[0.25, 0.40], help="targets δ of C(δ)")
    p.add_argument("--icl-k", type=int, nargs="*", default=list(analyses.TCX.PLAN.icl_k))
    p.add_argument("--online-n", type=int, nargs="*", default=list(analyses.TCX.PLAN.online_n))
    p.add_argument(
        "--steps", type=int, default=analyses.TCX.PLAN.steps, help="fine-tuning steps (online coding, LoRA)"
    )
    p.add_argument("--lora-bits", type=int, nargs="*", default=list(analyses.TCX.PLAN.lora_bits))
    p.add_argument(
        "--lora-examples", type=int, default=analyses.TCX.PLAN.lora_examples, help="0: no LoRA points"
    )
    p.add_argument("--out", default="runs/analyze/complexity", help="report folder")


def _lockin_arguments(p: argparse.ArgumentParser, analyses: ModuleType) -> None:
    p.add_argument(
        "--run",
        required=True,
        action="append",
        metavar="[NAME=]RUN",
        help="a run folder written by litlab fit, or its .ckpt (repeat; the first is the reference)",
    )
    p.add_argument(
        "--task-domain", choices=analyses.DOMAINS, help="domain of L_T (default: the run's DataModule's)"
    )
    p.add_argument(
        "--broad-domain",
        choices=analyses.DOMAINS,
        help="domain of L_B and of the calibration set (default: the run's general_domain, else text)",
    )
    p.add_argument(
        "--windows", type=int, default=64, help="evaluation windows per domain (other DataModules)"
    )
    p.add_argument("--block-size", type=int, default=64, help="window length (other DataModules)")
    p.add_argument(
        "--k", type=int, help="size of the stiff basis (default: the run's curvature plan, else 20)"
    )
    p.add_argument("--lanczos-iters", type=int, help="Lanczos steps (default: the run's plan, else 50)")
    p.add_argument(
        "--cal-windows", type=int, help="broad calibration windows (default: the run's plan, else 64)"
    )
    p.add_argument(
        "--seed",
        type=int,
        help="run seed whose curvature stream draws the Lanczos start vector (default: the run's own seed)",
    )
    p.add_argument(
        "--rayleigh",
        type=int,
        choices=range(1, 1000),
        metavar="N",
        help="pairs re-checked with a fresh Hessian product (default: all k)",
    )
    p.add_argument(
        "--matched-rel", type=float, default=0.02, help="L* = (1 + this) · final L_T of the reference"
    )
    p.add_argument("--out", default="runs/analyze/lockin", help="report folder")


def _parser(kind: str | None) -> argparse.ArgumentParser:
    """``litlab analyze``'s parser, with the arguments of ``kind`` (None: the kinds only, for the top-level help)."""
    p = argparse.ArgumentParser(prog="litlab analyze", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="kind", required=True)
    add_arguments = {
        "diffract": _diffract_arguments,
        "complexity": _complexity_arguments,
        "lockin": _lockin_arguments,
    }
    for name, text in KINDS.items():
        kind_parser = sub.add_parser(name, help=text)
        if name == kind:
            add_arguments[name](kind_parser, _analyses())
    return p


def main(argv: list[str]) -> int:
    kind = argv[0] if argv and argv[0] in KINDS else None
    args = _parser(kind).parse_args(argv)
    analyses = _analyses()
    run = {"diffract": analyses.diffract, "complexity": analyses.complexity, "lockin": analyses.lockin}
    return run[args.kind](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
