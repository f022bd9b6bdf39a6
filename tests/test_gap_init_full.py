"""Gap-Init's full-scale loop (``lit_modules/peft/gap_init_full.py``, BLIP-2 captioning on COCO Karpathy) on its
stand-in: a tiny ``Blip2ForConditionalGeneration`` of the full config's classes and a few COCO records in the
Karpathy layout, offline. BLIP-2 OPT-2.7B itself is never loaded here; its offline failure is checked by name.

What is checked: the data module reads the Karpathy layout and fails at once naming a missing folder; BLIP-2's batch
layout (image tokens, BOS, prompt masked out of the loss); the gap estimate against an independent computation from
the frozen model's hidden states (spec §3.2) and the init rules (§3.3): only the LoRA factors differ between
``gap``, ``peft_default`` and ``reverse_random``, and each is a no-op at step 0 (§7.1); ``litlab fit`` of
``configs/gap_init/full.yaml`` on the stand-in trains, checkpoints only the adapter factors, resumes and tests.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "configs" / "gap_init" / "full.yaml"


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory) -> tuple[Path, list[str]]:
    from litlab.lit_modules.peft.gap_init_full import stand_in_gap_init

    workdir = tmp_path_factory.mktemp("gap_init_stand_in")
    return workdir, stand_in_gap_init(workdir)


def arg(args: list[str], key: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"--{key}="))


def build(stand_in, init: str, monkeypatch, **kwargs):
    """The module and data module of the full config, on the stand-in, as LightningCLI builds them."""
    from litlab.datamodules.coco_caption import CocoKarpathyCaptionDataModule
    from litlab.lit_modules.peft.gap_init_full import GapInitCaptioning

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    _, args = stand_in
    model = GapInitCaptioning(
        backbone=arg(args, "model.init_args.backbone"),
        dtype="float32",
        init=init,
        decoding={"max_new_tokens": 3, "min_new_tokens": 1, "num_beams": 1},
        **kwargs,
    )
    dm = CocoKarpathyCaptionDataModule(
        data_root=arg(args, "data.init_args.data_root"),
        batch_size=2,
        eval_batch_size=4,
        calib_size=8,
        num_workers=0,
    )
    return model, dm


def initialise(model, dm):
    """Run the module's setup and initialisation through a one-batch ``validate`` (as ``fit`` does before training)."""
    import lightning as L

    L.Trainer(
        accelerator="cpu",
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).validate(model, datamodule=dm, verbose=False)


def test_coco_karpathy_layout_and_blip2_batches(stand_in, tmp_path, monkeypatch):
    from litlab.datamodules.coco_caption import CocoKarpathyCaptionDataModule
    from litlab.lit_modules.core.errors import DatasetUnavailableError
    from litlab.lit_modules.peft.blip2_captioning import pre_caption

    workdir, _ = stand_in
    with pytest.raises(
        DatasetUnavailableError, match=r"COCO folder .*nowhere does not exist.*dataset_coco\.json"
    ):
        CocoKarpathyCaptionDataModule(data_root=str(workdir / "nowhere"))
    with pytest.raises(DatasetUnavailableError, match=r"Karpathy split file .*dataset_coco\.json.*train2014"):
        CocoKarpathyCaptionDataModule(data_root=str(workdir))
    model, dm = build(stand_in, "gap", monkeypatch)
    assert len(dm.pairs()) == 16 and len(dm.images("val")) == 3 and len(dm.images("test")) == 3
    path, caption, refs = dm.images("val")[0]
    assert path.is_file() and path.parent.name == "val2014" and caption == refs[0] and len(refs) == 3
    with pytest.raises(RuntimeError, match="use_encoder"):
        dm.train_dataloader()

    enc = model.encoder
    dm.use_encoder(enc)
    batch = next(iter(dm.val_dataloader()))
    n_query, tok = enc.n_query, enc.tokenizer
    assert batch["pixel_values"].shape == (3, 3, 32, 32) and len(batch["references"]) == 3
    for row, refs in enumerate(batch["references"]):
        ids, labels, mask = batch["input_ids"][row], batch["labels"][row], batch["attention_mask"][row]
        assert (ids[:n_query] == enc.image_token_id).all()
        assert ids[n_query] == tok.bos_token_id and (labels[: n_query + len(enc.prompt_ids)] == -100).all()
        kept = labels[labels != -100]
        assert tok.decode(kept) == f" {pre_caption(refs[0])}\n"  # the caption and its "\n", nothing else
        assert (labels[mask == 0] == -100).all() and (ids[mask == 0] == tok.pad_token_id).all()
    assert pre_caption('A man, "riding" a horse.  ') == "a man, riding a horse"
    from litlab.lit_modules.peft.blip2_captioning import CaptionEncoder

    parts = SimpleNamespace(tokenizer=tok, image_processor=enc.image_processor)
    with pytest.raises(ValueError, match=r"max_text_tokens=4 leaves no room .*'a photo of'"):
        CaptionEncoder(parts, n_query, enc.image_token_id, "a photo of", max_text_tokens=4)
    calib = list(dm.calibration_dataloader())
    # an image the split file names but the folder lacks stops the loader naming it
    record = {"filepath": "train2014", "filename": "COCO_train2014_000000000001.jpg", "split": "train"}
    (tmp_path / "dataset_coco.json").write_text(
        json.dumps({"images": [{**record, "sentences": [{"raw": "a"}]}]})
    )
    lacking = CocoKarpathyCaptionDataModule(data_root=str(tmp_path), calib_size=1, num_workers=0)
    lacking.use_encoder(enc)
    with pytest.raises(
        DatasetUnavailableError, match=r"COCO image .*train2014/COCO_train2014_000000000001\.jpg"
    ):
        next(iter(lacking.train_dataloader()))
    assert sum(len(b["input_ids"]) for b in calib) == 8 and "references" not in calib[0]


