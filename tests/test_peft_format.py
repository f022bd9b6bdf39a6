"""Adapters in Hugging Face PEFT's LoRA layout: what litlab trains loads with ``peft.PeftModel.from_pretrained``
onto the untouched base (logits equal to ours), a rank plan travels as ``rank_pattern`` / ``alpha_pattern``, and
``AdapterLinear``'s forward and merge equal PEFT's LoRA layer on the same factors."""

from __future__ import annotations

import copy
import json

import lightning as L
import pytest
import torch
import transformers

from litlab.callbacks.save_adapters import SaveAdapters
from litlab.lit_modules.core.adapters import AdapterLinear, inject_adapters
from litlab.lit_modules.core.peft_format import PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE, save_peft_adapter

peft = pytest.importorskip("peft", reason="peft is a test dependency: pip install -e '.[dev]'")


def tiny_llama(seed: int = 0) -> transformers.LlamaForCausalLM:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config).eval()


def trained_like(model: torch.nn.Module) -> None:
    """B starts at zero (so the adapter would be the identity): give every factor values, as training would."""
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.copy_(torch.randn_like(p) * 0.2)


@pytest.mark.parametrize("plan", [False, True], ids=["one_rank", "rank_plan"])
def test_peft_loads_our_export_with_our_logits(tmp_path, plan):
    base = tiny_llama()
    ours = copy.deepcopy(base)
    rank = {"q_proj": 4, "v_proj": 2, "model.layers.1.self_attn.q_proj": 6} if plan else 4
    alpha = {"default": 8.0, "model.layers.0.self_attn.v_proj": 3.0} if plan else 8.0
    inject_adapters(ours, ["q_proj", "v_proj"], rank=rank, alpha=alpha)
    trained_like(ours)
    save_peft_adapter(ours, tmp_path / "adapter", base_model_name_or_path="tiny-llama")

    config = json.loads((tmp_path / "adapter" / PEFT_CONFIG_FILE).read_text())
    assert (tmp_path / "adapter" / PEFT_WEIGHTS_FILE).exists()
    assert config["peft_type"] == "LORA" and len(config["target_modules"]) == 4
    if plan:
        assert config["r"] == 2 and config["rank_pattern"] == {  # r: the most common rank
            "model.layers.0.self_attn.q_proj": 4,
            "model.layers.1.self_attn.q_proj": 6,
        }
        assert config["alpha_pattern"] == {"model.layers.0.self_attn.v_proj": 3.0}
    else:
        assert config["rank_pattern"] == {} and config["alpha_pattern"] == {}

    loaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = ours(ids).logits, loaded(ids).logits
    assert not torch.allclose(want, tiny_llama()(ids).logits, atol=1e-3)  # the adapters do change the output
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    for name, module in loaded.named_modules():  # PEFT built each layer with the rank the plan gave it
        if name.endswith("layers.1.self_attn.q_proj") and hasattr(module, "lora_A"):
            assert module.lora_A["default"].weight.shape[0] == (6 if plan else 4)


