"""Full-scale path of the continual methods without a download: clear failures offline, and the image-folder
DataModule + Hugging Face ViT backbone end to end on a tiny ViT saved locally and a few generated images."""

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from litlab.callbacks.continual import AccuracyMatrixCallback
from litlab.datamodules.continual import ContinualDataModule
from litlab.lit_modules.continual.harness import Backbone
from litlab.lit_modules.continual.janus_lora import JanusLoRA
from litlab.lit_modules.continual.loda import LoDA
from litlab.lit_modules.core.errors import DatasetUnavailableError, ModelUnavailableError

ROOT = Path(__file__).resolve().parent.parent


def test_missing_benchmark_folder_fails_at_once_with_where_to_get_it():
    with pytest.raises(DatasetUnavailableError, match="imagenet-r.tar"):
        ContinualDataModule(benchmark="imagenet_r")


def test_missing_backbone_fails_at_once_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="hf download"):
        JanusLoRA(backbone=Backbone(name="litlab-test/no-such-vit"))


def _image_folders(root: Path, classes=4, per_split=(6, 3), size=32):
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in zip(("train", "test"), per_split):
        for c in range(classes):
            d = root / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                img = (rng.random((size, size, 3)) * 60 + 50 * c).clip(0, 255).astype(np.uint8)
                Image.fromarray(img).save(d / f"{i}.png")


def _tiny_vit(folder: Path) -> str:
    import transformers

    cfg = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )
    torch.manual_seed(0)
    transformers.ViTModel(cfg, add_pooling_layer=False).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("method", [JanusLoRA, LoDA])
def test_image_folder_benchmark_with_a_local_hf_vit(method, tmp_path, quiet_trainer):
    _image_folders(tmp_path / "data")
    vit = _tiny_vit(tmp_path / "vit")
    dm = ContinualDataModule(
        benchmark="cifar100",
        data_root=str(tmp_path / "data"),
        num_tasks=2,
        epochs_per_task=1,
        batch_size=4,
        image_size=32,
    )
    targets = ["k_proj", "v_proj"] if method is JanusLoRA else ["q_proj", "k_proj", "v_proj"]
    module = method(
        backbone=Backbone(name=vit, width=32), targets=targets, rank=2, alpha=2.0, eval_head="cosine", lr=0.05
    )
    acc = AccuracyMatrixCallback()
    L.seed_everything(0)
    trainer = quiet_trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, callbacks=[acc])
    trainer.fit(module, dm)
    assert dm.num_classes == 4 and len(acc.R) == 2 and "cl/acc" in trainer.callback_metrics
    assert len(module.adapted) == 2 * len(targets)
