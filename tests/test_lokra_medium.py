"""LoKRA's medium-scale task ("LoKRA / LoKRA+: Low Kruskal-Rank Adaptation", ICML 2026; seeds/lokra.yaml): adapters
on CSPLoRA's frozen token ViT, read in accuracy. LoRA there is CSPLoRA's uniform plan, the frozen floor trains the
head alone, and the penalty changes LoKRA's factors and nothing else. The effect is the card's
(``litlab repro lokra --scale medium``)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from litlab.datamodules.synth_tokens import PlanningTaskData
from litlab.lit_modules.peft.csplora import CSPLoRAClassifier, TokenViTBase, frozen_token_vit_and_head
from litlab.lit_modules.peft.lokra import AdapterPlan, KruskalPenalty
from litlab.lit_modules.peft.lokra_medium import CLASSIFIER_ADAPTER, LoKRAClassifier

ROOT = Path(__file__).resolve().parent.parent
TINY_BASE = TokenViTBase(epochs=1)


@pytest.fixture(autouse=True)
def run_seed_restored(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")


def _data() -> PlanningTaskData:
    return PlanningTaskData(base_per_class=30, train_per_class=40, test_per_class=10)


def _fit(model: L.LightningModule, quiet_trainer, seed: int = 0) -> tuple[L.LightningModule, float]:
    L.seed_everything(seed, verbose=False)
    trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=0, deterministic=True)
    trainer.fit(model, datamodule=_data())
    return model, float(trainer.callback_metrics["val/acc"])


def test_lora_here_is_csplora_uniform_plan_at_the_same_rank(quiet_trainer):
    lokra_as_lora = LoKRAClassifier(
        mode="lora",
        adapter=AdapterPlan(rank=2, alpha=4.0, targets=CLASSIFIER_ADAPTER.targets),
        base=TINY_BASE,
    )
    uniform = CSPLoRAClassifier(plan="uniform", r_base=2, alpha_per_r_base=2.0, base=TINY_BASE)
    a, acc_a = _fit(lokra_as_lora, quiet_trainer)
    b, acc_b = _fit(uniform, quiet_trainer)
    assert acc_a == acc_b
    assert len(a.adapted) == len(b.adapted) == 17
    for name, layer in a.adapted.items():
        torch.testing.assert_close(layer.delta_weight(), b.adapted[name].delta_weight(), atol=0, rtol=0)
    torch.testing.assert_close(a.head.weight, b.head.weight, atol=0, rtol=0)


def test_the_frozen_floor_trains_the_head_alone(quiet_trainer):
    model, acc = _fit(LoKRAClassifier(adapt=False, base=TINY_BASE), quiet_trainer)
    assert model.adapted == {} and 0.0 <= acc <= 1.0
    untouched, _, warmed_head = frozen_token_vit_and_head(_data(), TINY_BASE, 100, 1e-2, "test")
    for name, value in untouched.state_dict().items():
        torch.testing.assert_close(model.model.state_dict()[name], value, atol=0, rtol=0)
    assert float((model.head.weight - warmed_head.weight).abs().max()) > 1e-4


def test_the_penalty_moves_lokras_factors_and_only_them(quiet_trainer):
    """Same seed, same init: λ = 0 is LoRA bit for bit; λ > 0 moves the factors (and through them the head)."""
    lora, acc_lora = _fit(LoKRAClassifier(mode="lora", base=TINY_BASE), quiet_trainer)
    zero, acc_zero = _fit(
        LoKRAClassifier(mode="lokra", penalty=KruskalPenalty(lam=0.0), base=TINY_BASE), quiet_trainer
    )
    strong, _ = _fit(
        LoKRAClassifier(mode="lokra", penalty=KruskalPenalty(lam=1.0), base=TINY_BASE), quiet_trainer
    )
    assert acc_zero == acc_lora
    for name, layer in lora.adapted.items():
        torch.testing.assert_close(zero.adapted[name].delta_weight(), layer.delta_weight(), atol=0, rtol=0)
    moved = max(
        float((strong.adapted[n].delta_weight() - layer.delta_weight()).abs().max())
        for n, layer in lora.adapted.items()
    )
    assert moved > 1e-4


def test_a_rank_plan_is_refused_with_the_value():
    with pytest.raises(ValueError, match="plan.json"):
        LoKRAClassifier(adapter=AdapterPlan(rank=2, alpha=4.0, rank_plan="plan.json"))


def test_the_medium_config_fits_from_the_litlab_command(tmp_path):
    from litlab.cli import LitlabCLI

    cli = LitlabCLI(
        args=[
            "fit",
            f"--config={ROOT / 'configs/lokra/medium.yaml'}",
            "--model.init_args.base.epochs=1",
            "--trainer.fast_dev_run=true",
            "--trainer.enable_progress_bar=false",
            f"--runs_dir={tmp_path / 'runs'}",
        ]
    )
    assert cli.trainer.state.finished and cli.trainer.global_step == 1
    model = cli.model
    assert isinstance(model, LoKRAClassifier) and model.mode == "lokra" and len(model.adapted) == 17
    assert {layer.branches["default"].rank for layer in model.adapted.values()} == {4}
