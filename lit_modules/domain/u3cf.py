"""U³CF: Unbiased, Unconfounding and Unified Causal Framework for multi-target domain adaptation.

Paper: "U³CF: Unbiased, Unconfounding and Unified Causal Framework for Multi-Target Domain Adaptation", Wenxu
Wang, Yeqiang Liu, Rui Zhou, Jing Wang, Zhenbo Li, Wenbo Gong, ICML 2026 (poster 63557; only the abstract
was readable). The training loop follows the first author's public precursor code (FDUC), built on D-CGCT
(Roy et al., "Curriculum Graph Co-Teaching for Multi-Target Domain Adaptation", CVPR 2021, arXiv 2104.00808).
Parts the public code does not hold are **reconstructed** and marked below.

Algorithm (stages as in the precursor's trainer):
  1. source pre-training: CE(fc(F(x)), y) on the labelled source (trained once per run seed's ``"source"``
     stream and cached, ``source.cached_source``); the memory M is filled with F(x) of every source sample,
     domain 0.
  2. domain-aware curriculum, once per target (§3.3):
     a. pick the remaining target with the largest mean max-softmax of fc(F(x)) (eval mode)
     b. ``curriculum.iters_per_target`` steps: h_s = F(x_s), h_t = F(x_t) in two passes (each batch under its own
        BatchNorm statistics, as the precursor's trainer); L = CE(fc(h_s), y_s) + λ_adv · CE(cos(h_t, μ)/τ, ŷ_t),
        with (h_s, y_s, d_s)
        appended to the FIFO memory M every step and μ = class means of M recomputed every step;
        ŷ_t = argmax fc(h_t) (``graph.use_gnn=false``, the toy's default, as the spec's prototype); with D-CGCT's
        graph head G (``graph.use_gnn=true``, ``graph.ClassifierGNN`` over the batch of b_s + b_t nodes) ŷ_t = argmax
        G(h)_t and L += λ_node CE(G(h)_s, y_s) + λ_edge BCE(A, 1[y_i = y_j]) over the pairs of source and
        confident (max softmax fc > ``curriculum.thr``) target nodes; the target choice and the upgrade use G's probabilities
     c. pseudo-source upgrade: every sample of the adapted target with max softmax > thr joins the
        pseudo-source set with its pseudo-label and domain index m
  3. causal stage (``method=u3cf``; §3.4, the network is **reconstructed**: the precursor's network file is not
     public): z_c, z_d ~ q(·|h) (two Gaussian encoders), ĥ = R([z_c; z_d]); confounder prototypes C_d = per-
     domain means of a FIFO bank of z_d, refreshed every step; backdoor adjustment
        log P(y | do(x)) = logsumexp_d log softmax(fc(R([z_c; C_d]))) − log D                       (Eq. BA)
     and L = λ_mlp NLL(log P(y|do(x)), y) + λ_klg·anneal·(KL(q(z_c)‖N) + KL(q(z_d)‖N))
             + λ_ce (CE(c1(z_c), y) + CE(c2(z_d), d)) + λ_kl (KL(c2(z_c)‖U_D) + KL(c1(z_d)‖U_C)) + λ_res MSE(ĥ, h)
     (the MI criterion: keep class information in z_c and domain information in z_d, remove the cross terms;
     the weights are reconstructed). ``method=prototype_only`` replaces the causal stage by a plain CE
     fine-tune on the pseudo-source set (D-CGCT-style).
  Inference: argmax log P(y | do(x)) with the encoders' means (u3cf), argmax fc(F(x)) otherwise.

Baselines in the same module: ``source_only`` (stage 1 only) and ``shot`` (Liang et al., arXiv 2002.08546, on
the blended targets: frozen fc, entropy − diversity + β·CE to weighted-centroid pseudo-labels refreshed every
``shot.refresh`` iterations).

Backbone F: the toy's small conv net (``net.backbone="small"``), or at full scale a torchvision ResNet by name
(``net.backbone="resnet50"`` / ``"resnet101"``, ``net.backbone_weights="IMAGENET1K_V1"`` or a local state-dict
file), checked when the module is built: without torchvision or the weights file it fails at once naming them.

Arguments come in groups (``config_part``): ``net`` (F, the bottleneck, the latents), ``curriculum`` (stage 2),
``causal`` (stage 3), ``graph`` (D-CGCT's graph head), ``shot`` (the SHOT baseline); the optimiser's ``lr``,
``momentum`` and ``weight_decay`` stay flat. Random streams come from the run seed (``derive_seed``): the cached
source model ``"source"``, the causal head's initialisation ``"init"``, each step's batches and noise
``"batches"``; the digits themselves come from the DataModule's ``"data"``.

With ``graph.use_gnn=true`` G is trained in the source stage too (CE + λ_node CE(G) + λ_edge BCE), prototype-only's
fine-tune adds the same terms, and the causal stage adds the graph branch of the adjustment (G on each
h^{do(d)}, log-mean-exp over d: λ_node NLL + λ_edge BCE of the d-averaged edges). G's accuracy is logged as
``val/acc_gnn_*`` (one graph per evaluation batch of 512 images, transductive) beside the MLP's ``val/acc_*``,
which stays the card's metric; neither is picked with target labels.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.domain.baselines import shot_losses
from litlab.lit_modules.domain.contract import MultiTargetData, check_data
from litlab.lit_modules.domain.graph import ClassifierGNN, edge_loss
from litlab.lit_modules.domain.nets import ConvFeatures, ResNetFeatures, resnet_weights_file
from litlab.lit_modules.domain.prototypes import FIFOMemory, class_means, prototype_contrastive_loss
from litlab.lit_modules.domain.source import SourceRecipe, cached_source

Method = Literal["source_only", "shot", "prototype_only", "u3cf"]
SOURCE_RECIPE = SourceRecipe(optimizer="sgd", lr=0.01, weight_decay=5e-4, iters=600, batch_size=32)


@config_part
class U3CFNet:
    """F -> bottleneck (width ``feat_dim``) -> fc, and the causal latents z_c, z_d (width ``latent``):
    ``backbone="small"`` is the toy's conv net with ``channels`` (strides 1/2/2), else a torchvision ResNet by
    name with ``backbone_weights`` (``"IMAGENET1K_V1"`` or a local state-dict file)."""

    backbone: str = "small"
    backbone_weights: str | None = None
    channels: tuple[int, ...] = (32, 64, 64)
    feat_dim: int = 64
    latent: int = 64


@config_part
class Curriculum:
    """Stage 2 (§3.3), once per target: ``iters_per_target`` steps on ``batch_source`` pseudo-source +
    ``batch_target`` target images; the prototype-contrastive term's temperature ``tau`` and weight
    ``lambda_adv``; ``thr``, the confidence above which a target sample joins the pseudo-source."""

    iters_per_target: int = 400
    batch_source: int = 32
    batch_target: int = 32
    thr: float = 0.7
    tau: float = 1.0
    lambda_adv: float = 1.0


@config_part
class CausalStage:
    """Stage 3 (§3.4): ``iters`` steps on pseudo-source batches of ``batch_size`` (prototype-only's CE fine-tune
    uses the same schedule); the loss weights λ_mlp (the backdoor NLL), λ_ce, λ_kl (the MI term), λ_res and
    λ_klg (the latents' KL, annealed in over ``kl_anneal_steps``)."""

    iters: int = 600
    batch_size: int = 64
    lambda_mlp: float = 1.0
    lambda_ce: float = 1.0
    lambda_kl: float = 1.0
    lambda_res: float = 1.0
    lambda_klg: float = 0.01
    kl_anneal_steps: int = 300


@config_part
class GraphHead:
    """D-CGCT's graph head G (``use_gnn``): ``edge_features`` of its edge network, weights ``lambda_node`` (G's
    node CE) and ``lambda_edge`` (the edge BCE) in every stage."""

    use_gnn: bool = False
    edge_features: int = 128
    lambda_node: float = 0.3
    lambda_edge: float = 1.0


@config_part
class ShotBaseline:
    """SHOT (``method=shot``): ``iters`` steps on blended-target batches of ``batch_size``; ``beta`` weighs the CE
    to the centroid pseudo-labels, refreshed every ``refresh`` steps."""

    iters: int = 600
    batch_size: int = 64
    beta: float = 0.3
    refresh: int = 100


NET = U3CFNet()
CURRICULUM = Curriculum()
CAUSAL_STAGE = CausalStage()
GRAPH_HEAD = GraphHead()
SHOT = ShotBaseline()


# ---- the causal stage's pieces (pure functions and a small module) -----------------------------------------------
def intervened(decoder: nn.Module, z_c: Tensor, conf_protos: Tensor) -> Tensor:
    """h^{do(d)} = R([z_c; C_d]) for every domain d: (D, B, feat)."""
    D, B = len(conf_protos), len(z_c)
    zc = z_c[None].expand(D, B, -1)
    cd = conf_protos[:, None].expand(D, B, -1)
    return decoder(torch.cat([zc, cd], -1))


def backdoor_log_prob(fc: nn.Module, decoder: nn.Module, z_c: Tensor, conf_protos: Tensor) -> Tensor:
    """log P(y | do(x)) = logsumexp_d log softmax(fc(R([z_c; C_d]))) − log D, uniform P(d) (Eq. BA)."""
    logp = F.log_softmax(fc(intervened(decoder, z_c, conf_protos)), dim=-1)  # (D, B, C)
    return torch.logsumexp(logp, dim=0) - math.log(len(conf_protos))


def backdoor_gnn(gnn: nn.Module, h_do: Tensor) -> tuple[Tensor, Tensor]:
    """The graph branch of the adjustment (spec §3.4): G on each slice h^{do(d)} (B nodes), the log-mean-exp of
    its log-softmaxes over d, and the edge similarities averaged over d: ((B, C), (B, B))."""
    outs = [gnn(h) for h in h_do]
    logp = torch.stack([F.log_softmax(o[0], -1) for o in outs])
    return torch.logsumexp(logp, 0) - math.log(len(h_do)), torch.stack([o[1] for o in outs]).mean(0)


def uniform_kl(logits: Tensor) -> Tensor:
    """KL(softmax(logits) ‖ U_K) with ``nn.KLDivLoss(reduction='mean')`` semantics (mean over every element):
    0 iff the prediction is uniform, log K / K for a one-hot prediction."""
    K = logits.shape[-1]
    log_u = torch.full_like(logits, -math.log(K))
    return F.kl_div(log_u, F.softmax(logits, -1), reduction="mean")


def mi_loss(c2_of_zc: Tensor, c1_of_zd: Tensor) -> Tensor:
    """L_mi = KL(c2(z_c) ‖ U_D) + KL(c1(z_d) ‖ U_C): z_c should not predict the domain, z_d not the class."""
    return uniform_kl(c2_of_zc) + uniform_kl(c1_of_zd)


def kl_std_normal(mu: Tensor, logvar: Tensor) -> Tensor:
    """−½ · mean(1 + log σ² − μ² − σ²) (mean over batch and dimensions, as the precursor code)."""
    return -0.5 * torch.mean(1 + logvar - mu**2 - logvar.exp())


class CausalHead(nn.Module):
    """E_c, E_d: Linear(d, 2·k) -> (μ, log σ²); decoder R: Linear(2k, d); c1: Linear(k, C); c2: Linear(k, D)
    (reconstructed shapes)."""

    def __init__(self, feat_dim: int, latent: int, num_classes: int, num_domains: int):
        super().__init__()
        self.enc_c = nn.Linear(feat_dim, 2 * latent)
        self.enc_d = nn.Linear(feat_dim, 2 * latent)
        self.dec = nn.Linear(2 * latent, feat_dim)
        self.c1 = nn.Linear(latent, num_classes)
        self.c2 = nn.Linear(latent, num_domains)

    def encode(self, h: Tensor, noise: tuple[Tensor, Tensor] | None):
        mu1, lv1 = self.enc_c(h).chunk(2, -1)
        mu2, lv2 = self.enc_d(h).chunk(2, -1)
        if noise is None:
            return mu1, mu2, (mu1, lv1, mu2, lv2)
        z_c = mu1 + (0.5 * lv1).exp() * noise[0]
        z_d = mu2 + (0.5 * lv2).exp() * noise[1]
        return z_c, z_d, (mu1, lv1, mu2, lv2)


class Classifier(nn.Module):
    """F = conv blocks -> pool (``backbone="small"``, the toy) or a torchvision ResNet's global-pool features
    (``backbone="resnet50"`` ..., ``weights`` as ``nets.resnet_weights_file`` finds them) -> bottleneck Linear
    (Xavier-normal, zero bias); fc: Linear(d, C)."""

    def __init__(
        self,
        channels: tuple[int, ...],
        feat_dim: int,
        num_classes: int,
        backbone: str = "small",
        weights: str | None = None,
        gnn_edge_features: int = 0,
    ):
        super().__init__()
        if backbone == "small":
            self.convs = ConvFeatures(3, channels, (1, 2, 2), 16, pool=2)
        else:
            self.convs = ResNetFeatures(backbone, weights)
        self.bottleneck = nn.Linear(self.convs.out_dim, feat_dim)
        nn.init.xavier_normal_(self.bottleneck.weight)
        nn.init.zeros_(self.bottleneck.bias)
        self.fc = nn.Linear(feat_dim, num_classes)
        # D-CGCT's graph head G (graph.ClassifierGNN), built last so the toy's other weights are drawn as before
        self.gnn = ClassifierGNN(feat_dim, gnn_edge_features, num_classes) if gnn_edge_features else None

    def features(self, x: Tensor) -> Tensor:
        return self.bottleneck(self.convs(x))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.features(x))


