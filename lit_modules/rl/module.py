"""``RLModule``: what the family's LightningModules share — the datamodule read through the ``RLData``
contract (checked once in ``setup``) and networks built once for the env's dimensions."""

from __future__ import annotations

import lightning as L
import torch

from litlab.lit_modules.rl.contract import RLData, check_rl_data


class RLModule(L.LightningModule):
    """Subclasses implement ``build(obs_dim, act_dim)`` (which sets ``self.dims``) and call it from
    ``__init__`` when both dims are given; otherwise ``setup`` builds for the datamodule's env."""

    needs_offline: bool = True  # the module samples the offline data set
    dims: tuple[int, int] | None = None  # (obs_dim, act_dim) once the networks are built

    def build(self, obs_dim: int, act_dim: int) -> None:
        raise NotImplementedError

    @property
    def data(self) -> RLData:
        return self.trainer.datamodule

    def setup(self, stage: str) -> None:
        name = type(self).__name__
        dm = check_rl_data(self.trainer.datamodule, needs_offline=self.needs_offline, user=name)
        if self.dims is None:
            self.build(dm.obs_dim, dm.act_dim)
        elif self.dims != (dm.obs_dim, dm.act_dim):
            raise ValueError(
                f"{name} was built for (obs_dim, act_dim) = {self.dims}; the datamodule's {dm.env_id} has "
                f"{(dm.obs_dim, dm.act_dim)}"
            )


def adam(params, lr: float) -> torch.optim.Adam:
    """Adam with its fused kernel (one per step on CPU and CUDA): the same update rule at about a fifth of the
    default per-tensor loop's cost for these nets' dozens of small tensors (0.15 vs 0.71 ms per step of a
    2×64 twin critic on one CPU thread)."""
    return torch.optim.Adam(params, lr=lr, fused=True)
