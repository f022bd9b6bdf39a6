"""Full scale of the domain family, without the data or the weights: the class-folder reader on a tiny fake
image folder (8×8 PNGs in tmp_path), a U³CF fit on it with the toy's small backbone, and the ResNet backbones'
offline failures (nothing is downloaded)."""

from __future__ import annotations

import importlib.util

import lightning as L
import numpy as np
import pytest
import torch

from litlab.datamodules.domain import MultiTargetDigitsDataModule, class_folder_samples
from litlab.lit_modules.core.errors import DatasetUnavailableError, ModelUnavailableError
from litlab.lit_modules.domain.nets import resnet_weights_file

CLASSES = ("dog", "elephant", "giraffe")  # three of PACS' seven classes


def _torchvision_imports() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError):  # a wheel built for another torch
        return False
    return True


HAS_TORCHVISION = _torchvision_imports()


def fake_pacs(root, domains=("photo", "cartoon", "sketch"), per_class=3, classes=CLASSES):
    from PIL import Image

    rng = np.random.default_rng(0)
    for d in domains:
        for c in classes:
            folder = root / d / c
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray((rng.random((8, 8, 3)) * 255).astype(np.uint8)).save(folder / f"{i}.png")
    (root / domains[0] / classes[0] / "notes.txt").write_text("not an image")
    return root


def test_class_folder_samples_index_like_image_folder(tmp_path):
    fake_pacs(tmp_path)
    (tmp_path / "photo" / "dog" / "more").mkdir()
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "photo" / "dog" / "more" / "x.JPG")
    classes, samples = class_folder_samples(tmp_path / "photo")
    assert classes == list(CLASSES)
    assert [c for _, c in samples] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]  # notes.txt left out, the sub-folder in
    assert samples[0][0].endswith("photo/dog/0.png") and samples[3][0].endswith("dog/more/x.JPG")
    if HAS_TORCHVISION:
        from torchvision.datasets import ImageFolder

        ds = ImageFolder(str(tmp_path / "photo"))
        assert ds.classes == classes and [(str(p), c) for p, c in ds.samples] == samples


def test_class_folder_datamodule_reads_every_domain(tmp_path):
    fake_pacs(tmp_path)
    dm = MultiTargetDigitsDataModule(
        benchmark="pacs", source="photo", targets=["cartoon", "sketch"], data_root=str(tmp_path), image_size=8
    )
    assert dm.num_outputs == 3 and dm.input_shape == (3, 8, 8) and dm.num_domains == 3
    dm.setup("fit")
    assert dm.classes == list(CLASSES)
    assert dm.source_x.shape == (9, 3, 8, 8) and dm.source_y.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert 0.0 <= float(dm.source_x.min()) and float(dm.source_x.max()) <= 1.0
    assert [len(x) for x in dm.target_x] == [9, 9]
    x, y, d = next(iter(dm.val_dataloader()))
    assert x.shape == (18, 3, 8, 8) and d.tolist() == [1] * 9 + [2] * 9
    assert dm.data_key()["data_root"] == str(tmp_path) and dm.data_key()["source"] == "photo"


def test_class_folder_errors_name_the_folder(tmp_path):
    fake_pacs(tmp_path / "a", classes=CLASSES)
    (tmp_path / "a" / "sketch" / "horse").mkdir()
    (tmp_path / "a" / "sketch" / "horse" / "0.png").write_bytes(
        (tmp_path / "a" / "photo" / "dog" / "0.png").read_bytes()
    )
    dm = MultiTargetDigitsDataModule(
        benchmark="pacs", source="photo", targets=["sketch"], data_root=str(tmp_path / "a"), image_size=8
    )
    with pytest.raises(DatasetUnavailableError, match=r"sketch has other class folders .*horse"):
        dm.setup("fit")
    (tmp_path / "b" / "photo").mkdir(parents=True)
    (tmp_path / "b" / "cartoon").mkdir()
    dm = MultiTargetDigitsDataModule(
        benchmark="pacs", source="photo", targets=["cartoon"], data_root=str(tmp_path / "b")
    )
    with pytest.raises(DatasetUnavailableError, match=r"b/photo holds no image"):
        dm.setup("fit")
    with pytest.raises(ValueError, match="needs data.init_args.targets"):
        MultiTargetDigitsDataModule(benchmark="pacs", source="photo", data_root=str(tmp_path / "a"))
    with pytest.raises(ValueError, match="pacs has no domain 'amazon'"):
        MultiTargetDigitsDataModule(
            benchmark="pacs", source="amazon", targets=["photo"], data_root=str(tmp_path)
        )


