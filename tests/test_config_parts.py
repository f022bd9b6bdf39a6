"""Config parts (``lit_modules/core/config.py``) as LightningCLI builds them: a dotted ``=null`` override of a
``str | None`` field is None in the module, as the mapping form is (jsonargparse 4.53 hands the dotted one over as
the string 'None': ``--model.init_args.net.backbone_weights=null``, the domain full configs' random-init switch,
stopped with "resnet50 has no torchvision weights 'None'")."""

from __future__ import annotations

import sys
from pathlib import Path

from litlab.datamodules.rl import OfflineData
from litlab.lit_modules.core.config import as_config
from litlab.lit_modules.domain.u3cf import U3CFNet

ROOT = Path(__file__).resolve().parents[1]


def test_a_dotted_null_override_of_an_optional_string_field_is_none(tmp_path, monkeypatch):
    from litlab.cli import LitlabCLI

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # LightningCLI warns when pytest's arguments are there too
    config = f"--config={ROOT / 'configs' / 'dare' / 'quick.yaml'}"
    for override in ("--data.init_args.offline.level=null", "--data.init_args.offline={level: null}"):
        cli = LitlabCLI(args=[config, override, f"--runs_dir={tmp_path}"], run=False)
        assert cli.datamodule.offline_data.level is None, override
        assert cli.datamodule.data_file is None  # an online-only run: no offline file is looked for
    assert as_config(OfflineData, {"path": "None"}).path is None
    assert as_config(U3CFNet, U3CFNet(backbone_weights="None")).backbone_weights is None
    assert as_config(U3CFNet, {"backbone": "None"}).backbone == "None"  # a plain str field keeps the string
