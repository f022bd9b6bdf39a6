"""The analysis cards' full-scale configs (diffract, lock_in, task_complexity) end to end on their stand-ins
(``litlab.lit_modules.analysis.standin``): a tiny random model of the class each full config loads and a few records
of each Hugging Face data set in the Hub's layout, read through ``datasets`` by the full configs' own DataModules
(``datamodules.hub_corpus``, ``datamodules.hub_tasks``). Each fit constructs, trains, checkpoints, resumes with
``--ckpt_path last`` and evaluates; offline, a data set that is not on disk stops the DataModule naming it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(ROOT)


def run(command: str, slug: str, stand_in: list[str], tmp_path: Path, *extra: str):
    from litlab.cli import LitlabCLI

    args = [command, "--config", f"configs/{slug}/full.yaml", *stand_in, f"--runs_dir={tmp_path / 'runs'}"]
    run_id = ["--run_id=stand_in"] if command == "fit" else []  # a relaunch with more steps: the same folder
    return LitlabCLI(args=[*args, *run_id, *extra])


def every_2_steps(tmp_path: Path, slug: str) -> list[str]:
    """A ModelCheckpoint in the run folder that keeps a checkpoint every second step (and last.ckpt)."""
    return [
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        f"--trainer.callbacks.dirpath={tmp_path / 'runs' / slug / 'stand_in' / 'checkpoints'}",
        "--trainer.callbacks.every_n_train_steps=2",
        "--trainer.callbacks.save_top_k=-1",
        "--trainer.callbacks.save_last=true",
    ]


def finite(metrics: dict, prefix: str) -> dict[str, float]:
    picked = {k: float(v) for k, v in metrics.items() if k.startswith(prefix)}
    assert picked, f"no metric {prefix}*"
    return picked


# ---- the DataModules' pieces -------------------------------------------------------------------------------------
def test_question_answer_windows_label_the_answer_only():
    from litlab.datamodules.hub_corpus import qa_window
    from litlab.lit_modules.core.tiny_hf import byte_level_tokenizer

    tok = byte_level_tokenizer(eos="<|endoftext|>", pad="<|pad|>")
    w = qa_window(tok, "Question: 2+3?\nAnswer:", " 5", block_size=32)
    q = len("Question: 2+3?\nAnswer:")  # one byte one token
    assert w is not None and w["input_ids"].shape == w["labels"].shape == (32,)
    labelled = (w["labels"] != -100).nonzero().flatten().tolist()
    assert labelled == [q - 1, q, q + 1]  # predicts " ", "5" and EOS
    assert tok.decode(w["labels"][labelled[:2]]) == " 5" and int(w["labels"][q + 1]) == tok.eos_token_id
    assert tok.decode(w["input_ids"][: q + 2]) == "Question: 2+3?\nAnswer: 5"
    assert bool((w["input_ids"][q + 3 :] == tok.pad_token_id).all())  # right padding after the EOS
    assert qa_window(tok, "Q" * 40, " 5", block_size=32) is None  # no answer token fits: left out


def test_gsm8k_score_reads_the_final_number():
    from litlab.datamodules.hub_tasks import final_number, gsm8k_score

    assert final_number("He has 3 + 4 = <<3+4=7>>7 apples.\n#### 1,234") == 1234.0
    assert final_number("so 12 pages. The answer is: $ 18.5") == 18.5
    assert final_number("first 3 then 41") == 41.0 and final_number("none") is None
    assert gsm8k_score("The answer is: 7", " ... #### 7\n") == 1.0
    assert gsm8k_score("it is 8", " ... #### 7\n") == 0.0 and gsm8k_score("", "#### 7") == 0.0


def test_a_resumed_stream_continues_where_it_stopped(tmp_path, offline):
    from litlab.datamodules.hub_corpus import HubCorpusDataModule, SourceWindows, open_records
    from litlab.lit_modules.analysis.standin import stand_in_diffract

    args = stand_in_diffract(tmp_path)
    kw = {
        a.split("=", 1)[0].removeprefix("--data.init_args."): a.split("=", 1)[1] for a in args if "data." in a
    }
    dm = HubCorpusDataModule(
        domain="code",
        domain_source={"dataset": "bigcode/starcoderdata", "data_dir": "python", "field": "content"},
        general_source={"dataset": "HuggingFaceFW/fineweb-edu", "name": "sample-10BT"},
        tokenizer=kw["tokenizer"],
        data_root=kw["data_root"],
        block_size=16,
        batch_size=2,
        val_windows=3,
        eval_records=2,
        shuffle_buffer=4,
    )
    whole = list(SourceWindows(dm))
    assert len(whole) > 10 and all(w["input_ids"].shape == (16,) for w in whole)
    assert torch.equal(whole[0]["labels"][:-1], whole[0]["input_ids"][1:])  # next-token labels
    resumed = list(SourceWindows(dm, skip_windows=6))
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(resumed, whole[6:], strict=True))
    ev = dm.eval_set("domain")
    assert ev["input_ids"].shape == (3, 16) and dm.eval_set("domain") is ev  # read once
    held_out = next(iter(open_records(dm.domain_source, dm.paths["domain"], "train")))["content"][:64]
    trained = dm.tokenizer.decode(torch.cat([w["input_ids"] for w in whole]))
    assert (
        dm.tokenizer.decode(ev["input_ids"][0]) in held_out and held_out not in trained
    )  # held out from training


def test_every_diffract_domain_reads_its_corpus_from_the_stand_in(tmp_path, offline):
    from litlab.datamodules.hub_corpus import DOMAIN_SOURCES, HubCorpusDataModule, SourceWindows
    from litlab.lit_modules.analysis.standin import stand_in_diffract

    args = dict(
        a.removeprefix("--data.init_args.").split("=", 1) for a in stand_in_diffract(tmp_path) if "data." in a
    )
    for domain in ("math", "code", "instruction"):
        dm = HubCorpusDataModule(
            domain=domain,
            tokenizer=args["tokenizer"],
            data_root=args["data_root"],
            block_size=16,
            batch_size=2,
            val_windows=2,
            eval_records=2,
        )
        assert dm.domain_source == DOMAIN_SOURCES[domain] and dm.paths["domain"].endswith(
            DOMAIN_SOURCES[domain].dataset
        )
        first = dm.tokenizer.decode(next(iter(SourceWindows(dm)))["input_ids"])
        held_out = dm.tokenizer.decode(dm.eval_set("domain")["input_ids"][0])
        assert first and held_out and dm.eval_set("general")["input_ids"].shape == (2, 16)
    assert "<|user|>" in held_out  # tulu-3's messages in the Tulu template


def test_a_data_set_missing_offline_names_it_and_the_download(tmp_path, offline):
    from litlab.datamodules.hub_corpus import HubCorpusDataModule
    from litlab.datamodules.hub_tasks import HubTaskDataModule
    from litlab.lit_modules.core.errors import DatasetUnavailableError

    with pytest.raises(
        DatasetUnavailableError, match=r"'HuggingFaceFW/fineweb-edu'.*offline mode is on"
    ) as err:
        HubCorpusDataModule(domain_source={"dataset": str(tmp_path)}, data_root=str(tmp_path / "empty"))
    assert "hf download HuggingFaceFW/fineweb-edu --repo-type dataset" in str(err.value)
    with pytest.raises(DatasetUnavailableError, match=r"'meta-math/MetaMathQA'.*--local-dir <data_root>"):
        HubTaskDataModule()


# ---- the full configs on their stand-ins ---------------------------------------------------------------------------
def test_diffract_full_config_on_its_stand_in(tmp_path, offline):
    from litlab.lit_modules.analysis.standin import stand_in_diffract

    stand_in = stand_in_diffract(tmp_path / "si")
    cli = run("fit", "diffract", stand_in, tmp_path)
    assert type(cli.model.model).__name__ == "Olmo2ForCausalLM" and cli.trainer.global_step == 3
    scalars = finite(cli.trainer.callback_metrics, "diffract/")
    assert all(
        math.isfinite(scalars[f"diffract/{k}"]) for k in ("G_vec", "G_val", "auc_rotation", "auc_random")
    )
    saved = json.loads((cli.run_dir / "diffract.json").read_text())
    assert saved["domain"] == "code" and len(saved["head_ratios"]["q"]) == 2  # [layer x head] of the 2 layers
    last = cli.run_dir / "checkpoints" / "last.ckpt"
    assert last.exists()
    resumed = run("fit", "diffract", stand_in, tmp_path, "--ckpt_path=last")  # the fit was complete: restored
    assert resumed.run_dir == cli.run_dir and resumed.trainer.global_step == 3
    state, restored = cli.model.model.state_dict(), resumed.model.model.state_dict()
    assert all(torch.equal(state[k], restored[k]) for k in state)
    val = run("validate", "diffract", stand_in, tmp_path, f"--ckpt_path={last}")
    losses = finite(val.trainer.callback_metrics, "val/loss_")
    assert set(losses) == {"val/loss_domain", "val/loss_general"} and all(map(math.isfinite, losses.values()))


def test_lock_in_full_config_on_its_stand_in(tmp_path, offline):
    from litlab.lit_modules.analysis.standin import stand_in_lock_in

    stand_in = stand_in_lock_in(tmp_path / "si")
    cli = run("fit", "lock_in", stand_in, tmp_path)
    model, dm = cli.model, cli.datamodule
    assert type(model.model).__name__ == "Qwen2ForCausalLM" and cli.trainer.global_step == 3
    # the basis covers the last block's MLP only; the drift counts every parameter
    assert set(model.flat.names) == {f"model.layers.1.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert model.basis.vectors.shape == (model.flat.size, 4) and model.flat.size < model.flat_all.size
    task = dm.eval_set("domain")
    assert bool((task["labels"] == -100).any()) and bool((task["labels"] != -100).any())  # answer-only labels
    traj = json.loads((cli.run_dir / "trajectory.json").read_text())["trajectory"]
    assert [p["t"] for p in traj] == [0, 1, 2, 3] and traj[0]["drift"] == 0.0 < traj[-1]["drift"]
    assert all(math.isfinite(p[k]) for p in traj for k in ("L_T", "L_B", "h", "f", "c"))
    delta = (model._theta() - model.theta0).double()
    assert traj[-1]["drift"] > float(delta.norm()) > 0  # every parameter moved, not only the subset
    last = cli.run_dir / "checkpoints" / "last.ckpt"
    resumed = run("fit", "lock_in", stand_in, tmp_path, "--ckpt_path=last")
    assert resumed.run_dir == cli.run_dir and resumed.trainer.global_step == 3
    assert resumed.model.trajectory == model.trajectory  # it travels in the checkpoint
    # the basis of the resumed fit is the one at θ0, not at the restored weights
    torch.testing.assert_close(resumed.model.basis.values, model.basis.values, rtol=1e-5, atol=1e-9)
    val = run("validate", "lock_in", stand_in, tmp_path, f"--ckpt_path={last}")
    losses = finite(val.trainer.callback_metrics, "val/loss_")
    assert set(losses) == {"val/loss_task", "val/loss_broad"} and all(map(math.isfinite, losses.values()))


def test_task_complexity_full_config_on_its_stand_in(tmp_path, offline):
    from litlab.lit_modules.analysis.standin import stand_in_task_complexity

    stand_in = stand_in_task_complexity(tmp_path / "si")
    cli = run("fit", "task_complexity", stand_in, tmp_path)
    model, dm = cli.model, cli.datamodule
    assert type(model.model).__name__ == "SmolLM3ForCausalLM"
    assert dm.task == "gsm8k" and len(dm.examples()) == 8 and len(dm.eval_pairs()) == 4
    question, answer = dm.examples()[0]
    assert question.startswith("Question: ") and "\n" not in answer[:-1] and "The answer is:" in answer
    # one group of points per step: baseline, ICL k = 1, 2, online n = 4, LoRA with its quantisations
    assert cli.trainer.global_step == model.groups_done == 5
    assert [(r["strategy"], r["knob"]) for r in model.rows] == [
        ("baseline", ""),
        ("icl", "k=1"),
        ("icl", "k=2"),
        ("online", "n=4"),
        ("lora", "r=1"),
        ("lora_q", "r=1,b=16"),
        ("lora_q", "r=1,b=2"),
    ]
    assert all(r["bits_payload"] > 0 for r in model.rows if r["strategy"] != "baseline")
    assert all(0.0 <= r["perf"] <= 1.0 for r in model.rows)
    assert json.loads((cli.run_dir / "task_complexity.json").read_text())["rows"] == model.rows
    last = cli.run_dir / "checkpoints" / "last.ckpt"
    val = run("validate", "task_complexity", stand_in, tmp_path, f"--ckpt_path={last}")
    assert 0.0 <= float(val.trainer.callback_metrics["val/perf"]) <= 1.0


@pytest.mark.slow
def test_task_complexity_full_config_resumes_with_the_next_group(tmp_path, offline):
    """Resumed from its step-2 checkpoint (two groups measured), the fit measures the other three and ends with
    the uninterrupted fit's frontier; a relaunch of the finished fit measures nothing more (25 s here)."""
    from litlab.lit_modules.analysis.standin import stand_in_task_complexity

    stand_in = stand_in_task_complexity(tmp_path / "si")
    cli = run("fit", "task_complexity", stand_in, tmp_path, *every_2_steps(tmp_path, "task_complexity"))
    model = cli.model
    step_2 = cli.run_dir / "checkpoints" / "epoch=0-step=2.ckpt"
    resumed = run("fit", "task_complexity", stand_in, tmp_path, "--run_id=resumed", f"--ckpt_path={step_2}")
    assert resumed.trainer.global_step == 5 and resumed.model.rows == model.rows
    again = run("fit", "task_complexity", stand_in, tmp_path, "--ckpt_path=last")  # finished: nothing more
    assert again.run_dir == cli.run_dir and again.trainer.global_step == 5 and again.model.rows == model.rows


@pytest.mark.slow
def test_diffract_full_config_resumes_mid_stream_exactly(tmp_path, offline):
    """A fit resumed from its step-2 checkpoint skips the 4 streamed windows it trained on (the loader is positioned
    when iteration starts, after Lightning restored the loop) and ends with the uninterrupted fit's weights, bit for
    bit (16 s here: two 5-step fits with their analyses)."""
    from litlab.lit_modules.analysis.standin import stand_in_diffract

    stand_in = [*stand_in_diffract(tmp_path / "si"), "--trainer.max_steps=5"]
    whole = run("fit", "diffract", stand_in, tmp_path, *every_2_steps(tmp_path, "diffract"))
    step_2 = whole.run_dir / "checkpoints" / "epoch=0-step=2.ckpt"
    resumed = run("fit", "diffract", stand_in, tmp_path, "--run_id=resumed", f"--ckpt_path={step_2}")
    assert resumed.run_dir != whole.run_dir and resumed.trainer.global_step == 5
    a, b = whole.model.model.state_dict(), resumed.model.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