def test_cider_d_on_hand_computed_cases():
    """CIDEr-D ×10: a caption equal to its one reference scores 10 (every order's cosine is 1); "a b" against
    "a b c d", with "a" in both images' references (idf 0): 1/√3 at orders 1 and 2, nothing at 3 and 4, the length
    penalty on bigram counts 1 vs 3, so 10 · (2/√3) · exp(−4/72) / 4; words shared by no reference score 0."""
    from litlab.lit_modules.peft.blip2_captioning import cider_d

    refs = [["a b c d"], ["a e f g"]]
    assert cider_d(["a b c d", "a e f g"], refs) == pytest.approx(10.0)
    hand = 10 * (2 / 3**0.5) * math.exp(-4 / 72) / 4
    assert cider_d(["a b", "a e f g"], refs) == pytest.approx((hand + 10) / 2)
    assert cider_d(["x y z", "q r"], refs) == 0.0
    # several references: the mean over them; a caption equal to one of two distinct references scores below 10
    two = cider_d(["a b c d", "a e f g"], [["a b c d", "h i j k"], ["a e f g", "l m n o"]])
    assert 0 < two < 10
    with pytest.raises(ValueError, match="one reference list per candidate"):
        cider_d(["a"], [])


def independent_gaps(model, dm) -> dict[int, torch.Tensor]:
    """ĝ_l from the frozen backbone (loaded again, no adapters), one pair at a time, position by position: the
    spec's §3.2 with smooth = trimmed_unit (8 pairs: 5 % trims none, so the mean of the unit gaps)."""
    from transformers import Blip2ForConditionalGeneration

    base = Blip2ForConditionalGeneration.from_pretrained(model.hparams.backbone).eval()
    per_layer: dict[int, list[torch.Tensor]] = {}
    with torch.no_grad():
        for batch in dm.calibration_dataloader():
            for i in range(len(batch["input_ids"])):
                keep = batch["attention_mask"][i] == 1
                ids = batch["input_ids"][i][keep][None]
                hs = base(
                    pixel_values=batch["pixel_values"][i : i + 1], input_ids=ids, output_hidden_states=True
                ).language_model_outputs.hidden_states
                visual = ids[0] == model.encoder.image_token_id
                for layer in range(base.config.text_config.num_hidden_layers):
                    g = hs[layer][0][~visual].mean(0) - hs[layer][0][visual].mean(0)
                    per_layer.setdefault(layer, []).append(g / g.norm())
    return {
        layer: torch.stack(gs).mean(0) / torch.stack(gs).mean(0).norm() for layer, gs in per_layer.items()
    }


def wrapped(key: str) -> str:
    """A backbone key's name once its linear layer is an ``AdapterLinear`` (the frozen layer is its ``base``)."""
    return re.sub(r"\.(q_proj|v_proj)\.", r".\1.base.", key)


