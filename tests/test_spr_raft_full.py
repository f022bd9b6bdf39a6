"""SPR-RAFT's full-scale loop (configs/spr_raft/full.yaml: a frozen Qwen3-4B, [REG] added to its tokenizer, the grid
RAFT through the KV cache, MoleculeNet CSV files) end to end without downloads, on its stand-in: a tiny
Qwen3ForCausalLM, a byte-level Qwen2Tokenizer built locally and 16 rows in ESOL's file layout
(``spr_raft_full.stand_in_spr_raft``). Qwen3-4B itself is never loaded; offline, the real config names it."""

from __future__ import annotations

import csv
import types
from pathlib import Path

import pytest
import torch
import transformers

from litlab.lit_modules.peft.spr_raft import SPRRAFT, parameter_count
from litlab.lit_modules.peft.spr_raft_full import grid_scores, sequence_scores, stand_in_spr_raft

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> tuple[Path, list[str]]:
    workdir = tmp_path_factory.mktemp("spr_raft_stand_in")
    return workdir, stand_in_spr_raft(workdir)


def _arg(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value


def _datamodule(args: list[str], **kw):
    from litlab.datamodules.regression_csv import CSVTextRegressionDataModule

    dm = CSVTextRegressionDataModule(
        data_dir=_arg(args, "data.init_args.data_dir"),
        tokenizer=_arg(args, "data.init_args.tokenizer"),
        batch_size=4,
        grid_size=8,
        max_prompt_tokens=160,
        **kw,
    )
    dm.setup("fit")
    return dm


def test_stand_in_rows_are_in_the_layout_the_datamodule_reads(stand_in):
    """The stand-in's ESOL file has the columns REGRESSION_CSVS names; records: left padding (mask 0), [REG] at one
    index, a signed fixed-width answer (2 decimals) then <eos>; the grid holds rounded training quantiles."""
    from litlab.datamodules.regression_csv import REGRESSION_CSVS, serialize_signed

    workdir, args = stand_in
    spec = REGRESSION_CSVS["esol"]
    with open(Path(_arg(args, "data.init_args.data_dir")) / spec.file) as f:
        header = next(csv.reader(f))
    assert {spec.text_column, spec.target_column} <= set(header) and len(header) == 10
    dm = _datamodule(args)
    assert {k: len(v[1]) for k, v in dm.splits.items()} == {"train": 12, "val": 2, "test": 2}
    largest = max(abs(float(v)) for _, y in dm.splits.values() for v in y)
    assert (
        dm.digits == len(str(int(round(largest, 2)))) and dm.width == dm.digits + 4
    )  # sign, digits, point, 2
    ids, mask, y, z = dm.tensors["train"].tensors
    assert ids.shape == (12, dm.reg_index + dm.width + 2) and mask.shape == ids.shape
    assert (ids[:, dm.reg_index] == dm.token_ids["reg"]).all() and (ids[:, -1] == dm.token_ids["eos"]).all()
    assert dm.token_ids["reg"] == len(dm.tok) - 1  # [REG] added to the tokenizer: past the model's rows
    pads = (mask == 0).sum(1)
    assert pads.min() == 0 and pads.max() > 0 and all(mask[i, pads[i] :].all() for i in range(12))
    text = dm.tok.decode(ids[0, dm.reg_index + 1 : -1])
    assert text == serialize_signed(float(y[0]), 2, dm.digits) and text[0] in "+-" and text[-3] == "."
    assert torch.allclose(z, (y - dm.target_mean) / dm.target_std)
    assert torch.equal(dm.raft_grid, torch.sort(dm.raft_grid).values) and len(dm.raft_grid) <= 8
    assert torch.allclose(dm.raft_grid * 100, (dm.raft_grid * 100).round(), atol=1e-3)
    assert torch.equal(dm.encode_answers([float(y[0])])[0], ids[0, dm.reg_index + 1 :])


def test_missing_data_names_the_folder_the_file_and_where_to_get_it(tmp_path):
    from litlab.datamodules.regression_csv import CSVTextRegressionDataModule
    from litlab.lit_modules.core.errors import DatasetUnavailableError

    with pytest.raises(DatasetUnavailableError) as err:
        CSVTextRegressionDataModule(
            data_dir=str(tmp_path / "moleculenet"), tokenizer="Qwen/Qwen3-4B", task="freesolv"
        )
    text = str(err.value)
    assert str(tmp_path / "moleculenet") in text and "SAMPL.csv" in text and "'expt'" in text
    assert "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/SAMPL.csv" in text
    with pytest.raises(ValueError, match="unknown task 'tox21'"):
        CSVTextRegressionDataModule(data_dir=str(tmp_path), tokenizer="x/y", task="tox21")


def test_full_config_offline_names_the_model(stand_in, tmp_path, monkeypatch):
    """The real config with the stand-in's data but Qwen3-4B: offline, construction stops at once naming it."""
    from litlab.cli import LitlabCLI
    from litlab.lit_modules.core.errors import ModelUnavailableError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache, whatever this machine holds
    data = _arg(stand_in[1], "data.init_args.data_dir")
    args = ["fit", f"--config={ROOT / 'configs/spr_raft/full.yaml'}", f"--runs_dir={tmp_path}"]
    with pytest.raises(ModelUnavailableError) as err:
        LitlabCLI(args=[*args, "--trainer.accelerator=cpu", f"--data.init_args.data_dir={data}"])
    assert "Qwen/Qwen3-4B" in str(err.value) and "hf download" in str(err.value)


def test_trainable_count_at_qwen3_4b_width(tmp_path):
    """Spec §7.1: d = 2560 (Qwen3-4B's config, read without weights), m = 100, head 512 → 1 575 425 numbers."""
    transformers.Qwen3Config(hidden_size=2560, num_hidden_layers=1, vocab_size=8).save_pretrained(tmp_path)
    model = SPRRAFT(backbone=str(tmp_path), prompt_len=100, head_hidden=512, raft_mode="grid")
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == 1_575_425
    assert parameter_count(2560, 100, 512) == 1_575_425
    with pytest.raises(ValueError, match="raft_mode='grid'.*Hugging Face"):
        SPRRAFT(raft_mode="grid")


def test_grid_scores_through_the_kv_cache_equal_each_full_sequence(stand_in):
    """s(c) from one prefix pass and its cache, with left padding, equals Σ log p of every candidate scored on its
    own unpadded full sequence (1e-4)."""
    from litlab.lit_modules.peft.spr_raft_full import load_frozen_lm

    lm = load_frozen_lm(_arg(stand_in[1], "model.init_args.backbone"), "float32")
    E = lm.get_input_embeddings()
    g = torch.Generator().manual_seed(0)
    lengths, T = [5, 9], 9
    prefixes = [torch.randint(0, 250, (n,), generator=g) for n in lengths]
    ids = torch.stack([torch.cat([torch.zeros(T - len(p), dtype=torch.long), p]) for p in prefixes])
    mask = torch.stack([torch.cat([torch.zeros(T - len(p)), torch.ones(len(p))]) for p in prefixes]).long()
    candidates = torch.randint(0, 250, (2, 3, 4), generator=g)
    with torch.no_grad():
        h, s = grid_scores(lm, E(ids), mask, candidates)
        for i, p in enumerate(prefixes):
            for c in range(3):
                seq = torch.cat([p, candidates[i, c]])[None]
                logits = lm(input_ids=seq).logits[:, len(p) - 1 : -1]
                expected = sequence_scores(logits, candidates[i, c][None])
                torch.testing.assert_close(s[i, c], expected[0], atol=1e-4, rtol=0)
            alone = lm.model(input_ids=p[None]).last_hidden_state[0, -1]
            torch.testing.assert_close(h[i, -1], alone, atol=1e-4, rtol=1e-4)


def test_grid_mode_cross_entropy_equals_teacher_forced_tokens(stand_in):
    """Training's grid pass reads L_ce off candidate 0 (the true answer): equal to the token cross-entropy of the
    teacher-forced full sequence (the digits path's), padding included; the digit RAFT refuses signed answers."""
    dm = _datamodule(stand_in[1])
    batch = dict(zip(("ids", "mask", "y", "z"), dm.tensors["train"][:4]))
    losses = {}
    for mode in ("grid", "digits"):
        model = SPRRAFT(
            backbone=_arg(stand_in[1], "model.init_args.backbone"),
            prompt_len=3,
            head_hidden=8,
            raft_mode=mode,
            lambda_raft=0.0,
        )
        model.trainer = types.SimpleNamespace(datamodule=dm)
        model.setup("fit")
        losses[mode] = model.losses(batch)
    torch.testing.assert_close(losses["grid"]["ce"], losses["digits"]["ce"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(losses["grid"]["reg"], losses["digits"]["reg"], atol=1e-5, rtol=1e-5)
    signed = SPRRAFT(backbone=_arg(stand_in[1], "model.init_args.backbone"), prompt_len=3, raft_mode="digits")
    signed.trainer = types.SimpleNamespace(datamodule=dm)
    with pytest.raises(ValueError, match="raft_mode=grid"):
        signed.setup("fit")


def test_full_config_stand_in_fits_checkpoints_resumes_and_evaluates(stand_in, tmp_path, monkeypatch):
    """``litlab fit --config configs/spr_raft/full.yaml`` with the stand-in's overrides: 3 steps, a checkpoint of the
    trained part only (P, e_REG, head), the backbone bitwise frozen; a relaunch with --ckpt_path last runs the
    second epoch from it; validate on the checkpoint gives the same finite val/test metrics."""
    from litlab.cli import LitlabCLI

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = [f"--config={ROOT / 'configs/spr_raft/full.yaml'}", f"--runs_dir={tmp_path}", *stand_in[1]]
    base += ["--trainer.enable_progress_bar=false", "--run_id=stand-in"]  # one folder for both epochs counts
    first = LitlabCLI(args=["fit", *base, "--trainer.max_epochs=1"])
    assert first.trainer.global_step == 3 and first.model.hparams.raft_mode == "grid"
    groups = first.trainer.optimizers[
        0
    ].param_groups  # spec §3.3: 3e-3 for P and e_REG, 1e-3 for the head, cosine
    assert [g["initial_lr"] for g in groups] == [3e-3, 1e-3] and groups[1]["lr"] < 1e-3  # decayed
    metrics = first.trainer.callback_metrics
    assert float(metrics["check/backbone_max_change"]) == 0.0
    for key in ("train/loss_ce", "train/loss_raft", "train/loss_reg", "val/mae", "val/mae_grid", "test/mae"):
        assert torch.isfinite(metrics[key]), key
    ckpt = first.run_dir / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=False)["state_dict"]
    assert sorted({k.split(".")[0] for k in state}) == ["head", "reg_embedding", "soft_prompt"]
    resumed = LitlabCLI(args=["fit", *base, "--trainer.max_epochs=2", "--ckpt_path=last"])
    assert resumed.trainer.global_step == 6 and resumed.run_dir == first.run_dir
    assert not torch.equal(resumed.model.soft_prompt, state["soft_prompt"])
    after = resumed.trainer.callback_metrics
    validated = LitlabCLI(args=["validate", *base, f"--ckpt_path={ckpt.parent / 'last.ckpt'}"])
    out = validated.trainer.callback_metrics
    assert torch.isfinite(out["val/mae"]) and torch.isfinite(out["test/mae"])
    torch.testing.assert_close(out["val/mae"], after["val/mae"], atol=1e-5, rtol=0)


def test_the_smollm2_route_shares_the_hf_loop_without_padding(stand_in):
    """The SmolLM2 route (LMTextRegressionDataModule's fixed-width diabetes prompts, no mask, digit RAFT) runs through
    the same Hugging Face functions, here on the stand-in's tiny Qwen3: the grid scored through the KV cache equals
    every candidate's full teacher-forced sequence (1e-4 + 1e-6 relative), and the losses reach only P, e_REG and the head."""
    from test_spr_raft import grid_from_full_sequences

    from litlab.datamodules.text_regression import LMTextRegressionDataModule

    folder = _arg(stand_in[1], "model.init_args.backbone")
    dm = LMTextRegressionDataModule(tokenizer=folder, grid_size=5, batch_size=4)
    dm.setup("fit")
    model = SPRRAFT(backbone=folder, prompt_len=4, head_hidden=8)
    model.trainer = types.SimpleNamespace(datamodule=dm)
    model.setup("fit")
    ids = dm.tensors["test"].tensors[0][:3]
    got = model.predict_all(ids)
    # rtol: the grid's values reach ~200, and an AVX2 CPU's float32 sums differ there by 1.4e-4 (6.8e-7 relative)
    torch.testing.assert_close(got["grid"], grid_from_full_sequences(model, ids), atol=1e-4, rtol=1e-6)
    batch = dict(zip(("ids", "y", "z"), dm.tensors["train"][:4]))
    losses = model.losses(batch)
    assert sorted(losses) == ["ce", "raft", "reg"] and all(torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert all(p.grad is None for p in model.frozen_lm.parameters())
    assert all(p.grad is not None for p in (model.soft_prompt, model.reg_embedding, *model.head.parameters()))


@pytest.mark.parametrize("mode", ["grid", "digits"])
def test_a_bf16_backbone_trains_without_autocast(stand_in, mode):
    """full.yaml's bf16 backbone under fp32 precision (no autocast): the prompt enters in the LM's dtype, its head's
    logits are read in it, the trained head in fp32; losses finite, gradients reach P."""
    dm = _datamodule(stand_in[1])
    batch = dict(zip(("ids", "mask", "y", "z"), dm.tensors["train"][:4]))
    model = SPRRAFT(
        backbone=_arg(stand_in[1], "model.init_args.backbone"),
        backbone_dtype="bfloat16",
        prompt_len=3,
        raft_mode=mode,
        lambda_raft=1.0 if mode == "grid" else 0.0,
    )
    model.trainer = types.SimpleNamespace(datamodule=dm)
    model.setup("fit")
    assert model.frozen_lm.dtype == torch.bfloat16 and model.soft_prompt.dtype == torch.float32
    losses = model.losses(batch)
    assert all(torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert model.soft_prompt.grad is not None and model.soft_prompt.grad.abs().sum() > 0
    preds = model.predict_all(batch["ids"], batch["mask"])
    assert all(torch.isfinite(p).all() and p.dtype == torch.float32 for p in preds.values())