def _fit_u3cf(tmp_path, quiet_trainer, net):
    from litlab.lit_modules.domain.u3cf import U3CF

    fake_pacs(tmp_path / "data")
    dm = MultiTargetDigitsDataModule(
        benchmark="pacs",
        source="photo",
        targets=["cartoon", "sketch"],
        data_root=str(tmp_path / "data"),
        image_size=8,
    )
    module = U3CF(
        method="u3cf",
        source_stage={"optimizer": "sgd", "lr": 0.01, "iters": 4, "batch_size": 8},
        net=net,
        curriculum={"iters_per_target": 2, "batch_source": 8, "batch_target": 8, "thr": 0.2},
        causal={"iters": 2, "batch_size": 8},
    )
    L.seed_everything(0)
    trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=dm)
    return trainer, module


def test_u3cf_fits_on_class_folders_with_the_small_backbone(tmp_path, quiet_trainer):
    trainer, module = _fit_u3cf(tmp_path, quiet_trainer, {"channels": (4, 8, 8), "feat_dim": 8, "latent": 4})
    assert int(module.it) == 2 * 2 + 2 and sorted(module.order.tolist()) == [0, 1]
    m = trainer.callback_metrics
    assert {"val/acc_cartoon", "val/acc_sketch", "val/acc_mean"} <= set(m)
    assert m["curriculum/order_ok"].item() == 1.0


@pytest.mark.skipif(HAS_TORCHVISION, reason="checks the message where torchvision does not import")
def test_resnet_without_torchvision_fails_at_once_with_the_install_line():
    from litlab.lit_modules.domain.u3cf import U3CF

    with pytest.raises(ModelUnavailableError, match="needs torchvision.*pip install torchvision"):
        U3CF(net={"backbone": "resnet50", "backbone_weights": "IMAGENET1K_V1"})


@pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision does not import here")
def test_resnet_weights_missing_offline_name_the_file_and_url(tmp_path, monkeypatch):
    from litlab.lit_modules.domain.sfda_regression import SFDARegression
    from litlab.lit_modules.domain.u3cf import U3CF

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(ModelUnavailableError, match=r"checkpoints/resnet50-[0-9a-f]+\.pth.*wget https://"):
        U3CF(net={"backbone": "resnet50", "backbone_weights": "IMAGENET1K_V1"})
    with pytest.raises(ModelUnavailableError, match=r"resnet18-[0-9a-f]+\.pth"):
        SFDARegression(net={"backbone": "resnet18", "backbone_weights": "IMAGENET1K_V1"})
    with pytest.raises(ModelUnavailableError, match="no/such/file.pth does not exist"):
        resnet_weights_file("resnet18", "/no/such/file.pth")
    with pytest.raises(ValueError, match="no torchvision weights 'IMAGENET9K'"):
        resnet_weights_file("resnet18", "IMAGENET9K")
    assert resnet_weights_file("resnet18", None) is None
    import torchvision

    from litlab.lit_modules.domain.nets import ResNetFeatures

    full = torchvision.models.resnet18(weights=None)  # a local state-dict file (with its fc) loads
    path = tmp_path / "r18.pth"
    torch.save(full.state_dict(), path)
    assert torch.equal(ResNetFeatures("resnet18", str(path)).net.conv1.weight, full.conv1.weight)


@pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision does not import here")
def test_u3cf_fits_on_class_folders_with_an_untrained_resnet18(tmp_path, quiet_trainer):
    net = {"backbone": "resnet18", "backbone_weights": None, "feat_dim": 8, "latent": 4}
    trainer, module = _fit_u3cf(tmp_path, quiet_trainer, net)
    assert module.net.convs.out_dim == 512 and "val/acc_mean" in trainer.callback_metrics
