"""Discretised-density-guided source-free domain adaptation for regression ("ddg"), with its baselines.

Paper: "Discretized Density-Guided Source-Free Adaptation for Continuous Targets", ICML 2026 (poster 63709;
an earlier version is ICLR 2026 submission 12513 on OpenReview). Only the abstracts were readable: the
algorithm below is **reconstructed** from them and the prior work they combine: UCon-SFDA's instance-dependent
uncertainty control (Xu et al., ICLR 2025), TASFAR's binned label density (Pu et al., ICDE 2024, arXiv
2310.08119), NRC's feature-space neighbourhoods (Yang et al., arXiv 2110.04202) and RSD's dSprites regression
protocol (Chen et al., ICML 2021). Reconstructed choices are marked "reconstructed" below.

A regressor ``r(g(x)) = sigmoid(W_r z + b_r) ∈ [0, 1]^T`` and an auxiliary head ``a(z) ∈ R^{T×B}`` (logits over
B label bins per factor) are trained on the labelled source once per seed (``source.cached_source``); the
target is then adapted without source data. Random streams come from the run seed (``derive_seed``): the source
model from ``"source"``; the renders, the target's order and its weak views come from the DataModule.

Algorithm (per step, batch indices I; spec numbering of the reconstruction):
  1. two weak views x, x' of the batch; z, ŷ, ℓ = g(x), r(z), a(z); ŷ' = r(g(x')) without gradient
  2. bank update: Fb[I] ← normalise(z), Pb[I] ← ŷ                                   (no grad)
  3. neighbours N_K(i): top-K cosine similarities of normalise(z_i) to Fb, self excluded
  4. instance density h_i,t = (κ(ŷ_i,t) + κ(ŷ'_i,t) + Σ_{j∈N_K(i)} κ(Pb_j,t)) / (K + 2)   (Eq. h; detached)
  5. uncertainty u_i,t = H(h_i,t) / log B; confident m_i,t = 1[u_i,t ≤ τ_t], τ_t the q-quantile of u over
     the bank (bank entry + its K bank neighbours), recomputed at each epoch start        (reconstructed)
  6. refined target ỹ = windowed mode of h (window ±w bins); support [lo, hi] = bins with h ≥ ε = 0.5/B
  7. L = λ_reg Σ m (ŷ − ỹ)²/Σ m + λ_int Σ (1 − m) dist²(ŷ, [lo, hi])/Σ (1 − m)
       + λ_aux mean CE(h, softmax ℓ) + λ_cons mean |ŷ − ŷ'|²                       (reconstructed weights)
  8. one optimiser step on g and a; r stays frozen (SHOT's hypothesis transfer).

``method`` switches the baselines that share this code path, the data and the optimiser: ``source_only``
(eval mode, source BN statistics), ``adabn`` (BN statistics re-estimated on the target train split),
``knn_pl`` (MSE to the plain mean of the same K + 2 members: ddg without the binned windowed-mode target and
the confident/uncertain split), ``mean_teacher`` (EMA teacher, MSE between student and teacher predictions on
two independent views; the student is evaluated unless ``teacher_eval=teacher``: the spec leaves it open, and
after 6 short epochs an EMA 0.99 teacher still carries about half of the source weights) and ``ddg`` (this
method).

Arguments come in groups (``config_part``): ``net`` (g's backbone and width), ``density`` (steps 3-6: bins,
neighbours, quantile, window), ``objective`` (step 7's weights and variants), ``baselines`` (kNN-mean's and mean
teacher's options); the source stage's aux weight and the optimiser stay flat.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.regression import MeanAbsoluteError

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.domain import binning
from litlab.lit_modules.domain.banks import IndexedBank
from litlab.lit_modules.domain.baselines import adabn_pass, ema_update, knn_mean_target
from litlab.lit_modules.domain.contract import SourceFreeData, check_data
from litlab.lit_modules.domain.nets import ConvFeatures, ResNetFeatures, resnet_weights_file
from litlab.lit_modules.domain.source import SourceRecipe, cached_source

SOURCE_RECIPE = SourceRecipe()
Method = Literal["source_only", "adabn", "knn_pl", "mean_teacher", "ddg"]


@config_part
class RegressorNetConfig:
    """g: the toy's conv net (``backbone="small"``) or a torchvision ResNet by name with ``backbone_weights``
    (``"IMAGENET1K_V1"`` or a local state-dict file) + Linear/BN/ReLU, to ``feat_dim`` features."""

    backbone: str = "small"
    backbone_weights: str | None = None
    feat_dim: int = 128


@config_part
class DensityTarget:
    """Steps 3-6: ``num_bins`` B of the label density, soft-bin width ``sigma`` (None: 1/B), ``k`` feature-space
    neighbours, the confidence ``quantile`` q of τ, the windowed mode's half-width ``window``; ``refine="mean"``
    replaces the windowed mode by the density's mean (an ablation)."""

    num_bins: int = 20
    sigma: float | None = None
    k: int = 10
    quantile: float = 0.7
    window: int = 1
    refine: Literal["mode", "mean"] = "mode"