def build_classifier(net: U3CFNet, graph: GraphHead, num_classes: int) -> Classifier:
    """The network of a U3CF module with these groups (its own, or a checkpoint's)."""
    return Classifier(
        tuple(net.channels),
        net.feat_dim,
        num_classes,
        net.backbone,
        net.backbone_weights,
        graph.edge_features if graph.use_gnn else 0,
    )


class U3CF(L.LightningModule):
    """See the module docstring. Iteration-bounded: the DataModule yields ``total_steps()`` step indices in one
    epoch (it asks the module), then the targets are evaluated transductively.

    Logs ``val/acc_mean`` (mean of the per-target accuracies), ``val/acc_<target>``, ``curriculum/order_ok``
    (1 when the chosen order is a permutation of the targets), ``curriculum/pseudo_source_ok`` (1 when every
    pseudo-source sample had confidence > thr when it was added and carries its target's domain index) and
    ``curriculum/pseudo_source_size``."""

    def __init__(
        self,
        method: Method = "u3cf",
        source_stage: SourceRecipe = SOURCE_RECIPE,
        net: U3CFNet = NET,
        curriculum: Curriculum = CURRICULUM,
        causal: CausalStage = CAUSAL_STAGE,
        graph: GraphHead = GRAPH_HEAD,
        shot: ShotBaseline = SHOT,
        lr: float = 0.005,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
    ):
        super().__init__()
        self.save_hyperparameters()
        if method not in Method.__args__:
            raise ValueError(f"unknown method {method!r}; expected one of {Method.__args__}")
        self.method = method
        self.source_stage = as_config(SourceRecipe, source_stage, "U3CF.source_stage")
        self.net_config = as_config(U3CFNet, net, "U3CF.net")
        self.curriculum = as_config(Curriculum, curriculum, "U3CF.curriculum")
        self.causal_stage = as_config(CausalStage, causal, "U3CF.causal")
        self.graph = as_config(GraphHead, graph, "U3CF.graph")
        self.shot = as_config(ShotBaseline, shot, "U3CF.shot")
        if self.graph.use_gnn and method == "shot":
            raise ValueError(
                "graph.use_gnn=true applies to source_only / prototype_only / u3cf; SHOT has no graph head"
            )
        if self.net_config.backbone != "small":  # fail at once, before any data is read
            resnet_weights_file(self.net_config.backbone, self.net_config.backbone_weights)
        self.automatic_optimization = False
        self.net: Classifier | None = None

    # ---- setup: source stage, buffers --------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if self.net is not None:
            return
        dm = self.trainer.datamodule
        check_data(dm, MultiTargetData, type(self).__name__)
        n, g = self.net_config, self.graph
        C, M = dm.num_outputs, len(dm.target_domains)
        self.num_targets, self.num_classes = M, C
        key = {"kind": "u3cf_classifier", "channels": list(n.channels), "feat_dim": n.feat_dim, "C": C}
        if n.backbone != "small":  # the toy's key stays without these
            key |= {"backbone": n.backbone, "weights": n.backbone_weights}
        if g.use_gnn:  # the graph head is trained in the source stage too (spec §3.2)
            key |= {"gnn": {"E": g.edge_features, "lambda_node": g.lambda_node, "lambda_edge": g.lambda_edge}}

        def build():
            return build_classifier(n, g, C)

        def loss(net, x, y):
            if net.gnn is None:
                return F.cross_entropy(net(x), y)
            feats = net.features(x)  # §3.2: CE(fc(h), y) + λ_node CE(G(h), y) + λ_edge BCE(A, edge(y))
            logits_g, sim = net.gnn(feats)
            return (
                F.cross_entropy(net.fc(feats), y)
                + g.lambda_node * F.cross_entropy(logits_g, y)
                + g.lambda_edge * edge_loss(sim, y)
            )

        self.net = cached_source(
            "domain_source", key, derive_seed("source"), build, loss, dm, self.source_stage
        )
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed("init"))
            self.causal = CausalHead(n.feat_dim, n.latent, C, M + 1)
        self.batch_seed = derive_seed("batches")
        self.target_x = [x.to(self.device) for x in dm.target_x]
        self.source_x, self.source_y = dm.source_x, dm.source_y
        sizes = [len(x) for x in self.target_x]
        self.offsets = [0, *torch.tensor(sizes).cumsum(0).tolist()]
        total = len(self.source_x) + self.offsets[-1]
        self.memory = FIFOMemory(total, n.feat_dim)
        self.conf_bank = FIFOMemory(total, n.latent)
        self.register_buffer("ps_label", torch.full((self.offsets[-1],), -1, dtype=torch.long))
        self.register_buffer("ps_conf", torch.zeros(self.offsets[-1]))
        self.register_buffer("order", torch.full((M,), -1, dtype=torch.long))
        self.register_buffer("conf_protos", torch.zeros(M + 1, n.latent))
        self.register_buffer("shot_labels", torch.zeros(self.offsets[-1], dtype=torch.long))
        self.register_buffer("it", torch.zeros((), dtype=torch.long))
        self.register_buffer("prepared", torch.tensor(False))
        if self.method == "shot":
            self.net.fc.requires_grad_(False)  # SHOT's hypothesis transfer
        self.accs = nn.ModuleList(MulticlassAccuracy(C, average="micro") for _ in range(M))
        if g.use_gnn:
            self.accs_gnn = nn.ModuleList(MulticlassAccuracy(C, average="micro") for _ in range(M))
        self.target_names = list(dm.target_domains)

    def curriculum_steps(self) -> int:
        """Stage 2's length: ``iters_per_target`` steps for each target."""
        return self.num_targets * self.curriculum.iters_per_target

    def total_steps(self) -> int:
        return {
            "source_only": 0,
            "shot": self.shot.iters,
            "prototype_only": self.curriculum_steps() + self.causal_stage.iters,
            "u3cf": self.curriculum_steps() + self.causal_stage.iters,
        }[self.method]

    def configure_optimizers(self):
        params = [p for p in [*self.net.parameters(), *self.causal.parameters()] if p.requires_grad]
        return torch.optim.SGD(
            params,
            lr=self.hparams.lr,
            momentum=self.hparams.momentum,
            nesterov=True,
            weight_decay=self.hparams.weight_decay,
        )

    # ---- helpers --------------------------------------------------------------------------------------------------
    def gen(self) -> torch.Generator:
        """The step's generator: a function of (the run's "batches" stream, iteration), so a resumed run draws
        the same batches."""
        return torch.Generator().manual_seed(self.batch_seed * 1_000_003 + int(self.it))

    @torch.no_grad()
    def eval_probs(self, x: Tensor, head: str = "model") -> tuple[Tensor, Tensor]:
        """(h, class probabilities) in eval mode; the probabilities of G (graphs over chunks of 512 images, as
        D-CGCT's test batches) when the model has a graph head and ``head="model"``, else of fc."""
        was = self.net.training
        self.net.eval()
        chunks = [self.net.features(c) for c in x.split(512)]
        if self.net.gnn is not None and head == "model":
            probs = torch.cat([self.net.gnn(c)[0].softmax(-1) for c in chunks])
        else:
            probs = self.net.fc(torch.cat(chunks)).softmax(-1)
        self.net.train(was)
        return torch.cat(chunks), probs

    def pseudo_source_pool(self) -> tuple[Tensor, Tensor, Tensor]:
        """All pseudo-source samples (x, y, d): the source plus upgraded target samples."""
        xs, ys, ds = [self.source_x], [self.source_y], [torch.zeros(len(self.source_y), dtype=torch.long)]
        for m in range(self.num_targets):
            lab = self.ps_label[self.offsets[m] : self.offsets[m + 1]].cpu()
            keep = lab >= 0
            xs.append(self.target_x[m].cpu()[keep])
            ys.append(lab[keep])
            ds.append(torch.full((int(keep.sum()),), m + 1))
        return torch.cat(xs), torch.cat(ys), torch.cat(ds)

    def sample(self, pool, n: int, gen) -> tuple[Tensor, Tensor, Tensor]:
        idx = torch.randint(0, len(pool[0]), (n,), generator=gen)
        return tuple(t[idx].to(self.device) for t in pool)

    def reset_optimizer(self) -> None:
        self.optimizers().optimizer.state.clear()  # each stage starts a fresh momentum (a new optimiser in D-CGCT)

    # ---- stage boundaries ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def choose_target(self, m: int) -> int:
        """§3.3.1: the remaining target with the largest mean max-softmax."""
        done = set(self.order[:m].tolist())
        scores = {
            t: float(self.eval_probs(self.target_x[t])[1].max(1).values.mean())
            for t in range(self.num_targets)
            if t not in done
        }
        return max(scores, key=scores.get)

    @torch.no_grad()
    def upgrade_pseudo_source(self, t: int, last: bool) -> None:
        """§3.3.3: target t's samples with max softmax > thr join the pseudo-source set (domain t + 1)."""
        feats, p = self.eval_probs(self.target_x[t])  # G's probabilities with the graph head
        conf, lab = p.max(1)
        sl = slice(self.offsets[t], self.offsets[t + 1])
        keep = conf > self.curriculum.thr
        self.ps_label[sl] = torch.where(keep, lab, torch.full_like(lab, -1))
        self.ps_conf[sl] = conf
        if last:  # §3.3.4: the last target's (h, MLP pseudo-label, d) also enter M
            mlp = lab if self.net.gnn is None else self.net.fc(feats).argmax(1)
            self.memory.append(feats, mlp, torch.full_like(mlp, t + 1))

    @torch.no_grad()
    def init_confounders(self) -> None:
        """Stage 3 start: the confounder bank holds μ2 of the whole pseudo-source set (reconstructed init)."""
        x, _, d = self.pseudo_source_pool()
        was = self.net.training
        self.net.eval()
        mu2 = torch.cat(
            [self.causal.encode(self.net.features(c.to(self.device)), None)[1] for c in x.split(512)]
        )
        self.net.train(was)
        self.conf_bank.length.zero_()
        self.conf_bank.append(mu2, d.to(self.device), d.to(self.device))
        self.conf_protos.copy_(class_means(*self.conf_bank.rows()[::2], self.num_targets + 1))

    @torch.no_grad()
    def refresh_shot_labels(self) -> None:
        """SHOT's weighted-centroid pseudo-labels over the blended targets (two rounds: soft, then hard)."""
        x = torch.cat(self.target_x)
        feats, p = self.eval_probs(x, head="fc")
        f = F.normalize(feats, dim=1)
        cent = p.T @ f / p.sum(0)[:, None].clamp_min(1e-8)
        lab = (f @ F.normalize(cent, dim=1).T).argmax(1)
        onehot = F.one_hot(lab, self.num_classes).float()
        cent = onehot.T @ f / onehot.sum(0)[:, None].clamp_min(1e-8)
        self.shot_labels.copy_((f @ F.normalize(cent, dim=1).T).argmax(1))

    def on_train_start(self) -> None:
        if bool(self.prepared):
            return
        with torch.no_grad():  # §3.2: M ← F(x) of every source sample (eval mode), domain 0
            was = self.net.training
            self.net.eval()
            feats = torch.cat([self.net.features(c.to(self.device)) for c in self.source_x.split(512)])
            self.net.train(was)
            zeros = torch.zeros(len(feats), dtype=torch.long, device=self.device)
            self.memory.append(feats, self.source_y.to(self.device), zeros)
        self.prepared.fill_(True)

    # ---- one step -------------------------------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        it, gen = int(self.it), self.gen()
        if it >= self.total_steps():
            return None  # source-only: nothing is trained (the DataModule serves at least one step)
        opt = self.optimizers()
        if self.method == "shot":
            loss = self.shot_step(it, gen)
        else:
            A, M = self.curriculum.iters_per_target, self.num_targets
            if it < M * A:
                m, local = divmod(it, A)
                if local == 0:
                    self.order[m] = self.choose_target(m)
                    self.reset_optimizer()
                loss = self.curriculum_step(int(self.order[m]), gen)
            else:
                if it == M * A:
                    self.reset_optimizer()
                    if self.method == "u3cf":
                        self.init_confounders()
                loss = self.causal_step(it - M * A, gen) if self.method == "u3cf" else self.finetune_step(gen)
        opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        opt.step()
        if self.method in ("prototype_only", "u3cf") and it < self.curriculum_steps():
            m, local = divmod(it, self.curriculum.iters_per_target)
            if local == self.curriculum.iters_per_target - 1:
                self.upgrade_pseudo_source(int(self.order[m]), last=m == self.num_targets - 1)
        self.it += 1
        self.log("train/loss", loss.detach(), prog_bar=True)

    def curriculum_step(self, t: int, gen) -> Tensor:
        """§3.3.2: L = CE(fc(h_s), y_s) + λ_adv CE(cos(h_t, μ)/τ, ŷ_t), ŷ_t = argmax fc(h_t); with the graph head
        L += λ_node CE(G(h)_s, y_s) + λ_edge BCE(A, edge) over the source and confident target nodes, and
        ŷ_t = argmax G(h)_t."""
        c, g = self.curriculum, self.graph
        pool = self.pseudo_source_pool()
        xs, ys, ds = self.sample(pool, c.batch_source, gen)
        xt = self.target_x[t][torch.randint(0, len(self.target_x[t]), (c.batch_target,), generator=gen)]
        # Two passes through F, as the precursor's adapt_target: each BatchNorm normalises the pseudo-source and
        # the target batch with their own statistics. One joint batch mixed them; the target's features then
        # moved with the source's, its fc pseudo-labels fell to one class within a few steps and the
        # prototype loss locked that in (the collapse to chance; test_curriculum_batches_pass_f_per_domain).
        h_s, h_t = self.net.features(xs), self.net.features(xt)
        feats = torch.cat([h_s, h_t])
        l_mlp = F.cross_entropy(self.net.fc(h_s), ys)
        self.memory.append(
            h_s, ys, ds, limit=len(pool[0])
        )  # FIFO; grows while smaller than the pseudo-source
        mu = class_means(*self.memory.rows()[:2], self.num_classes)  # recomputed every step, detached
        if self.net.gnn is None:
            pseudo = self.net.fc(h_t).argmax(1).detach()
            l_proto = prototype_contrastive_loss(h_t, mu, pseudo, c.tau)
            self.log_dict({"train/l_mlp": l_mlp.detach(), "train/l_proto": l_proto.detach()})
            return l_mlp + c.lambda_adv * l_proto
        logits_g, sim = self.net.gnn(feats)  # one graph over the b_s + b_t nodes
        l_gnn = F.cross_entropy(logits_g[: len(xs)], ys)
        conf, lab_t = self.net.fc(h_t).detach().softmax(-1).max(1)
        edge_labels = torch.cat([ys, torch.where(conf > c.thr, lab_t, torch.full_like(lab_t, -1))])
        l_edge = edge_loss(sim, edge_labels)
        pseudo = logits_g[len(xs) :].argmax(1).detach()
        l_proto = prototype_contrastive_loss(h_t, mu, pseudo, c.tau)
        self.log_dict(
            {
                "train/l_mlp": l_mlp.detach(),
                "train/l_proto": l_proto.detach(),
                "train/l_gnn": l_gnn.detach(),
                "train/l_edge": l_edge.detach(),
            }
        )
        return l_mlp + g.lambda_node * l_gnn + g.lambda_edge * l_edge + c.lambda_adv * l_proto

    def finetune_step(self, gen) -> Tensor:
        """prototype-only's stage 3: plain CE on the pseudo-source set (with the graph head, D-CGCT's fine-tune:
        + λ_node CE(G(h), y) + λ_edge BCE(A, edge(y)))."""
        g = self.graph
        x, y, _ = self.sample(self.pseudo_source_pool(), self.causal_stage.batch_size, gen)
        if self.net.gnn is None:
            return F.cross_entropy(self.net(x), y)
        feats = self.net.features(x)
        logits_g, sim = self.net.gnn(feats)
        return (
            F.cross_entropy(self.net.fc(feats), y)
            + g.lambda_node * F.cross_entropy(logits_g, y)
            + g.lambda_edge * edge_loss(sim, y)
        )

    def causal_step(self, step: int, gen) -> Tensor:
        """§3.4: the causal stage's losses on a pseudo-source batch."""
        c, g, k = self.causal_stage, self.graph, self.net_config.latent
        x, y, d = self.sample(self.pseudo_source_pool(), c.batch_size, gen)
        feats = self.net.features(x)
        noise = (torch.randn(len(x), k, generator=gen), torch.randn(len(x), k, generator=gen))
        z_c, z_d, (mu1, lv1, mu2, lv2) = self.causal.encode(feats, tuple(n.to(self.device) for n in noise))
        rec = self.causal.dec(torch.cat([z_c, z_d], -1))
        self.conf_bank.append(z_d, d, d)
        protos = class_means(*self.conf_bank.rows()[::2], self.num_targets + 1)
        self.conf_protos.copy_(protos)
        logp = backdoor_log_prob(self.net.fc, self.causal.dec, z_c, protos)
        l_mlp = F.nll_loss(logp, y)
        l_vae = kl_std_normal(mu1, lv1) + kl_std_normal(mu2, lv2)
        l_sup = F.cross_entropy(self.causal.c1(z_c), y) + F.cross_entropy(self.causal.c2(z_d), d)
        l_mi = mi_loss(self.causal.c2(z_c), self.causal.c1(z_d))
        l_rec = F.mse_loss(rec, feats)
        anneal = min(1.0, step / max(1, c.kl_anneal_steps))
        self.log_dict(
            {
                "train/l_do": l_mlp.detach(),
                "train/l_vae": l_vae.detach(),
                "train/l_sup": l_sup.detach(),
                "train/l_mi": l_mi.detach(),
                "train/l_rec": l_rec.detach(),
            }
        )
        loss = (
            c.lambda_mlp * l_mlp
            + c.lambda_klg * anneal * l_vae
            + c.lambda_ce * l_sup
            + c.lambda_kl * l_mi
            + c.lambda_res * l_rec
        )
        if self.net.gnn is not None:  # the graph branch: λ_node3 = λ_node, λ_edge3 = λ_edge (spec §3.7)
            logp_g, sim = backdoor_gnn(self.net.gnn, intervened(self.causal.dec, z_c, protos))
            l_gnn, l_edge = F.nll_loss(logp_g, y), edge_loss(sim, y)
            self.log_dict({"train/l_gnn_do": l_gnn.detach(), "train/l_edge_do": l_edge.detach()})
            loss = loss + g.lambda_node * l_gnn + g.lambda_edge * l_edge
        return loss

    def shot_step(self, it: int, gen) -> Tensor:
        if it % self.shot.refresh == 0:
            self.refresh_shot_labels()
        x = torch.cat(self.target_x)
        idx = torch.randint(0, len(x), (self.shot.batch_size,), generator=gen)
        logits = self.net(x[idx])
        ent, div = shot_losses(logits)
        return ent - div + self.shot.beta * F.cross_entropy(logits, self.shot_labels[idx])

    # ---- evaluation -----------------------------------------------------------------------------------------------
    def predict_log_probs(self, x: Tensor) -> Tensor:
        feats = self.net.features(x)
        if self.method == "u3cf" and int(self.it) > self.curriculum_steps():
            z_c = self.causal.encode(feats, None)[0]
            return backdoor_log_prob(self.net.fc, self.causal.dec, z_c, self.conf_protos)
        return F.log_softmax(self.net.fc(feats), -1)

    def predict_gnn_log_probs(self, x: Tensor) -> Tensor:
        """The graph branch (secondary; transductive over the batch: one graph over its images)."""
        feats = self.net.features(x)
        if self.method == "u3cf" and int(self.it) > self.curriculum_steps():
            z_c = self.causal.encode(feats, None)[0]
            return backdoor_gnn(self.net.gnn, intervened(self.causal.dec, z_c, self.conf_protos))[0]
        return F.log_softmax(self.net.gnn(feats)[0], -1)

    def validation_step(self, batch, batch_idx):
        x, y, d = batch
        pred = self.predict_log_probs(x).argmax(1)
        pred_g = self.predict_gnn_log_probs(x).argmax(1) if self.net.gnn is not None else None
        for m in range(self.num_targets):
            sel = d == m + 1
            if sel.any():
                self.accs[m].update(pred[sel], y[sel])
                if pred_g is not None:
                    self.accs_gnn[m].update(pred_g[sel], y[sel])

    def on_validation_epoch_end(self) -> None:
        accs = []
        for name, metric in zip(self.target_names, self.accs):
            a = metric.compute()
            metric.reset()
            accs.append(a)
            self.log(f"val/acc_{name}", a)
        self.log("val/acc_mean", torch.stack(accs).mean(), prog_bar=True)
        if self.net.gnn is not None:  # reported beside the MLP branch, never used to pick one
            accs_g = []
            for name, metric in zip(self.target_names, self.accs_gnn):
                accs_g.append(metric.compute())
                metric.reset()
                self.log(f"val/acc_gnn_{name}", accs_g[-1])
            self.log("val/acc_gnn_mean", torch.stack(accs_g).mean())
        order = self.order.tolist()
        if self.method in ("prototype_only", "u3cf") and int(self.it) >= self.curriculum_steps():
            self.log("curriculum/order_ok", float(sorted(order) == list(range(self.num_targets))))
            added = self.ps_label >= 0
            ok = bool((self.ps_conf[added] > self.curriculum.thr).all())
            _, _, dom = self.pseudo_source_pool()
            ok = ok and bool((dom[len(self.source_y) :] >= 1).all())
            self.log("curriculum/pseudo_source_ok", float(ok))
            self.log("curriculum/pseudo_source_size", float(added.sum()))


