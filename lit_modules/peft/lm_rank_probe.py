"""CSPLoRA's planner on a causal LM's frozen base, for the LM adapter backends (``LoKRALanguageModel``): the probe
``litlab plan`` runs (``make_rank_plan``) and ``adapter.rank_plan="probe"``, the same probe made by the fit itself
when it sets up (H. Ding et al., "CSPLoRA: Confidence-Guided Structural Planning for Low-Rank Adaptation", ICML 2026,
OpenReview WkARznT46l; Algorithm 1, stage 1, and Appendix D's "probe once" on the frozen base).

Why a fit may probe for itself: a full-scale config that names a plan file needs a second command first, and the
file lives outside the run folder; with "probe" one command makes the plan, builds the adapters from it and leaves
the plan in the run folder (``rank_plan.json``, the file another fit's ``rank_plan`` reads). It costs one probe per
launch (``adapter.probe_batches`` batches), and stays reproducible because the probe draws its batches from the run
seed's ``"probe"`` stream: a relaunch or an evaluation of the checkpoint re-probes to the same ranks. The shared
pieces (``plan_or_probe``, ``write_plan_into_run``) are those ``CSPLoRAClassifier`` uses at its fit start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor, nn

from litlab.lit_modules.core.adapters import target_linear_names
from litlab.lit_modules.core.rank_plan import (
    PROBE_AT_FIT_START,
    ProbeSettings,
    RankPlan,
    causal_lm_loss_and_confidence,
    family_of,
    plan_or_probe,
    probe_saliency,
    write_plan_into_run,
)
from litlab.lit_modules.core.seeding import derive_seed


class FitStartRankProbe:
    """Mixin of a LightningModule adapting a causal LM ``self.model`` with ``self.adapter_cfg`` (an ``AdapterPlan``:
    ``targets``, ``rank``, ``rank_plan``, ``probe_batches``), whose ``_inject(plan)`` builds the adapters and whose
    ``_logits(batch)`` runs the model. With ``rank_plan="probe"`` the adapters are built in ``setup``, after the
    probe, and before Lightning restores a checkpoint into them (their shapes follow the plan)."""

    model: nn.Module
    adapter_cfg: Any
    adapted: dict
    rank_plan_artefact: RankPlan | None
    hparams: Any
    trainer: Any
    _inject: Callable[[RankPlan | None], None]
    _logits: Callable[[Any], Tensor]

    def target_names(self) -> list[str]:
        targets = self.adapter_cfg.targets
        return target_linear_names(self.model, targets if isinstance(targets, str) else list(targets))

    def setup(self, stage: str) -> None:
        """``adapter.rank_plan="probe"``: probe the frozen base (``make_rank_plan``) and build the adapters from
        the plan, here, before Lightning restores a checkpoint into them (their shapes follow the plan). The base
        is moved to the trainer's device first: the probe runs where the fit will (LLaMA-2-7B on a GPU, not on
        the CPU Lightning leaves it on until after this hook)."""
        if self.adapted or self.adapter_cfg.rank_plan != PROBE_AT_FIT_START:
            return
        self.model.to(self.trainer.strategy.root_device)
        names = self.target_names()
        self.rank_plan_artefact = plan_or_probe(
            PROBE_AT_FIT_START, names, lambda: self.make_rank_plan(self.trainer.datamodule)
        )
        self._inject(self.rank_plan_artefact)

    def on_fit_start(self) -> None:
        if self.rank_plan_artefact is not None:
            ranks = self.rank_plan_artefact.ranks(self.adapter_cfg.rank)
            write_plan_into_run(self.trainer, self.rank_plan_artefact, ranks, r_base=self.adapter_cfg.rank)

    def make_rank_plan(self, datamodule, batches: int | None = None) -> RankPlan:
        """CSPLoRA's stage 1 on this LM (``litlab plan``, and the fit's setup with ``adapter.rank_plan="probe"``):
        confidence-weighted Taylor saliency of each target module's base weight over ``batches`` training
        batches (default ``adapter.probe_batches``; labels already next-token aligned, so no shift), the first
        ones of a training loader shuffled by the run seed's ``"probe"`` stream (the global stream is left as
        it was), on the device the base is on. Adapters, where already built, are still at B = 0, so the probed
        function is the frozen base's."""
        batches = self.adapter_cfg.probe_batches if batches is None else batches
        datamodule.setup("fit")
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed("probe"))
            loader = iter(datamodule.train_dataloader())
            try:
                probe_batches = [next(loader) for _ in range(batches)]
            except StopIteration:
                raise ValueError(
                    f"the CSPLoRA probe wants adapter.probe_batches={batches} training batches, but one epoch "
                    "of the data module gives fewer: lower adapter.probe_batches"
                ) from None
        device = next(self.model.parameters()).device
        probe_batches = [move_data_to_device(b, device) for b in probe_batches]
        names = self.target_names()
        modules = {n: self.model.get_submodule(n) for n in names}

        def loss_and_confidence(model: nn.Module, batch) -> tuple[Tensor, Tensor]:
            logits = self._logits(batch).float()
            return causal_lm_loss_and_confidence(logits, batch["labels"], aligned=True)

        settings = ProbeSettings(min_steps=batches, max_steps=batches)
        scores, stats = probe_saliency(self.model, modules, probe_batches, loss_and_confidence, settings)
        return RankPlan(
            scores=scores,
            families={n: family_of(n) for n in scores},
            base_model=str(self.hparams.backbone),
            probe=stats,
        )
