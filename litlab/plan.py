"""``litlab plan``: probe a fit config's frozen base once and write a CSPLoRA rank plan (ICML 2026, "CSPLoRA:
Confidence-Guided Structural Planning for Low-Rank Adaptation").

    litlab plan --config configs/csplora/quick.yaml --budget-per-module 2 --out plan.json [--figure plan.png]
    litlab fit  --config configs/csplora/quick.yaml --model.init_args.rank_plan=plan.json --model.init_args.r_base=4

The model of the config must be a ``litlab.lit_modules.core.rank_plan.RankPlanner``
(``make_rank_plan(datamodule) -> RankPlan``: CSPLoRA's classifier and LM probe and the LoKRA/LoRA language model are). The plan holds scores, not ranks: any budget and any adapter backend that takes
``rank_plan`` (LoRA, LoKRA/LoKRA+, Janus-LoRA, ...) reads its own ranks from it, without probing again.
``--stand-in`` probes the card's stand-in of a full config (``litlab.standin``: a tiny model of the same classes,
a few records, offline on the CPU; the planner's batch count shrunk to what they give).
Other arguments are ``litlab fit`` overrides (``--seed_everything=1``: the run seed, from which the probe draws its
batches).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from litlab.lit_modules.core.contracts import check_protocol
from litlab.lit_modules.core.errors import ConfigError, ContractError


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="litlab plan", description=__doc__.split("\n")[0])
    parser.add_argument("--config", action="append", required=True, help="a litlab fit config (repeatable)")
    parser.add_argument("--out", default="plan.json", help="where the plan goes (JSON)")
    parser.add_argument(
        "--budget-per-module", type=int, default=None, help="r_base to print ranks for (and record)"
    )
    parser.add_argument("--r-min", type=int, default=0)
    parser.add_argument("--figure", default=None, help="also write the depth x family saliency heatmap (png)")
    parser.add_argument(
        "--stand-in",
        action="store_true",
        help="probe the card's tiny stand-in of a full config (as `litlab fit --stand-in`), offline on the CPU",
    )
    args, overrides = parser.parse_known_args(argv)
    # the planner imports torch (seconds): only now, so that `litlab plan --help` answers at once
    from litlab.lit_modules.core.rank_plan import RankPlanner, saliency_heatmap

    configs = [a for c in args.config for a in ("--config", c)]
    fit_args = configs + overrides
    if args.stand_in:
        from litlab.standin import expand_stand_in_flag

        # the stand-in's overrides after the configs and before the user's, which win (as `litlab fit --stand-in`)
        fit_args = expand_stand_in_flag([*configs, "--stand-in", *overrides])
    model, datamodule = _build(fit_args)
    try:
        check_protocol(model, RankPlanner, "litlab plan")
    except ContractError as err:
        raise ConfigError(
            f"{err}: a CSPLoRA probe is wired for CSPLoRAClassifier, CSPLoRALanguageProbe and LoKRALanguageModel "
            "(configs/csplora/, configs/lokra/)"
        ) from None
    plan = model.make_rank_plan(datamodule)
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
        print(f"heatmap: {saliency_heatmap(plan, Path(args.figure))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
