"""``litlab export``: a trained checkpoint as Hugging Face-loadable models at parameter budgets, or its adapters in
Hugging Face PEFT's layout.

    litlab export --ckpt runs/salaad/<run>/checkpoints/last.ckpt --budget 0.25,0.15 --out model/
    litlab export --peft runs/<experiment>/<run> [--out adapter/]

``--ckpt``/``--budget``: a budget is a fraction of the selected blocks' dense parameters (the
q/k/v/o/gate/up/down matrices; embeddings, norms and head are kept and not counted in it). A checkpoint trained
with SALAAD is deployed by Homomorphic Parameter Allocation on its (L, S); a dense one is compressed post hoc
(truncated SVD + top entries of the residual). Each budget goes to ``<out>/budget_<f>/`` (``config.json`` +
``model.safetensors`` for ``AutoModelForCausalLM.from_pretrained``, ``factored.safetensors``, ``deploy.json``);
``<out>/dense/`` is the checkpoint's own model. The table printed gives each budget's peak inference memory
(PyTorch allocator bytes of one forward, the factored model run as factors) against the dense model's. See
``litlab.lit_modules.structured.export`` and ``footprint``.

``--peft``: the adapters of a finished run (its folder: ``checkpoints/last.ckpt``; or any ``.ckpt`` of it) in
PEFT's LoRA layout, ``adapter_config.json`` + ``adapter_model.safetensors``, which
``peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), folder)`` loads onto the untouched
base (the ``base_model_name_or_path`` it records). The run's module is rebuilt from the checkpoint as ``litlab
fit`` built it, under its run seed; the folder goes to ``--out``, by default ``<run>/adapter_peft`` for
``last.ckpt`` (where ``SaveAdapters`` writes it at the end of a fit) and ``<run>/adapter_peft_<checkpoint name>``
for another checkpoint. Refused, with the reason: adapters outside a Hugging Face model, a Khatri–Rao branch, two
branches on one layer, and a run whose base weights moved away from that base (a branch merged into it, a
trained base): PEFT would load the adapter onto weights the run did not end with.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from litlab.lit_modules.core.errors import CheckpointError


def parse_budgets(text: str) -> list[float]:
    try:
        budgets = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"--budget {text!r}: comma-separated fractions, e.g. 0.25,0.15"
        ) from err
    if not budgets or any(not 0.0 <= b <= 1.0 for b in budgets):
        raise argparse.ArgumentTypeError(f"--budget {text!r}: every budget must lie in [0, 1]")
    return budgets


def checkpoint_of(source: str | Path) -> Path:
    """The checkpoint behind ``source``: a ``.ckpt`` file, or a run folder's ``checkpoints/last.ckpt``."""
    path = Path(source)
    if path.is_dir():
        last = path / "checkpoints" / "last.ckpt"
        if not last.is_file():
            found = sorted(p.name for p in (path / "checkpoints").glob("*.ckpt"))
            raise CheckpointError(
                f"{path} holds no checkpoints/last.ckpt (a run folder of litlab fit has one)"
                + (f"; name one of its checkpoints instead: {found}" if found else "")
            )
        return last
    if path.suffix != ".ckpt" or not path.is_file():
        raise CheckpointError(f"{path}: neither a run folder nor a .ckpt file")
    return path


def default_peft_folder(ckpt: Path) -> Path:
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return run / ("adapter_peft" if ckpt.name == "last.ckpt" else f"adapter_peft_{ckpt.stem}")


