"""litlab/full_plan*.py: the full-scale plan's counts and formulas, checked against the published parameter counts,
torch's FlopCounterMode and the tensors autograd saves, on models of the full configs' classes at the stand-in's
size (a 2-layer LlamaForCausalLM of width 32-64, as lit_modules/peft/standin.py writes)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers

from litlab.full_plan import card_rows, estimate_run, full_scale_table, load_config
from litlab.full_plan_formulas import (
    MatmulWeights,
    Stack,
    counted_flops,
    lm_activation_bytes,
    lm_flops,
    saved_tensor_bytes,
)
from litlab.full_plan_others import meta_train_step, resnet
from litlab.lit_modules.core.adapters import inject_adapters
from litlab.model_shapes import param_count
from litlab.repro import main as repro_main
from litlab.repro import override_args

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_llama(layers: int, attn: str) -> tuple[transformers.LlamaForCausalLM, transformers.LlamaConfig]:
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config), config


def train_step(model, ids: torch.Tensor, autocast: bool):
    def step() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids).logits
        return F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())

    return step


@pytest.mark.parametrize(
    ("model_id", "published"),
    [
        ("meta-llama/Llama-2-7b-hf", 6_738_415_616),  # the model card's 7B (safetensors metadata)
        ("stable-diffusion-v1-5/stable-diffusion-v1-5:unet", 859_520_964),
        ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers:transformer", 1_418_996_800),
        ("google/vit-base-patch16-224-in21k", 85_798_656),  # ViT-B/16 without the pooler
    ],
)
def test_parameter_counts_are_the_published_ones(model_id: str, published: int):
    assert param_count(model_id) == published


def test_resnets_are_torchvisions_layer_for_layer():
    # torchvision's model table: resnet18 11,689,512 and resnet50 25,557,032 parameters
    assert sum(p.numel() for p in resnet("resnet18").parameters()) == 11_689_512
    assert sum(p.numel() for p in resnet("resnet50").parameters()) == 25_557_032


@pytest.mark.parametrize("mode", ["full", "lora", "lokra_plus", "soft_prompt", "forward"])
def test_transformer_flops_formula_equals_flop_counter(mode: str):
    """Eager attention (matmuls FlopCounterMode sees on the CPU); the formula counts the same ops exactly."""
    from litlab.lit_modules.peft.lokra import AdapterPlan, inject_lokra

    model, config = tiny_llama(2, "eager")
    b, s = 2, 48
    ids = torch.randint(0, 97, (b, s))
    if mode != "full":
        model.requires_grad_(False)
    if mode == "lora":
        inject_adapters(model, TARGETS, rank=4, alpha=8.0)
    if mode == "lokra_plus":
        inject_lokra(
            model,
            "lokra_plus",
            AdapterPlan(rank=4, targets=("q_proj", "k_proj", "v_proj", "up_proj", "down_proj")),
        )
    prompt = torch.zeros(1, 8, 64, requires_grad=True)

    def step() -> torch.Tensor:
        if mode != "soft_prompt":
            return train_step(model, ids, False)()
        emb = torch.cat([prompt.expand(b, -1, -1), model.get_input_embeddings()(ids)], dim=1)
        return model(inputs_embeds=emb).logits.float().mean()

    seq = s + 8 if mode == "soft_prompt" else s
    counted = counted_flops(step, backward=mode != "forward")
    w = MatmulWeights.of(model, input_needs_grad=mode == "soft_prompt")
    assert lm_flops(w, Stack.of(config), b, seq, train=mode != "forward") == pytest.approx(counted, rel=1e-3)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("trained", [True, False], ids=["full", "lora"])
def test_activation_formula_within_a_tenth_of_what_autograd_saves(trained: bool, autocast: bool):
    """The memory estimate's activations at full scale are this formula; at the stand-in's size it must predict
    the bytes autograd keeps for backward (SDPA attention, as at full scale), for 2 and 4 layers."""
    for layers in (2, 4):
        model, config = tiny_llama(layers, "sdpa")
        if not trained:
            model.requires_grad_(False)
            inject_adapters(model, TARGETS, rank=4, alpha=8.0)
        b, s = 2, 128
        ids = torch.randint(0, 97, (b, s))
        measured = saved_tensor_bytes(train_step(model, ids, autocast), list(model.parameters()))
        formula = lm_activation_bytes(
            Stack.of(config),
            MatmulWeights.of(model),
            b,
            s,
            "bf16" if autocast else "fp32",
            trained=trained,
            fp32_residual=True,
        )
        assert formula == pytest.approx(measured, rel=0.10), (layers, formula, measured)


def test_meta_device_count_equals_the_cpu_count():
    """What conv nets and UNets are planned with: the meta-device trace counts what the CPU run does."""
    torch.manual_seed(0)
    net = resnet("resnet18", classes=None)
    x = torch.randn(2, 3, 64, 64)
    cpu_flops = counted_flops(lambda: net(x), backward=True)
    cpu_saved = saved_tensor_bytes(lambda: net(x), list(net.parameters()))
    with torch.device("meta"):
        meta_net = resnet("resnet18", classes=None)
    assert meta_train_step(meta_net, lambda: (torch.empty(2, 3, 64, 64),), train=True) == (
        cpu_flops,
        cpu_saved,
    )


def test_overrides_apply_as_lightningcli_would():
    cfg = load_config(
        "configs/janus_lora/full.yaml",
        [
            "--model=litlab.lit_modules.continual.harness.SequentialLoRA",
            "--model.init_args.lr=0.0",
            "--data.init_args.extra.deep=3",
        ],
    )
    assert cfg["model"]["class_path"].endswith("SequentialLoRA")
    assert cfg["model"]["init_args"]["rank"] == 10 and cfg["model"]["init_args"]["lr"] == 0.0
    assert cfg["data"]["init_args"]["extra"] == {"deep": 3}
    with pytest.raises(ValueError, match="--key=value"):
        load_config("configs/janus_lora/full.yaml", ["--model.init_args.lr"])


def test_plan_prints_counts_memory_hours_and_the_slurm_command(capsys):
    assert repro_main(["lordo", "--scale", "full", "--plan", "--only", "lordo_full"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 162,148,608 total, 162,148,608 trainable (bf16)" in out
    assert "memory/GPU" in out and "activations" in out and "H100 GPU-hours at 40% of 989 TFLOP/s" in out
    assert (
        "slurm: litlab slurm --config configs/lordo/full.yaml --seed_everything=0 --nodes 1 --gpus-per-node 4 --time"
        in out
    )
    assert "in all: " in out and "H100 GPU-hours for these 1 fits" in out


def test_gpu_hours_follow_from_the_flops():
    est = estimate_run("configs/lordo/full.yaml", [])
    assert est.gpus == 4
    assert est.gpu_hours == pytest.approx(est.flops / (0.4 * 989.4e12) / 3600)
    # 6·N·T dominates: the LM's matmul weights, 32 x 1024 tokens, 12,288 steps, 4 GPUs
    assert est.flops > 6 * 162e6 * 32 * 1024 * 12288 * 4 * 0.8


FORMULA_CARDS = ("dare", "lordo", "ngt", "salaad")


def test_the_docs_table_rows_of_formula_cards_are_up_to_date():
    """The cheap cards' rows (the whole file: the slow test below; `litlab repro --full-scale-table`)."""
    doc = open("docs/full-scale.md").read()
    rows = [
        line for line in full_scale_table(override_args, FORMULA_CARDS).splitlines() if line.startswith("| `")
    ]
    assert rows and all(row in doc for row in rows), "docs/full-scale.md is out of date: regenerate it"