def test_the_init_rule_changes_only_the_lora_factors_and_starts_as_a_no_op(stand_in, monkeypatch):
    from transformers import Blip2ForConditionalGeneration

    from litlab.lit_modules.core.adapters import find_adapters
    from litlab.lit_modules.peft.gap_init_full import INIT_STATS, LAYER

    built = {}
    for init in ("gap", "peft_default", "reverse_random"):
        model, dm = build(stand_in, init, monkeypatch)
        initialise(model, dm)
        built[init] = (model, dm)
    model, dm = built["gap"]
    adapters = find_adapters(model.model)
    assert sorted(n.rsplit(".", 1)[1] for n in adapters) == ["q_proj", "q_proj", "v_proj", "v_proj"]
    assert all(n.startswith("language_model.") for n in adapters)

    # (3) B[:, 0] = ĝ_l of the module's block, A = 0; the estimate matches the independent computation
    expected = independent_gaps(model, dm)
    for name, layer in adapters.items():
        branch = layer.branches["default"]
        g = expected[int(LAYER.search(name).group(1))]
        assert torch.equal(branch.A, torch.zeros_like(branch.A))
        assert float(torch.nn.functional.cosine_similarity(branch.B[:, 0], g, dim=0)) > 1 - 1e-5, name
    assert not torch.allclose(expected[0], expected[1], atol=1e-3)  # the gap is layer-wise
    assert float(model.init_cos_B_g) == pytest.approx(1.0, abs=1e-6) and float(model.init_gap_norm) > 0

    # everything but the factors is the frozen backbone, for every rule; each rule is a no-op at step 0 (§7.1)
    base = Blip2ForConditionalGeneration.from_pretrained(model.hparams.backbone).eval()
    frozen = base.state_dict()
    batch = next(iter(dm.val_dataloader()))
    inputs = {k: batch[k] for k in ("pixel_values", "input_ids", "attention_mask")}
    with torch.no_grad():
        reference = base(**inputs).logits
    factors = {}
    for init, (m, _) in built.items():
        state = m.model.state_dict()
        own = {k for k in state if ".branches.default." in k}
        assert {k for k in state if k not in own and not k.endswith("_extra_state")} == set(
            map(wrapped, frozen)
        )
        for k, v in frozen.items():
            assert torch.equal(state[wrapped(k)], v), (init, k)
        assert float(m.init_max_delta) == 0.0
        with torch.no_grad():
            assert torch.equal(m.model(**inputs).logits, reference), init
        factors[init] = {k: state[k] for k in sorted(own)}
        trainable = {n for n, p in m.named_parameters() if p.requires_grad}
        assert trainable == {f"model.{k}" for k in own}, init
    # a checkpoint of another adapter layout is refused by name, not loaded in part (loading is not strict)
    from litlab.lit_modules.core.errors import CheckpointError

    gap_model = built["gap"][0]
    saved = {"state_dict": dict(gap_model.state_dict())}
    gap_model.on_save_checkpoint(saved)
    stats = {f"init_{k}" for k in INIT_STATS}
    assert set(saved["state_dict"]) == {f"model.{k}" for k in factors["gap"]} | stats
    one_less = {k: v for k, v in saved["state_dict"].items() if "v_proj" not in k}
    with pytest.raises(CheckpointError, match=r"lacks 4 adapter tensors .*v_proj"):
        built["peft_default"][0].on_load_checkpoint({"state_dict": one_less})
    surplus = {**saved["state_dict"], "model.extra.branches.default.A": torch.zeros(1)}
    with pytest.raises(CheckpointError, match=r"has surplus 1 adapter tensors .*extra"):
        built["peft_default"][0].on_load_checkpoint({"state_dict": surplus})
    for name in factors["gap"]:
        a_or_b = name.rsplit(".", 1)[1]
        peft, rev = factors["peft_default"][name], factors["reverse_random"][name]
        if a_or_b == "A":  # PEFT: Kaiming A; Gap-Init and reverse-random: A = 0
            assert peft.abs().sum() > 0 and rev.abs().sum() == 0
        else:  # PEFT: B = 0; reverse-random: a random unit column, not the gap's
            assert peft.abs().sum() == 0 and float(rev[:, 0].norm()) == pytest.approx(1.0, abs=1e-6)
            assert (
                abs(
                    float(torch.nn.functional.cosine_similarity(rev[:, 0], factors["gap"][name][:, 0], dim=0))
                )
                < 0.9
            )