@config_part
class DDGObjective:
    """Step 7: weights λ_reg (confident: to ỹ), λ_int (uncertain: to the support interval), λ_aux (the auxiliary
    head to h), λ_cons (the two views agree); ``selection="all"`` trains every sample on ỹ weighted by 1 − u, and
    ``weighting="one_minus_u"`` weighs the confident ones so (ablations)."""

    lambda_reg: float = 1.0
    lambda_int: float = 0.5
    lambda_aux: float = 0.0
    lambda_cons: float = 0.0
    selection: Literal["split", "all"] = "split"
    weighting: Literal["none", "one_minus_u"] = "none"


@config_part
class BaselineOptions:
    """The baselines' own options: kNN-mean's ``knn_weighting`` (1 − u of the same density), mean teacher's
    ``ema_decay`` and which of its nets is evaluated (``teacher_eval``)."""

    knn_weighting: Literal["none", "one_minus_u"] = "none"
    ema_decay: float = 0.99
    teacher_eval: Literal["student", "teacher"] = "student"


NET = RegressorNetConfig()
DENSITY = DensityTarget()
OBJECTIVE = DDGObjective()
BASELINES = BaselineOptions()


class RegressorNet(nn.Module):
    """g (features z), r (frozen-able regressor with sigmoid outputs), a (auxiliary bin logits, T×B)."""

    def __init__(self, num_outputs: int, num_bins: int, config: RegressorNetConfig):
        super().__init__()
        feat_dim = config.feat_dim
        if config.backbone == "small":
            self.g = ConvFeatures(3, (16, 32, 32), (2, 2, 2), 32, feat_dim)
        else:
            res = ResNetFeatures(config.backbone, config.backbone_weights)
            self.g = nn.Sequential(
                res, nn.Linear(res.out_dim, feat_dim), nn.BatchNorm1d(feat_dim), nn.ReLU(inplace=True)
            )
        self.r = nn.Linear(feat_dim, num_outputs)
        self.a = nn.Linear(feat_dim, num_outputs * num_bins)
        self.num_outputs, self.num_bins = num_outputs, num_bins

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        z = self.g(x)
        return z, torch.sigmoid(self.r(z)), self.a(z).view(len(x), self.num_outputs, self.num_bins)


def density_targets(members: Tensor, num_bins: int, sigma: float, window: int, refine: str = "mode"):
    """Steps 4-6 for (b, n, T) member predictions: the density h (b, T, B), its normalised entropy u (b, T),
    the refined target ỹ (b, T) and the support interval (lo, hi) (b, T each)."""
    h = binning.histogram(members.transpose(1, 2), num_bins, sigma, dim=-1)  # (b, T, B)
    u = binning.normalised_entropy(h)
    y_ref = binning.windowed_mode(h, window) if refine == "mode" else binning.expected_value(h)
    lo, hi = binning.support_interval(h)
    return h, u, y_ref, lo, hi


def ddg_losses(
    pred: Tensor,
    aux_logits: Tensor,
    h: Tensor,
    u: Tensor,
    y_ref: Tensor,
    lo: Tensor,
    hi: Tensor,
    tau: Tensor,
    selection: str = "split",
    weighting: str = "none",
) -> dict[str, Tensor]:
    """Step 7's losses; each is normalised by the number of (i, t) pairs it covers."""
    if selection == "all":
        m = torch.ones_like(u)
        w = (1 - u) / (1 - u).mean().clamp_min(1e-8)
    else:
        m = (u <= tau).to(pred.dtype)
        w = torch.ones_like(u)
        if weighting == "one_minus_u":
            conf_mean = ((1 - u) * m).sum() / m.sum().clamp_min(1.0)
            w = (1 - u) / conf_mean.clamp_min(1e-8)
    l_reg = (m * w * (pred - y_ref) ** 2).sum() / m.sum().clamp_min(1.0)
    unc = 1 - m
    l_int = (unc * binning.interval_loss(pred, lo, hi)).sum() / unc.sum().clamp_min(1.0)
    l_aux = -(h * F.log_softmax(aux_logits, dim=-1)).sum(-1).mean()
    return {"reg": l_reg, "int": l_int, "aux": l_aux, "confident": m.mean()}


