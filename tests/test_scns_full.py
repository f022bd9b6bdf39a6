"""SCNS's full-scale (latent) loop end to end without downloads: a tiny diffusers-layout text-to-image checkpoint
(UNet2DConditionModel with cross-attention, CLIPTextModel, a CLIPTokenizer from a vocabulary and merges written
here, AutoencoderKL, DDPMScheduler, model_index.json) and a tiny concept folder in the CIFC layout (the card's
stand-in writers, ``litlab.lit_modules.diffusion.standin``), fitted through
``litlab fit --config configs/scns/full.yaml`` with small overrides. Stable Diffusion 1.5 itself is never loaded
here; the offline failure of the real config is ``test_scns.test_full_config_fails_offline_naming_the_model``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from litlab.lit_modules.diffusion.standin import write_concepts, write_tiny_sd

ROOT = Path(__file__).resolve().parents[1]


def test_concept_folder_datamodule(tmp_path, monkeypatch):
    from litlab.datamodules.continual_concepts import ContinualConceptDataModule
    from litlab.lit_modules.diffusion.contract import ConceptStreamData, check_data

    root = write_concepts(
        tmp_path / "cifc",
        {"dog": ["a dog on the grass", "a photo of a Dog", "grass"], "duck_toy": [None, None, None]},
    )
    kw = dict(data_root=str(root), concept_names=["dog", "duck_toy"], num_concepts=2, image_size=32)
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    dm = ContinualConceptDataModule(**kw, eval_timesteps=[100, 500])
    check_data(dm, ConceptStreamData, "test")
    dm.setup()
    assert dm.class_words == ["dog", "duck toy"]
    assert dm.concept_prompt(1) == "a <V1> duck toy" and dm.class_prompt(0) == "a dog"
    assert dm.caption_sources == ["captions", "prompt"]
    for t in range(2):
        x = dm.task_images(t)
        assert x.shape == (2, 3, 32, 32) and float(x.min()) >= -1.0 and float(x.max()) <= 1.0
        assert len(dm.task_prompts(t)) == 2
    assert set(dm.task_prompts(0)) <= {
        "a <V0> dog on the grass",
        "a photo of a <V0> Dog",
        "a <V0> dog, grass",
    }
    assert dm.task_prompts(1) == ["a <V1> duck toy"] * 2
    xs, ts, noise = dm.heldout(0, (4, 16, 16))
    assert xs.shape == (2, 3, 32, 32) and ts.tolist() == [100, 500] and noise.shape == (2, 4, 16, 16)
    again = ContinualConceptDataModule(**kw, eval_timesteps=[100, 500])
    assert torch.equal(again.heldout(0, (4, 16, 16))[2], noise) and torch.equal(
        again.heldout(1)[0], dm.heldout(1)[0]
    )
    monkeypatch.setenv("PL_GLOBAL_SEED", "1")  # another run seed: another "data" stream
    other = ContinualConceptDataModule(**kw)
    assert len(other.task_images(0)) == 2  # the seeded split (which image is held out) may differ
    assert len(dm.calibration_prompts()) == 64 and "a photo of a duck toy" in dm.calibration_prompts()
    with pytest.raises(ValueError, match="pretrained_path"):
        dm.base_batch(2, torch.Generator())


def test_concept_folder_errors_name_the_concept(tmp_path):
    from litlab.datamodules.continual_concepts import ContinualConceptDataModule

    root = write_concepts(tmp_path / "cifc", {"dog": ["a dog", "a dog"], "cat": []})
    with pytest.raises(FileNotFoundError, match="'duck_toy' has no folder"):
        ContinualConceptDataModule(data_root=str(root), concept_names=["dog", "duck_toy"], num_concepts=2)
    with pytest.raises(FileNotFoundError, match="concept 'cat': 0 images"):
        ContinualConceptDataModule(data_root=str(root), concept_names=["dog", "cat"], num_concepts=2)
    with pytest.raises(FileNotFoundError, match="concept 'dog': 2 images .* at least 3"):
        ContinualConceptDataModule(
            data_root=str(root), concept_names=["dog"], num_concepts=1, heldout_images=2
        )
    with pytest.raises(ValueError, match="concept_names"):
        ContinualConceptDataModule(data_root=str(root), num_concepts=1)


def full_config_args(tmp_path: Path, sd: Path, root: Path, epochs: int, extra: list[str]) -> list[str]:
    """``litlab fit --config configs/scns/full.yaml`` on the CPU, with the tiny checkpoint and concept folder."""
    return [
        "fit",
        f"--config={ROOT / 'configs/scns/full.yaml'}",
        f"--runs_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.accelerator=cpu",
        "--trainer.precision=32",
        f"--trainer.max_epochs={epochs}",
        f"--model.init_args.pretrained_path={sd}",
        "--model.init_args.select.num_probes=4",
        "--model.init_args.select.fisher_samples=4",
        "--model.init_args.select.top_p=64",
        "--model.init_args.lr_rows=0.05",
        "--model.init_args.lr_token=0.05",
        f"--data.init_args.data_root={root}",
        "--data.init_args.num_concepts=2",
        "--data.init_args.image_size=32",
        "--data.init_args.steps_per_task=2",
        "--data.init_args.eval_timesteps=[100,500]",
        *extra,
    ]


def test_full_config_fits_a_tiny_sd_layout_checkpoint(tmp_path, monkeypatch):
    """``litlab fit --config configs/scns/full.yaml`` on the tiny checkpoint and a two-concept folder: the selection
    runs on the latent loop, only selected K/V rows and the token rows change (the config's FrozenParamGuard and a
    diff against the checkpoint), and the sample grid is decoded through the VAE to 32 × 32 pixels."""
    from safetensors.torch import load_file

    from litlab.cli import LitlabCLI
    from litlab.lit_modules.diffusion.ddpm import LatentT2I
    from litlab.lit_modules.diffusion.report import CONCEPT_SAMPLES_FILE

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sd = write_tiny_sd(tmp_path / "tiny-sd")
    root = write_concepts(
        tmp_path / "cifc", {"dog": ["a dog on the grass", "a photo of a dog", None], "duck_toy": [None] * 3}
    )
    cli = LitlabCLI(
        args=full_config_args(
            tmp_path,
            sd,
            root,
            epochs=2,
            extra=[
                "--model.init_args.sampling.per_concept=2",  # 1 held-out image: taken twice
                "--model.init_args.sampling.steps=3",
                "--model.init_args.sampling.guidance=7.5",
                "--model.init_args.eval_batch=2",  # held-out forwards and probe / Fisher backwards in chunks of 2
            ],
        )
    )
    trainer, model, dm = cli.trainer, cli.model, cli.datamodule
    assert trainer.state.finished and trainer.global_step == 4
    assert isinstance(model.model, LatentT2I)
    # the selection ran: SCNS picked a few neurons of the latent UNet per task, each merged and logged
    assert len(model.selections) == 2 and all(0 < len(s) < model.gs.size for s in model.selections)
    assert all(
        info["measured_changed_frac"] == pytest.approx(info["changed_frac"]) for info in model.task_log
    )
    assert model.omega.shape == (model.gs.size,) and float(model.omega.max()) > 0
    for key in ("val/forgetting", "val/plasticity", "val/base_drift", "val/risk_sum"):
        assert torch.isfinite(trainer.callback_metrics[key]), key
    # only the selected K/V rows and the concept token rows differ from the checkpoint (the config's guard checked
    # every other tensor of the model during the fit)
    (guard,) = [c for c in trainer.callbacks if type(c).__name__ == "FrozenParamGuard"]
    assert guard.changed(model) == {"model": []}
    base = LatentT2I.from_pretrained(str(sd))
    before, after = base.state_dict(), model.model.state_dict()
    assert list(before) == list(after)
    allowed = model.gs.split(sorted({n for s in model.selections for n in s}))
    emb = next(k for k in before if k.endswith("token_embedding.weight"))
    new_rows = [dm.token_ids(t)[0] for t in range(2)]
    assert (
        new_rows == [before[emb].shape[0], before[emb].shape[0] + 1]
        and after[emb].shape[0] == new_rows[-1] + 1
    )
    assert torch.equal(after[emb][: before[emb].shape[0]], before[emb])
    for t in range(2):  # each token row moved away from its class word's row, which it started from
        assert not torch.equal(after[emb][new_rows[t]], before[emb][dm.token_ids(t)[1]])
    changed_kv = 0
    for key in before:
        if key == emb:
            continue
        diff = (
            (before[key] != after[key]).reshape(before[key].shape[0], -1).any(1) if before[key].ndim else None
        )
        name = key.removeprefix("unet.").removesuffix(".weight")
        if key.startswith("unet.") and name in allowed:
            rows = set(torch.nonzero(diff).flatten().tolist())
            assert rows <= set(allowed[name].tolist()), key
            changed_kv += len(rows)
        else:
            assert diff is None or not bool(diff.any()), key
    assert changed_kv > 0
    # per-sample gradients in chunks of eval_batch equal those of one backward
    x0 = model.to_x0(dm.task_images(0))[torch.tensor([0, 1, 0, 1])]
    taus, noise = (
        torch.tensor([100, 300, 500, 700]),
        torch.randn(x0.shape, generator=torch.Generator().manual_seed(0)),
    )
    chunked = model.row_grads(x0, dm.concept_prompt(0), taus, noise)
    model.hparams.eval_batch = 4
    whole = model.row_grads(x0, dm.concept_prompt(0), taus, noise)
    for name in model.gs.modules:
        torch.testing.assert_close(chunked[name], whole[name], rtol=1e-4, atol=1e-6)
    # the sample grid: SDEdit samples in latent space, decoded through the VAE to pixels
    samples = load_file(str(cli.run_dir / CONCEPT_SAMPLES_FILE))
    assert sorted(samples) == sorted(
        f"{kind}_{k}" for kind in ("ref", "base", "after", "final") for k in (0, 1)
    )
    for value in samples.values():
        assert value.shape == (2, 3, 32, 32) and float(value.abs().max()) <= 1.0
    assert not torch.equal(samples["base_0"], samples["final_0"])
    assert torch.equal(samples["ref_0"][0], samples["ref_0"][1])  # one image, two noises
    # classifier-free guidance against the empty prompt (7.5 here) changes the samples; w = 1 is the plain DDIM
    guided = model.sample_concepts(dm, [0], [dm.concept_prompt(0)])[0]
    torch.testing.assert_close(guided, samples["final_0"], atol=1e-5, rtol=0)
    model.sampling = dataclasses.replace(model.sampling, guidance=1.0)
    assert not torch.allclose(model.sample_concepts(dm, [0], [dm.concept_prompt(0)])[0], guided, atol=1e-4)
    assert not torch.equal(samples["final_0"][0], samples["final_0"][1])


def test_full_config_resumes_with_the_grown_embedding(tmp_path, monkeypatch):
    """A checkpoint of the latent loop holds the embedding grown by the concept tokens: a fit resumed from the
    end of task 1 adds the tokens again before the weights load, keeps task 1's selection and runs task 2."""
    from litlab.cli import LitlabCLI

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sd = write_tiny_sd(tmp_path / "tiny-sd")
    root = write_concepts(tmp_path / "cifc", {"dog": ["a dog", None, None], "duck_toy": [None] * 3})
    extra = ["--model.init_args.sampling.per_concept=0", "--experiment=resume"]
    first = LitlabCLI(args=full_config_args(tmp_path, sd, root, epochs=1, extra=extra))
    ckpt = first.run_dir / "checkpoints" / "last.ckpt"
    assert len(first.model.selections) == 1 and ckpt.exists()
    resumed = LitlabCLI(
        args=full_config_args(tmp_path, sd, root, epochs=2, extra=[*extra, f"--ckpt_path={ckpt}"])
    )
    model = resumed.model
    assert resumed.trainer.global_step == 4 and len(model.selections) == 2
    assert model.selections[0] == first.model.selections[0]
    emb = model.model.text_encoder.get_input_embeddings().weight
    first_emb = first.model.model.text_encoder.get_input_embeddings().weight
    assert emb.shape == first_emb.shape
    row0 = resumed.datamodule.token_ids(0)[0]
    assert torch.equal(emb[row0], first_emb[row0])  # task 1's token row came back from the checkpoint