@pytest.mark.slow
def test_docs_full_scale_is_generated_from_every_card():
    table = full_scale_table(override_args)
    assert "no estimate" not in table
    assert open("docs/full-scale.md").read() == table, (
        "docs/full-scale.md is out of date: litlab repro --full-scale-table > docs/full-scale.md"
    )


def test_a_card_without_full_runs_plans_its_full_config():
    class Bare:
        slug = "lordo"

        def runs_for(self, scale: str) -> dict:
            return {}

    assert card_rows(Bare(), override_args) == [("(full config)", "-", "configs/lordo/full.yaml", [])]


@pytest.mark.parametrize("slug", ["lokra", "csplora"])
def test_the_formulas_hold_on_the_cards_own_stand_in_model(slug: str, tmp_path):
    """The full plan's numbers are the formulas at the paper's sizes; on the card's stand-in (the same class at
    small sizes, its adapters as the full config sets them) they equal FlopCounterMode and, within a tenth, the
    bytes autograd saves."""
    from litlab.lit_modules.peft.lokra import AdapterPlan, inject_lokra
    from litlab.lit_modules.peft.standin import stand_in_csplora, stand_in_lokra

    args = (stand_in_lokra if slug == "lokra" else stand_in_csplora)(tmp_path)
    cfg = load_config(f"configs/{slug}/full.yaml", args)
    m = cfg["model"]["init_args"]
    adapter = {k: v for k, v in m["adapter"].items() if k != "rank_plan"}
    flops = {}
    for attn in ("eager", "sdpa"):
        model = transformers.AutoModelForCausalLM.from_pretrained(m["backbone"], attn_implementation=attn)
        model.requires_grad_(False).train()  # as Lightning trains it: the adapters' dropout active
        inject_lokra(model, m["mode"], AdapterPlan(**{**adapter, "targets": tuple(adapter["targets"])}))
        b, s = 2, 64
        ids = torch.randint(0, model.config.vocab_size, (b, s))
        step = train_step(model, ids, False)
        stack, w = Stack.of(model.config), MatmulWeights.of(model)
        if attn == "eager":
            flops = (lm_flops(w, stack, b, s, train=True), counted_flops(step, backward=True))
        else:
            measured = saved_tensor_bytes(step, list(model.parameters()))
            formula = lm_activation_bytes(
                stack, w, b, s, "fp32", trained=False, fp32_residual=True, dropout_mask_bytes=4
            )
    assert flops[0] == pytest.approx(flops[1], rel=1e-3)
    assert formula == pytest.approx(measured, rel=0.10)