class SFDARegression(L.LightningModule):
    """Source-free regression adaptation; see the module docstring. The source stage runs (or loads from the
    cache) in ``setup``; the bank is filled and AdaBN's pass made once at the start of training; τ is
    recomputed at the start of every epoch. Logs ``val/mae_<factor>`` and ``val/mae_sum`` (torchmetrics MAE on
    the target test split), ``adapt/regressor_drift`` (max |r − r_source|, 0 when frozen) and
    ``adapt/bank_confident_frac`` (fraction of bank (i, t) pairs with u ≤ τ at the last epoch start)."""

    def __init__(
        self,
        method: Method = "ddg",
        source_stage: SourceRecipe = SOURCE_RECIPE,
        lambda_src_aux: float = 1.0,
        net: RegressorNetConfig = NET,
        density: DensityTarget = DENSITY,
        objective: DDGObjective = OBJECTIVE,
        baselines: BaselineOptions = BASELINES,
        freeze_regressor: bool = True,
        lr: float = 1e-4,
        backbone_lr_mult: float = 1.0,
    ):
        super().__init__()
        self.save_hyperparameters()
        if method not in Method.__args__:
            raise ValueError(f"unknown method {method!r}; expected one of {Method.__args__}")
        self.method = method
        self.source_stage = as_config(SourceRecipe, source_stage, "SFDARegression.source_stage")
        self.net_config = as_config(RegressorNetConfig, net, "SFDARegression.net")
        self.density = as_config(DensityTarget, density, "SFDARegression.density")
        self.objective = as_config(DDGObjective, objective, "SFDARegression.objective")
        self.baselines = as_config(BaselineOptions, baselines, "SFDARegression.baselines")
        if not 0 < self.density.quantile <= 1:
            raise ValueError(f"density.quantile must be in (0, 1], got {self.density.quantile}")
        if self.net_config.backbone != "small":  # fail at once, before any data is read
            resnet_weights_file(self.net_config.backbone, self.net_config.backbone_weights)
        d = self.density
        self.sigma = 1.0 / d.num_bins if d.sigma is None else d.sigma
        self.net: RegressorNet | None = None

    # ---- the source stage (once per run seed's "source" stream, cached) ---------------------------------------
    def _source_loss(self, net: RegressorNet, x: Tensor, y: Tensor) -> Tensor:
        """L_src = MSE(r(g(x)), y) + λ_src_aux Σ_t CE(κ(y_t), softmax(a_t(g(x))))   (spec §3.2)"""
        _, pred, logits = net(x)
        target = binning.soft_bin(y, self.density.num_bins, self.sigma)  # (b, T, B)
        ce = -(target * F.log_softmax(logits, -1)).sum(-1).mean(0).sum()
        return F.mse_loss(pred, y) + self.hparams.lambda_src_aux * ce

    def setup(self, stage: str) -> None:
        if self.net is not None:
            return
        dm = self.trainer.datamodule
        check_data(dm, SourceFreeData, f"{type(self).__name__}")
        n, bins = self.net_config, self.density.num_bins
        T = dm.num_outputs
        key = {
            "kind": "sfda_regressor",
            "T": T,
            "bins": bins,
            "sigma": self.sigma,
            "backbone": n.backbone,
            "weights": n.backbone_weights,
            "feat_dim": n.feat_dim,
            "lambda_src_aux": self.hparams.lambda_src_aux,
        }

        def build():
            return RegressorNet(T, bins, n)

        self.net = cached_source(
            "domain_source", key, derive_seed("source"), build, self._source_loss, dm, self.source_stage
        )
        self._r_source = {k: v.detach().clone() for k, v in self.net.r.state_dict().items()}
        for p in self.net.r.parameters():
            p.requires_grad_(not self.hparams.freeze_regressor)
        self.bank = IndexedBank(dm.target_size(), n.feat_dim, T)
        self.register_buffer("tau", torch.ones(T))
        self.register_buffer("tau_epoch", torch.tensor(-1))
        self.register_buffer("bank_conf_frac", torch.tensor(float("nan")))
        self.register_buffer("prepared", torch.tensor(False))
        self.teacher = copy.deepcopy(self.net) if self.method == "mean_teacher" else None
        if self.teacher is not None:
            self.teacher.requires_grad_(False)
        self.val_mae = MeanAbsoluteError(num_outputs=T)
        self.factor_names = list(dm.factor_names)

    def configure_optimizers(self):
        h = self.hparams
        backbone = [p for n, p in self.net.named_parameters() if p.requires_grad and n.startswith("g.")]
        heads = [p for n, p in self.net.named_parameters() if p.requires_grad and not n.startswith("g.")]
        return torch.optim.Adam(
            [{"params": backbone, "lr": h.lr * h.backbone_lr_mult}, {"params": heads, "lr": h.lr}], lr=h.lr
        )

    # ---- adaptation state ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def fill_bank(self, loader) -> None:
        """Fb, Pb ← one pass over the target training images (train mode for BN, no grad) (spec §3.3)."""
        was = self.net.training
        self.net.train()
        for x, idx in loader:
            z, pred, _ = self.net(x.to(self.device))
            self.bank.update(idx.to(self.device), z, pred)
        self.bank.filled.fill_(True)
        self.net.train(was)

    @torch.no_grad()
    def bank_threshold(self) -> tuple[Tensor, Tensor]:
        """τ_t = the q-quantile of u over bank entries (members: the entry and its K bank neighbours) (step 5);
        returns (τ, u) with u of shape (N, T)."""
        d = self.density
        nb = self.bank.all_neighbours(d.k)
        members = torch.cat([self.bank.pred[:, None], self.bank.pred[nb]], dim=1)  # (N, K+1, T)
        _, u, _, _, _ = density_targets(members, d.num_bins, self.sigma, d.window, d.refine)
        tau = torch.quantile(u, d.quantile, dim=0, interpolation="higher")
        return tau, u

    def on_train_start(self) -> None:
        if bool(self.prepared):  # resumed: the bank, BN statistics and τ came with the checkpoint
            return
        dm = self.trainer.datamodule
        if self.method == "adabn":
            adabn_pass(self.net.g, self.net.g, dm.target_plain_loader())
        elif self.method in ("knn_pl", "ddg"):
            self.fill_bank(dm.target_plain_loader())
        if self.teacher is not None:
            self.teacher.load_state_dict(self.net.state_dict())
        self.prepared.fill_(True)

    def on_train_epoch_start(self) -> None:
        if self.method != "ddg" or int(self.tau_epoch) == self.current_epoch:
            return  # τ of this epoch already computed (a run resumed mid-epoch keeps it)
        tau, u = self.bank_threshold()
        self.tau.copy_(tau)
        self.tau_epoch.fill_(self.current_epoch)
        self.bank_conf_frac.fill_(float((u <= tau).float().mean()))

    # ---- one step ------------------------------------------------------------------------------------------------
    def members(self, z: Tensor, pred: Tensor, pred2: Tensor, idx: Tensor) -> Tensor:
        """Steps 2-3: bank update, then (b, K + 2, T) member predictions {ŷ, ŷ', Pb[N_K]}."""
        self.bank.update(idx, z, pred)
        nb = self.bank.neighbours(z, self.density.k, idx)
        return torch.cat([pred.detach()[:, None], pred2[:, None], self.bank.pred[nb]], dim=1)

    def training_step(self, batch, batch_idx):
        d, o = self.density, self.objective
        x1, x2, idx = batch
        if self.method in ("source_only", "adabn"):
            return None  # nothing is trained
        z, pred, logits = self.net(x1)  # step 1
        if self.method == "mean_teacher":
            with torch.no_grad():
                self.teacher.eval()
                t_pred = self.teacher(x2)[1]
            loss = F.mse_loss(pred, t_pred)
            self.log("train/loss", loss, prog_bar=True)
            return loss
        with torch.no_grad():
            pred2 = self.net(x2)[1]
        members = self.members(z, pred, pred2, idx)  # steps 2-3
        if self.method == "knn_pl":
            target = knn_mean_target(members)
            if self.baselines.knn_weighting == "one_minus_u":
                _, u, _, _, _ = density_targets(members, d.num_bins, self.sigma, d.window)
                w = (1 - u) / (1 - u).mean().clamp_min(1e-8)
            else:
                w = torch.ones_like(target)
            loss = (w * (pred - target) ** 2).mean()
            self.log("train/loss", loss, prog_bar=True)
            return loss
        hist, u, y_ref, lo, hi = density_targets(members, d.num_bins, self.sigma, d.window, d.refine)  # 4-6
        parts = ddg_losses(pred, logits, hist, u, y_ref, lo, hi, self.tau, o.selection, o.weighting)  # 7
        loss = o.lambda_reg * parts["reg"] + o.lambda_int * parts["int"] + o.lambda_aux * parts["aux"]
        if o.lambda_cons:
            loss = loss + o.lambda_cons * ((pred - pred2) ** 2).mean()
        self.log_dict({f"train/l_{k}": v for k, v in parts.items() if k != "confident"})
        self.log("train/confident_frac", parts["confident"])
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.teacher is not None:
            ema_update(self.teacher, self.net, self.baselines.ema_decay)

    # ---- evaluation ----------------------------------------------------------------------------------------------
    def predict_net(self) -> RegressorNet:
        """The evaluated net: mean teacher's EMA teacher with ``teacher_eval=teacher``, else the adapted net."""
        use_teacher = self.teacher is not None and self.baselines.teacher_eval == "teacher"
        return self.teacher if use_teacher else self.net

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_mae.update(self.predict_net()(x)[1], y)

    def regressor_drift(self) -> float:
        cur = self.net.r.state_dict()
        return max(float((cur[k].cpu() - v.cpu()).abs().max()) for k, v in self._r_source.items())

    def on_validation_epoch_end(self) -> None:
        per = self.val_mae.compute()
        self.val_mae.reset()
        for name, v in zip(self.factor_names, per):
            self.log(f"val/mae_{name}", v)
        self.log("val/mae_sum", per.sum(), prog_bar=True)
        self.log("adapt/regressor_drift", self.regressor_drift())
        if self.method == "ddg":
            self.log("adapt/bank_confident_frac", self.bank_conf_frac)

    def test_step(self, batch, batch_idx):
        self.validation_step(batch, batch_idx)

    def on_test_epoch_end(self) -> None:
        per = self.val_mae.compute()
        self.val_mae.reset()
        self.log("test/mae_sum", per.sum())