def test_the_premise_and_the_first_step_gradients(stand_in, monkeypatch):
    """At fit start ρ_g = E[(ĝ_l·δ)²] / E[‖δ‖²] (spec §7.4) equals an independent reading of the frozen backbone's
    output gradients at q_proj / v_proj (no adapters: they are a no-op at step 0); the first step's gradient
    reaches A only under Gap-Init (B's is exactly 0) and B only under PEFT's default (spec §7.3)."""
    import lightning as L
    from transformers import Blip2ForConditionalGeneration

    def fit_one_step(init: str):
        model, dm = build(stand_in, init, monkeypatch)
        L.Trainer(
            accelerator="cpu",
            max_steps=1,
            limit_val_batches=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        ).fit(model, datamodule=dm)
        return model, dm

    gap, dm = fit_one_step("gap")
    peft, _ = fit_one_step("peft_default")
    assert float(gap.init_grad_A) > 0 and float(gap.init_grad_B) == 0.0
    assert float(peft.init_grad_B) > 0 and float(peft.init_grad_A) == 0.0
    assert torch.isnan(peft.init_rho_g)  # measured where the gap is estimated

    g_hats = independent_gaps(gap, dm)
    base = Blip2ForConditionalGeneration.from_pretrained(gap.hparams.backbone).eval()
    outputs: dict[int, list[torch.Tensor]] = {}
    for name, module in base.named_modules():
        if name.endswith(("q_proj", "v_proj")):
            layer = int(re.search(r"layers\.(\d+)\.", name).group(1))
            module.register_forward_hook(lambda m, i, o, layer=layer: outputs.setdefault(layer, []).append(o))
    batch = next(iter(dm.calibration_dataloader()))
    loss = base(**{k: batch[k] for k in ("pixel_values", "input_ids", "attention_mask", "labels")}).loss
    flat = [(layer, o) for layer, outs in outputs.items() for o in outs]
    grads = torch.autograd.grad(loss, [o for _, o in flat])
    ratios = []
    for (layer, _), delta in zip(flat, grads):
        delta = delta.reshape(-1, delta.shape[-1]).double()
        g = g_hats[layer].double()
        ratios.append(float((delta @ g).pow(2).mean() / delta.pow(2).sum(1).mean()))
    assert len(ratios) == 4 and float(gap.init_rho_g) == pytest.approx(sum(ratios) / 4, rel=1e-4)


@pytest.mark.parametrize("mismatch", ["map", "default"])
def test_a_module_of_another_width_maps_the_gap_through_its_weight_or_takes_peft_default(
    mismatch, stand_in, monkeypatch
):
    """OPT's fc1 (d -> ffn width): ``map`` puts normalise(W₀ ĝ_l) in B[:, 0] with A = 0 (reconstructed rule),
    ``default`` PEFT's Kaiming A and B = 0; either way a no-op at step 0."""
    from litlab.lit_modules.core.adapters import find_adapters
    from litlab.lit_modules.peft.gap_init_full import LAYER

    model, dm = build(stand_in, "gap", monkeypatch, targets=["fc1"], mismatch=mismatch)
    initialise(model, dm)
    expected = independent_gaps(model, dm)
    adapters = find_adapters(model.model)
    assert len(adapters) == 2 and float(model.init_max_delta) == 0.0
    for name, layer in adapters.items():
        branch, W0 = layer.branches["default"], layer.base.weight
        assert W0.shape[0] != W0.shape[1]  # the gap's width is d, the module writes ffn
        if mismatch == "map":
            mapped = W0 @ expected[int(LAYER.search(name).group(1))]
            assert torch.equal(branch.A, torch.zeros_like(branch.A))
            assert float(torch.nn.functional.cosine_similarity(branch.B[:, 0], mapped, dim=0)) > 1 - 1e-5
        else:
            assert branch.A.abs().sum() > 0 and branch.B.abs().sum() == 0


