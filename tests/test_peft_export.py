"""``litlab export --peft``: the adapters of a finished run (its folder or one of its checkpoints) in Hugging Face
PEFT's LoRA layout. ``peft.PeftModel.from_pretrained`` on the untouched tiny base gives the logits of the run's
module rebuilt from its checkpoint; a run whose base weights moved is refused, naming why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from litlab.__main__ import main
from litlab.lit_modules.analysis.checkpoints import module_from_checkpoint
from litlab.lit_modules.core.peft_format import PEFT_CONFIG_FILE, PEFT_WEIGHTS_FILE

peft = pytest.importorskip("peft", reason="peft is a test dependency: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parent.parent


def save_tiny_llama(folder: Path) -> Path:
    """A Hugging Face base on disk over the character vocabulary of ``LocalTextDataModule`` (97 tokens)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, Path]:
    """(base folder, run folder) of a short LoRA fit of LoKRA's language-model module on that base."""
    tmp = tmp_path_factory.mktemp("peft_export")
    base = save_tiny_llama(tmp / "base")
    argv = ["fit", "--config", str(ROOT / "configs" / "lokra" / "quick.yaml")]
    argv += [f"--model.init_args.backbone={base}", "--model.init_args.mode=lora", "--model.init_args.lr=0.05"]
    argv += ["--model.init_args.warmup_steps=1", "--trainer.max_steps=4", "--trainer.limit_val_batches=1"]
    argv += ["--trainer.enable_progress_bar=false", f"--runs_dir={tmp / 'runs'}", "--run_id=lora"]
    assert main(argv) == 0
    return base, tmp / "runs" / "lokra" / "lora"


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(ids).logits


def test_export_of_a_run_folder_loads_in_peft_with_the_runs_logits(finished_run):
    base, run = finished_run
    written_at_fit_end = load_file(str(run / "adapter_peft" / PEFT_WEIGHTS_FILE))  # SaveAdapters' copy
    shutil.rmtree(run / "adapter_peft")

    assert main(["export", "--peft", str(run)]) == 0
    folder = run / "adapter_peft"
    config = json.loads((folder / PEFT_CONFIG_FILE).read_text())
    assert config["base_model_name_or_path"] == str(base) and config["task_type"] == "CAUSAL_LM"
    assert len(config["target_modules"]) == 12  # q, k, v, o, up, down of both layers, as the config targets
    exported = load_file(str(folder / PEFT_WEIGHTS_FILE))
    assert exported.keys() == written_at_fit_end.keys()
    assert all(torch.equal(exported[k], written_at_fit_end[k]) for k in exported)

    ours = module_from_checkpoint(run / "checkpoints" / "last.ckpt").model
    theirs = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), folder)
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))
    untouched = logits(transformers.AutoModelForCausalLM.from_pretrained(base), ids)
    assert not torch.allclose(logits(ours, ids), untouched, atol=1e-4)  # the adapters do change the output
    torch.testing.assert_close(logits(theirs, ids), logits(ours, ids), atol=1e-6, rtol=0)


def test_export_of_another_checkpoint_goes_beside_it_or_to_out(finished_run, tmp_path):
    base, run = finished_run
    step = run / "checkpoints" / "step4.ckpt"
    shutil.copy(run / "checkpoints" / "last.ckpt", step)
    try:
        assert main(["export", "--peft", str(step)]) == 0
        assert (run / "adapter_peft_step4" / PEFT_WEIGHTS_FILE).is_file()
        assert main(["export", "--peft", str(step), "--out", str(tmp_path / "adapter")]) == 0
        theirs = peft.PeftModel.from_pretrained(
            transformers.AutoModelForCausalLM.from_pretrained(base), tmp_path / "adapter"
        )
        ours = module_from_checkpoint(step).model
        ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(logits(theirs, ids), logits(ours, ids), atol=1e-6, rtol=0)
    finally:
        step.unlink()
        shutil.rmtree(run / "adapter_peft_step4", ignore_errors=True)


def test_a_run_whose_base_moved_is_refused(finished_run, tmp_path, capsys):
    _, run = finished_run
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    key = next(k for k in ckpt["state_dict"] if k.endswith("layers.0.self_attn.q_proj.base.weight"))
    ckpt["state_dict"][key] = ckpt["state_dict"][key] + 0.01  # as merging a branch into W0 would
    moved = run / "checkpoints" / "moved.ckpt"
    torch.save(ckpt, moved)
    try:
        assert main(["export", "--peft", str(moved), "--out", str(tmp_path / "a")]) == 2
    finally:
        moved.unlink()
    err = capsys.readouterr().err
    assert "base weights differ" in err and "q_proj.base.weight" in err
    assert not (tmp_path / "a").exists()


def test_what_is_not_a_run_is_named(tmp_path, capsys):
    assert main(["export", "--peft", str(tmp_path)]) == 2
    assert "holds no checkpoints/last.ckpt" in capsys.readouterr().err
    assert main(["export", "--peft", str(tmp_path / "x.pt")]) == 2
    assert "neither a run folder nor a .ckpt file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["export", "--peft", str(tmp_path), "--budget", "0.5"])
    with pytest.raises(SystemExit):
        main(["export", "--peft", str(tmp_path), "--ckpt", "x.ckpt"])