@torch.no_grad()
def run_features(run_dir) -> tuple[Tensor, Tensor, list[str], None, None]:
    """Features z = g(x) (eval mode) of the source images and the target's unlabelled training images of an
    SFDA-regression run, from its checkpoint (domain 0 the source, 1 the target); the DataModule is rebuilt
    from the checkpoint under the run's seed."""
    from litlab.lit_modules.domain.contract import RegressionDomainsDataModule
    from litlab.lit_modules.domain.report import datamodule_from_checkpoint, run_checkpoint, sub_state

    ckpt = run_checkpoint(run_dir)
    dm = datamodule_from_checkpoint(ckpt, RegressionDomainsDataModule, run_dir)
    check_data(dm, SourceFreeData, "sfda_regression.run_features")
    hp = ckpt["hyper_parameters"]
    # the checkpoint holds the backbone's weights: nothing to read from a weights file
    config = dataclasses.replace(as_config(RegressorNetConfig, hp.get("net")), backbone_weights=None)
    net = RegressorNet(dm.num_outputs, as_config(DensityTarget, hp.get("density")).num_bins, config)
    net.load_state_dict(sub_state(ckpt["state_dict"], "net."))
    net.eval()
    loaders = [dm.source_train_loader(512, shuffle=False), dm.target_plain_loader(batch_size=512)]
    feats = [torch.cat([net.g(x) for x, _ in loader]) for loader in loaders]
    dom = torch.cat([torch.full((len(f),), i) for i, f in enumerate(feats)])
    return torch.cat(feats), dom, [f"source {dm.source_domain}", f"target {dm.target}"], None, None


def report(result, out_dir):
    """``report_hook`` of seeds/sfda_regression.yaml: per-factor MAE bars and table of every run measured, and
    the PCA of source and target features at the card's first seed, before adaptation (the positive control's
    floor) and after it (the headline method, the runs its claims compare it with, its unclaimed ablations)."""
    from litlab.lit_modules.domain.report import (
        card_design,
        feature_panels,
        feature_report,
        merge_extras,
        per_target_keys,
        per_target_report,
    )

    roles, claims = card_design(result)
    keys = per_target_keys(result, "val/mae_", exclude=(result.metric_name,))
    return merge_extras(
        per_target_report(result, out_dir, result.slug, list(result.runs), keys, "MAE per factor"),
        feature_report(result, out_dir, result.slug, feature_panels(roles, claims), run_features),
    )
