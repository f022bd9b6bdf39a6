"""``litlab plan``: probe a fit config's frozen base once and write a CSPLoRA rank plan (ICML 2026, "CSPLoRA:
Confidence-Guided Structural Planning for Low-Rank Adaptation").

    litlab plan --config configs/csplora/quick.yaml --budget-per-module 2 --out plan.json [--figure plan.png]
    litlab fit  --config configs/csplora/quick.yaml --model.init_args.rank_plan=plan.json --model.init_args.r_base=4

The model of the config must offer ``make_rank_plan(datamodule) -> RankPlan`` (CSPLoRA's classifier and the
LoKRA/LoRA language model do). The plan holds scores, not ranks: any budget and any adapter backend that takes
``rank_plan`` (LoRA, LoKRA/LoKRA+, Janus-LoRA, ...) reads its own ranks from it, without probing again.
Other arguments are ``litlab fit`` overrides (``--data.init_args.seed=1``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from litlab.lit_modules.core.errors import ConfigError


def _build(fit_args: list[str]) -> tuple[Any, Any]:
    """The config's LightningModule and DataModule, built as ``litlab fit`` builds them, with no run folder,
    logger or checkpoint."""
    import lightning as L

    from litlab.cli import LitlabCLI

    class PlanCLI(LitlabCLI):
        def before_instantiate_classes(self) -> None:
            self.run_dir = Path(".")

        def instantiate_trainer(self, **kwargs: Any) -> L.Trainer:
            return L.Trainer(
                logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu"
            )

    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        cli = PlanCLI(args=fit_args, run=False)
    finally:
        sys.argv = argv
    return cli.model, cli.datamodule


def heatmap(plan, path: Path) -> Path:
    """Depth × family map of the calibrated, smoothed scores s_l (the plan's structure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    s = plan.structure("csplora")
    families = sorted({plan.families[n] for n in s})
    depth = {n: int(m.group(1)) if (m := re.search(r"\.(\d+)\.", f".{n}.")) else -1 for n in s}
    layers = sorted(set(depth.values()))
    grid = np.full((len(layers), len(families)), np.nan)
    for n, v in s.items():
        grid[layers.index(depth[n]), families.index(plan.families[n])] = v
    fig, ax = plt.subplots(figsize=(1.2 + 0.8 * len(families), 1.2 + 0.25 * len(layers)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(families)), families, rotation=45, ha="right")
    ax.set_yticks(range(len(layers)), ["(none)" if d < 0 else str(d) for d in layers])
    ax.set_xlabel("module family")
    ax.set_ylabel("layer")
    ax.set_title(f"CSPLoRA saliency s_l: {plan.base_model}", fontsize=8)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="litlab plan", description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", required=True, help="a litlab fit config (repeatable)")
    parser.add_argument("--out", default="plan.json", help="where the plan goes (JSON)")
    parser.add_argument(
        "--budget-per-module", type=int, default=None, help="r_base to print ranks for (and record)"
    )
    parser.add_argument("--r-min", type=int, default=0)
    parser.add_argument("--figure", default=None, help="also write the depth x family saliency heatmap (png)")
    args, overrides = parser.parse_known_args(argv)
    fit_args = [a for c in args.config for a in ("--config", c)] + overrides
    model, datamodule = _build(fit_args)
    make = getattr(model, "make_rank_plan", None)
    if make is None:
        raise ConfigError(
            f"{type(model).__name__} has no make_rank_plan(datamodule): a CSPLoRA probe is wired for "
            "CSPLoRAClassifier and LoKRALanguageModel (configs/csplora/, configs/lokra/)"
        )
    plan = make(datamodule)
    if args.budget_per_module is not None:
        plan.made_for_r_base = args.budget_per_module
    path = plan.save(args.out)
    print(f"litlab plan: {len(plan.scores)} modules, probe {plan.probe}; wrote {path}")
    if args.budget_per_module is not None:
        ranks = plan.ranks(args.budget_per_module, args.r_min)
        print(f"ranks at r_base = {args.budget_per_module} (total {sum(ranks.values())}):")
        for name, r in ranks.items():
            print(f"  {name}: {r}")
    if args.figure:
        print(f"heatmap: {heatmap(plan, Path(args.figure))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