def test_export_refuses_what_peft_cannot_hold(tmp_path):
    model = tiny_llama()
    inject_adapters(model, ["q_proj"], rank=2, alpha=4.0)
    layer = model.model.layers[0].self_attn.q_proj
    layer.merge()
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj.*unmerge"):
        save_peft_adapter(model, tmp_path / "a")
    layer.unmerge()
    layer.add_branch("second", rank=2)
    with pytest.raises(ValueError, match=r"branches \['default', 'second'\]"):
        save_peft_adapter(model, tmp_path / "a")
    kr = tiny_llama()
    inject_adapters(kr, ["v_proj"], rank=4, alpha=4.0, kind="khatri_rao", r2=4)
    with pytest.raises(ValueError, match="khatri_rao branch has no PEFT LoRA form"):
        save_peft_adapter(kr, tmp_path / "a")
    with pytest.raises(ValueError, match="holds no AdapterLinear"):
        save_peft_adapter(tiny_llama(), tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_a_second_export_replaces_the_first(tmp_path):
    model = tiny_llama()
    inject_adapters(model, ["q_proj"], rank=2, alpha=4.0)
    save_peft_adapter(model, tmp_path / "a")
    trained_like(model)
    save_peft_adapter(model, tmp_path / "a")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "a" / PEFT_WEIGHTS_FILE))
    b = model.model.layers[0].self_attn.q_proj.branches["default"].B
    assert torch.equal(saved["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"], b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temporary folder left


def test_adapter_linear_forward_and_merge_equal_peft_lora_on_the_same_factors():
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 16)
    ours = AdapterLinear(copy.deepcopy(linear))
    branch = ours.add_branch("default", rank=4, alpha=12.0)
    holder = torch.nn.Sequential()
    holder.add_module("lin", copy.deepcopy(linear))
    wrapped = peft.get_peft_model(holder, peft.LoraConfig(target_modules=["lin"], r=4, lora_alpha=12.0))
    theirs = wrapped.base_model.model.lin
    assert isinstance(theirs, peft.tuners.lora.Linear)
    with torch.no_grad():
        branch.A.copy_(0.1 * torch.randn(4, 24))  # a trained LoRA update is small next to W₀
        branch.B.copy_(0.1 * torch.randn(16, 4))
        theirs.lora_A["default"].weight.copy_(branch.A)
        theirs.lora_B["default"].weight.copy_(branch.B)
    x = torch.randn(5, 24)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=0)
        ours.merge()
        theirs.merge()
        # ours adds ΔW in float64 and rounds once; PEFT adds in float32: equal to float32 rounding
        torch.testing.assert_close(ours.base.weight, theirs.base_layer.weight, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(ours(x), theirs(x), atol=1e-5, rtol=1e-6)
        ours.unmerge()
        theirs.unmerge()
        torch.testing.assert_close(ours.base.weight, linear.weight, atol=1e-6, rtol=0)
        torch.testing.assert_close(theirs.base_layer.weight, linear.weight, atol=1e-6, rtol=0)


class TinyLlamaLM(L.LightningModule):
    """A LightningModule around a Hugging Face model with adapters, as the platform's HF-backed methods are."""

    def __init__(self):
        super().__init__()
        self.lm = tiny_llama()
        inject_adapters(self.lm, ["q_proj", "v_proj"], rank=2, alpha=4.0)

    def training_step(self, batch, batch_idx):
        return self.lm(batch, labels=batch).loss

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=0.5)


def test_save_adapters_writes_a_peft_copy_for_a_hugging_face_base(tmp_path):
    module = TinyLlamaLM()
    data = torch.utils.data.DataLoader(torch.randint(0, 64, (8, 12)), batch_size=4)
    trainer = L.Trainer(
        max_steps=3,
        default_root_dir=tmp_path,
        callbacks=[SaveAdapters()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, data)
    assert (tmp_path / "adapters.safetensors").exists()
    loaded = peft.PeftModel.from_pretrained(tiny_llama(), tmp_path / "adapter_peft").eval()
    ids = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, module.lm.eval()(ids).logits, atol=1e-6, rtol=0)
        assert not torch.allclose(loaded(ids).logits, tiny_llama()(ids).logits, atol=1e-4)  # it trained


def test_save_adapters_peft_always_names_why_it_cannot(tmp_path):
    class NotHF(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 4))
            inject_adapters(self.net, ["0"], rank=2, alpha=2.0)

    module = NotHF()
    trainer = L.Trainer(max_steps=0, default_root_dir=tmp_path, logger=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="no Hugging Face model inside NotHF"):
        SaveAdapters(peft="always").on_fit_end(trainer, module)
    SaveAdapters().on_fit_end(trainer, module)  # auto: the litlab file only
    assert (tmp_path / "adapters.safetensors").exists() and not (tmp_path / "adapter_peft").exists()
    with pytest.raises(ValueError, match="'auto', 'always' or 'never'"):
        SaveAdapters(peft="yes")