def test_full_config_fits_checkpoints_the_factors_resumes_and_tests(stand_in, tmp_path, monkeypatch):
    """``litlab fit --config configs/gap_init/full.yaml`` with the stand-in's arguments: 2 steps, a checkpoint
    holding the adapter factors only; a relaunch to max_steps 4 resumes from it (steps 3-4); ``test`` from
    the last checkpoint evaluates with finite loss, token accuracy and BLEU-4."""
    from litlab.cli import LitlabCLI
    from litlab.lit_modules.peft.gap_init_full import INIT_STATS

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, args = stand_in
    common = [
        f"--config={FULL}",
        *args,
        f"--runs_dir={tmp_path / 'runs'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    first = LitlabCLI(args=["fit", *common])
    assert first.trainer.global_step == 2
    metrics = first.trainer.callback_metrics
    for key in (
        "val/loss",
        "val/token_acc",
        "val/bleu4",
        "val/cider",
        *(f"init/{k}" for k in INIT_STATS),
    ):
        assert torch.isfinite(metrics[key]), key
    ckpt = first.run_dir / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    trained = {n for n, p in first.model.named_parameters() if p.requires_grad}
    assert set(saved) == trained | {f"init_{k}" for k in INIT_STATS}
    assert len(trained) == 8 and all(".branches.default." in k for k in trained)  # 2 blocks x q, v x A, B

    resumed = LitlabCLI(args=["fit", *common, "--trainer.max_steps=4", f"--ckpt_path={ckpt}"])
    assert resumed.trainer.global_step == 4 and resumed.model.initialised
    for key in ("init_cos_B_g", "init_rho_g", "init_grad_A"):  # from the checkpoint: no second calibration
        assert float(getattr(resumed.model, key)) == float(saved[key])
    after = resumed.model.state_dict()
    assert any(not torch.equal(after[k], saved[k]) for k in trained)  # steps 3-4 moved the factors

    test = LitlabCLI(args=["test", *common, f"--ckpt_path={resumed.run_dir / 'checkpoints' / 'last.ckpt'}"])
    got = test.trainer.callback_metrics
    keys = ("test/loss", "test/token_acc", "test/bleu4", "test/cider")
    assert set(keys) <= set(got) and all(torch.isfinite(got[k]) for k in keys)


def test_full_config_fails_at_once_offline_naming_the_model(tmp_path, monkeypatch):
    from litlab.cli import LitlabCLI
    from litlab.lit_modules.core.errors import ModelUnavailableError

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.time()
    with pytest.raises(ModelUnavailableError) as err:
        LitlabCLI(
            args=[
                "fit",
                f"--config={FULL}",
                "--trainer.accelerator=cpu",
                "--trainer.precision=32",
                f"--runs_dir={tmp_path}",
            ]
        )
    assert time.time() - started < 60
    assert "Salesforce/blip2-opt-2.7b" in str(err.value) and "hf download" in str(err.value)


def test_the_toy_module_names_the_full_scale_class_for_a_vlm_backbone():
    from litlab.lit_modules.core.errors import ConfigError
    from litlab.lit_modules.peft.gap_init import GapInitLoRA

    with pytest.raises(ConfigError, match=r"gap_init_full\.GapInitCaptioning"):
        GapInitLoRA(backbone="Salesforce/blip2-opt-2.7b")


def test_the_full_config_adapts_the_64_llm_projections_of_blip2_opt_2_7b():
    """On the real architecture (``litlab.model_shapes``, meta device: no weights): the config's targets wrap the
    32 OPT blocks' q_proj and v_proj only, 327,680 trainable parameters at rank 1, and each writes the width-2560
    residual space the gaps live in, so Gap-Init's rule (not the mismatch fallback) sets every B."""
    import yaml

    from litlab.lit_modules.core.adapters import adapter_parameters, inject_adapters
    from litlab.lit_modules.peft.gap_init_full import LAYER, llm_targets
    from litlab.model_shapes import build_on_meta

    args = yaml.safe_load(FULL.read_text())["model"]["init_args"]
    model = build_on_meta(args["backbone"])
    adapted = inject_adapters(model, llm_targets(args["targets"]), rank=args["rank"], alpha=2.0, init="zeros")
    d = model.config.text_config.hidden_size
    assert len(adapted) == 64 and sum(p.numel() for p in adapter_parameters(adapted)) == 64 * 2 * d == 327_680
    assert all(n.startswith("language_model.model.decoder.layers.") for n in adapted)
    assert {(m.in_features, m.out_features) for m in adapted.values()} == {(d, d)}
    assert sorted(int(LAYER.search(n).group(1)) for n in adapted) == sorted(list(range(32)) * 2)