@torch.no_grad()
def run_features(run_dir) -> tuple[Tensor, Tensor, list[str], Tensor, list[str]]:
    """Bottleneck features h = F(x) (eval mode) of every source and target image of a U3CF run, from its
    checkpoint; domain index 0 is the source, m the m-th target; with the true classes (read for the figure
    only, from the evaluation loader) and the class names. The DataModule is rebuilt from the checkpoint under
    the run's seed."""
    from litlab.lit_modules.domain.contract import MultiTargetDigitsDataModule
    from litlab.lit_modules.domain.report import datamodule_from_checkpoint, run_checkpoint, sub_state

    ckpt = run_checkpoint(run_dir)
    dm = datamodule_from_checkpoint(ckpt, MultiTargetDigitsDataModule, run_dir)
    check_data(dm, MultiTargetData, "u3cf.run_features")
    hp = ckpt["hyper_parameters"]
    # the checkpoint holds the backbone's weights: nothing to read from a weights file
    net_config = dataclasses.replace(as_config(U3CFNet, hp.get("net")), backbone_weights=None)
    net = build_classifier(net_config, as_config(GraphHead, hp.get("graph")), dm.num_outputs)
    net.load_state_dict(sub_state(ckpt["state_dict"], "net."))
    net.eval()
    xs = [dm.source_x, *dm.target_x]
    feats = [torch.cat([net.features(c) for c in x.split(512)]) for x in xs]
    dom = torch.cat([torch.full((len(x),), i) for i, x in enumerate(xs)])
    target_y = [y for _, y, _ in dm.val_dataloader()]  # every target, in domain order
    labels = torch.cat([dm.source_y, *target_y])
    return torch.cat(feats), dom, ["source", *dm.target_domains], labels, [str(c) for c in dm.classes]


def report(result, out_dir):
    """``report_hook`` of seeds/u3cf.yaml: per-target accuracy bars and table of every run measured, and the PCA
    of source and target features at the card's first seed, before adaptation (the positive control's floor)
    and after it (the headline method, the runs its claims compare it with, its unclaimed ablations)."""
    from litlab.lit_modules.domain.report import (
        card_design,
        feature_panels,
        feature_report,
        merge_extras,
        per_target_keys,
        per_target_report,
    )

    roles, claims = card_design(result)
    keys = per_target_keys(result, "val/acc_", exclude=(result.metric_name, "val/acc_gnn_"))
    return merge_extras(
        per_target_report(result, out_dir, result.slug, list(result.runs), keys, "target accuracy"),
        feature_report(result, out_dir, result.slug, feature_panels(roles, claims), run_features),
    )