def export_peft(source: str | Path, out: str | Path | None = None) -> tuple[Path, dict]:
    """Write the adapters of the run behind ``source`` in PEFT's LoRA layout (see the module docstring): the
    folder written and its ``adapter_config.json``. ``CheckpointError`` with the reason when PEFT cannot hold
    them (a user error: ``litlab`` prints it in one line)."""
    # deferred, as in main: torch and the modules cost seconds to import, which `litlab export --help` need not pay
    import torch

    from litlab.lit_modules.analysis.checkpoints import module_from_checkpoint
    from litlab.lit_modules.core.peft_format import (
        PEFT_CONFIG_FILE,
        base_weight_digests,
        save_module_peft_adapter,
    )

    ckpt = checkpoint_of(source)
    # built as its constructor builds it (the base PEFT will load), then given the run's weights
    module = module_from_checkpoint(ckpt, load_state=False)
    start = base_weight_digests(module)
    module.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"])
    moved = [name for name, digest in base_weight_digests(module).items() if start.get(name) != digest]
    if moved:
        raise CheckpointError(
            f"{ckpt}: no PEFT adapter: the run's base weights differ from the base its module starts from "
            f"({len(moved)} tensors, e.g. {moved[:3]}): a branch merged into them or a trained base; a PEFT "
            "adapter on that base would not reproduce the run"
        )
    try:
        folder = save_module_peft_adapter(module, Path(out) if out is not None else default_peft_folder(ckpt))
    except ValueError as err:  # what PEFT's LoRA cannot hold, named by core.peft_format
        raise CheckpointError(f"{ckpt}: no PEFT adapter: {err}") from None
    return folder, json.loads((folder / PEFT_CONFIG_FILE).read_text())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="litlab export",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--ckpt", help="a DecoderLM / SALAADLM checkpoint (last.ckpt), deployed at --budget")
    what.add_argument(
        "--peft",
        metavar="RUN",
        help="a finished run's folder or one of its .ckpt files: write its adapters in PEFT's LoRA layout",
    )
    parser.add_argument("--budget", type=parse_budgets, help="with --ckpt: fractions, e.g. 1.0,0.6,0.25,0.15")
    parser.add_argument(
        "--out",
        help="output folder (required with --ckpt; with --peft default <run>/adapter_peft for last.ckpt, "
        "<run>/adapter_peft_<name> for another checkpoint)",
    )
    parser.add_argument(
        "--posthoc-density", type=float, default=0.05, help="with --ckpt: S density of post-hoc compression"
    )
    args = parser.parse_args(argv)
    if args.peft is not None:
        if args.budget is not None:
            parser.error("--budget goes with --ckpt, not --peft")
        return main_peft(args.peft, args.out)
    if args.budget is None or args.out is None:
        parser.error("--ckpt needs --budget and --out")
    # deferred: torch and the structured family cost seconds to import, which `litlab export --help` need not pay
    import torch

    from litlab.lit_modules.structured.export import export

    torch.set_num_threads(min(torch.get_num_threads(), 4))
    records = export(args.ckpt, args.budget, args.out, posthoc_density=args.posthoc_density)
    print(
        f"| budget | deployment | block params (fraction) | total params (dense {records[0]['dense_total_params']}) "
        "| factored bytes / dense bytes | peak inference bytes, factored / dense | folder |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r['budget']:g} | {r['source']} | {r['block_params']} ({r['block_fraction']:.4f}) | {r['total_params']} "
            f"| {r['factored_bytes']} / {r['dense_bytes']} = {r['factored_bytes_ratio']:.3f} "
            f"| {r['factored_peak_bytes']} / {r['dense_peak_bytes']} = {r['peak_ratio']:.3f} "
            f"| {args.out}/budget_{r['budget']:g} |"
        )
    return 0


def main_peft(source: str, out: str | None) -> int:
    folder, config = export_peft(source, out)
    base, others = config["base_model_name_or_path"], len(config["rank_pattern"])
    ranks = f"r = {config['r']}" + (f" ({others} modules with another rank)" if others else "")
    print(f"{folder}: PEFT LoRA adapter of {len(config['target_modules'])} modules, {ranks}")
    if base:
        print(
            f"load: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base!r}), {str(folder)!r})"
        )
    else:
        print("its base has no hub id or folder (a model built from a config): load it onto that model")
    return 0