@pytest.mark.parametrize("trained", [True, False], ids=["full", "lora"])
def test_a_training_steps_peak_is_the_plans_memory_within_a_tenth(trained: bool):
    """The plan's memory per GPU (weights + gradients + AdamW's two states + activations) against the peak of live
    storages over three AdamW steps of a stand-in-sized Llama (the first step allocates the optimiser's state)."""
    from litlab.full_plan_formulas import LiveStoragePeak

    model, config = tiny_llama(4, "sdpa")
    if not trained:
        model.requires_grad_(False)
        inject_adapters(model, TARGETS, rank=4, alpha=8.0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, foreach=False)
    b, s = 2, 128
    ids = torch.randint(0, 97, (b, s))
    step = train_step(model, ids, False)
    with LiveStoragePeak(list(model.parameters())) as tracker:
        for _ in range(3):
            step().backward()
            optimizer.step()
            optimizer.zero_grad()
    n_all, n_trained = sum(p.numel() for p in model.parameters()), sum(p.numel() for p in trainable)
    activations = lm_activation_bytes(
        Stack.of(config), MatmulWeights.of(model), b, s, "fp32", trained=trained, fp32_residual=True
    )
    planned = 4 * n_all + 4 * n_trained + 8 * n_trained + activations
    assert planned == pytest.approx(tracker.peak, rel=0.10), (planned, tracker.peak)
