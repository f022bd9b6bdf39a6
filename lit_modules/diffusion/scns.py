"""SCNS: Submodular Concept Neuron Selection for continual personalisation of diffusion models.

Paper: "Submodular Concept Neuron Selection" (SCNS), Peng, Yang, Cheng, Yuan, Ma, Cao, Shen, ICML 2026
(poster 63824). Only the abstract was readable: "formulates continual personalization as a constrained
submodular optimization problem to select a minimal yet sufficient set of concept-specific neurons under
diminishing returns ... a Facility Location-based coverage objective to suppress semantic redundancy, a
Fisher-weighted risk proxy to protect previously learned concepts, and a cost-aware greedy rule", "modifying only
0.41% of the total parameters for each concept on average", fusion-free. Everything below that the abstract
does not state is **reconstructed** ([R]), from CNS ("Continual Personalization for Diffusion Models", Liao et
al., ICCV 2025, arXiv 2510.02296: neurons = rows of cross-attention W_k / W_v, general neurons removed) and the
standard algorithms named in ``submodular.py``.

Per task t — ``SCNS.begin_task``, ``training_step`` and ``end_task`` below, in this order; the loop, the row deltas,
the merge and the evaluation are tools of ``harness.ContinualNeuronTuning``:
  0. <V_t>'s embedding row ← its class word's                                           (init_concept_token)
  1. M probes (x_i, τ_m, ε_m): images cycled, τ_m = probe_t0 + probe_dt·m, one noise each ("probes" stream)   [R]
  2. saliency a_n^(m) = |<W_n, ∂L_m/∂W_n>| (first-order Taylor), w_n = mean_m a_n^(m)                    [R]
  3. general neurons G: activation α_n(p) = mean_tokens |W_n·T(p)_tok| on generic calibration prompts,
     z-scored within its layer, mean over prompts; G = top ``general_q`` of all neurons (CNS step b)      [R]
     candidates C_t = top ``top_p`` neurons by w_n outside G (0: all of them)
  4. similarity s(u, n) = max(0, cos) of the per-probe-normalised, row-centred profiles, s(n, n) = 1
     (``sim: pearson``; raw cosine ``sim: cosine`` collapses to a handful of neurons)                    [R]
  5. risk r(n) = Ω^(t−1)_n = Σ_{k<t} F_k(n) / max F_k  (0 for t = 1)                                      [R]
  6. S_t = cost-aware greedy on f(S) = Σ_u w̃_u max_{n∈S} s(u, n) with cost (c_n / c̄)(1 + λ r(n)), stop at
     f ≥ τ_cov, spent ≥ budget_frac·|θ_UNet| or gain < δ_min (``submodular.cost_aware_greedy``)           [R]
  7. train Δ on rows S_t + the token row: AdamW (weight decay 0) on the ε-loss of D_t     (tune_rows, training_step)
  8. merge W[S_t] += Δ, the plain projection back (fusion-free), freezing check            (merge_rows)
  9. F_t(n) = Σ_i mean_m (∂L_m/∂W_{n,i})² over M_F draws of D_t ("fisher" stream) on the merged model;
     Ω ← Ω + F_t / max F_t                                                                                [R]
  then the held-out losses and samples (evaluate_task), and ``val/risk_sum``: mean over t ≥ 2 of Σ_{n∈S_t} r(n).

``selection`` switches the baselines that share the loop, the data and the optimiser (spec §6): ``all`` (every
K/V row, Custom-Diffusion-style), ``random`` (random candidates, as many as SCNS would select with
``size_lambda`` at this state; the "select" stream), ``topk`` (top-|S| candidates by w_n: CNS-like, same size rule)
and ``scns``. The Fisher is computed for every selection (the risk of what each one selects is logged as
``val/risk_sum``). The random streams are the run seed's, by name (``core.seeding.derive_seed``), so every run of
one seed shares the probes and Fisher draws.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from litlab.lit_modules.core.config import as_config, config_part
from litlab.lit_modules.core.seeding import derive_seed
from litlab.lit_modules.diffusion.ddpm import TinyT2IConfig
from litlab.lit_modules.diffusion.harness import ContinualNeuronTuning, SamplingConfig
from litlab.lit_modules.diffusion.neurons import (
    diag_empirical_fisher,
    neuron_fisher,
    per_sample_row_grads,
    row_saliency,
)
from litlab.lit_modules.diffusion.submodular import FacilityLocation, cost_aware_greedy

Selection = Literal["scns", "all", "random", "topk"]


@config_part
class SelectionConfig:
    """Steps 1-6 (spec §3.3-3.4; every default reconstructed)."""

    num_probes: int = 16
    probe_t0: int = 100
    probe_dt: int = 50
    top_p: int = 0  # 0: every non-general neuron is a candidate
    general_q: float = 0.05
    sim: Literal["pearson", "cosine"] = "pearson"
    fl_mode: Literal["neurons", "probes"] = "neurons"
    tau_cov: float = 0.9
    budget_frac: float = 0.01
    lambda_risk: float = 10.0
    delta_min: float = 1e-4
    r_max: float = float("inf")
    risk_mode: Literal["cost", "penalty"] = "cost"
    fisher_samples: int = 32
    fisher_norm: Literal["max", "none"] = "max"


# ---- pure maths of steps 2-4 (tested on hand-made tensors) ----------------------------------------
def similarity(saliency: Tensor, kind: str = "pearson") -> Tensor:
    """(N, N) s(u, n) ∈ [0, 1] with unit diagonal from (M, N) per-probe saliency profiles [R]:
    ``pearson``: each probe column divided by its mean over neurons, each neuron's profile centred, cosine
    clipped at 0; ``cosine``: cosine of the raw profiles."""
    a = saliency.double()
    if kind == "pearson":
        a = a / a.mean(dim=1, keepdim=True).clamp_min(1e-30)
        a = a - a.mean(dim=0, keepdim=True)
    elif kind != "cosine":
        raise ValueError(f"sim must be 'pearson' or 'cosine', got {kind!r}")
    unit = a / a.norm(dim=0, keepdim=True).clamp_min(1e-30)
    s = (unit.T @ unit).clamp(0.0, 1.0)
    s.fill_diagonal_(1.0)
    return s


def general_neurons(activations: list[Tensor], q: float) -> Tensor:
    """Flat indices of the general neurons: per layer, ``activations[l]`` (R prompts, d_l neurons) z-scored
    over the layer's neurons per prompt, averaged over prompts; the top ``q`` fraction of all neurons [R]."""
    z = []
    for a in activations:
        a = a.double()
        z.append(((a - a.mean(1, keepdim=True)) / a.std(1, keepdim=True).clamp_min(1e-12)).mean(0))
    z = torch.cat(z)
    k = int(round(q * len(z)))
    if k == 0:
        return torch.zeros(0, dtype=torch.long)
    return torch.sort(torch.topk(z, k).indices).values


def accumulate_risk(omega: Tensor, fisher: Tensor, norm: str = "max") -> Tensor:
    """Ω ← Ω + F_t / max F_t (each task weighs equally; ``norm="none"``: the raw sum) [R]."""
    f = fisher.double()
    if norm == "max":
        f = f / f.max().clamp_min(1e-30)
    return omega + f


def task_generator(component: str, t: int) -> torch.Generator:
    """Task t's generator in the run's ``component`` stream."""
    return torch.Generator().manual_seed(derive_seed(component) * 1_000 + t)


class SCNS(ContinualNeuronTuning):
    """SCNS and its baselines (``selection``) on the shared loop; see the module docstring."""

    def __init__(
        self,
        selection: Selection = "scns",
        select: SelectionConfig = SelectionConfig(),  # noqa: B008
        size_lambda: float = 10.0,
        base: TinyT2IConfig = TinyT2IConfig(),  # noqa: B008
        pretrained_path: str | None = None,
        ground_set: str = "kv",
        lr_rows: float = 1e-3,
        lr_token: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eval_batch: int = 128,
        full_matrix: bool = False,
        sampling: SamplingConfig = SamplingConfig(),  # noqa: B008
        backbone_seed: int | None = None,
    ):
        super().__init__(
            base=base,
            pretrained_path=pretrained_path,
            ground_set=ground_set,
            lr_rows=lr_rows,
            lr_token=lr_token,
            betas=betas,
            eval_batch=eval_batch,
            full_matrix=full_matrix,
            sampling=sampling,
            backbone_seed=backbone_seed,
        )
        self.save_hyperparameters()
        self.sel = as_config(SelectionConfig, select, "select")
        self.omega: Tensor | None = None  # Ω: every neuron's Fisher risk for the concepts learnt so far

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.omega is None:
            self.omega = torch.zeros(self.gs.size, dtype=torch.float64)

    # ---- the algorithm, per task t ------------------------------------------------------------------
    def begin_task(self, t: int, dm) -> None:
        self.init_concept_token(t, dm)  # 0
        selected, info = self.select(t, dm)  # 1-6
        info["risk_sum"] = float(self.omega[selected].sum())  # Σ_{n∈S_t} r(n)
        self.tune_rows(t, selected, dm, info)  # 7: Δ on rows S_t and the token row

    def training_step(self, batch, batch_idx: int) -> Tensor:
        loss = self.denoising_loss(*batch)  # 7: the ε-loss of D_t
        opt = self.optimizers()
        opt.zero_grad(set_to_none=True)
        self.manual_backward(loss)
        opt.step()
        self.log("train/loss", loss, prog_bar=True)
        return loss.detach()

    def end_task(self, t: int, dm) -> None:
        self.merge_rows(t, dm)  # 8: W[S_t] += Δ
        self.omega = accumulate_risk(self.omega, self.task_fisher(t, dm), self.sel.fisher_norm)  # 9
        self.evaluate_task(t, dm)
        if t == dm.num_concepts - 1:
            risks = [info["risk_sum"] for info in self.task_log[1:]]  # the first task has no risk to take
            self.log("val/risk_sum", sum(risks) / max(len(risks), 1), on_step=False, on_epoch=True)

    # ---- steps 1-6: the selection -------------------------------------------------------------------
    def select(self, t: int, dm) -> tuple[Tensor, dict[str, float]]:
        """S_t (flat neuron indices) and numbers to log about it, by ``selection``."""
        if self.hparams.selection == "all":
            return torch.arange(self.gs.size), {}
        sal = self.probe_saliency(t, dm)
        cand = self.candidates(sal.mean(0), self.general_set(dm))
        if self.hparams.selection == "scns":
            return self.greedy(sal, cand, self.sel.lambda_risk)
        size_set, info = self.greedy(sal, cand, self.hparams.size_lambda)
        k = len(size_set)
        if self.hparams.selection == "topk":
            order = torch.argsort(sal.mean(0)[cand], descending=True, stable=True)[:k]
            return torch.sort(cand[order]).values, info
        pick = torch.randperm(len(cand), generator=task_generator("select", t))[:k]
        return torch.sort(cand[pick]).values, info

    def row_grads(self, x0: Tensor, prompt: str, taus: Tensor, noise: Tensor) -> dict[str, Tensor]:
        """Per-sample K/V weight gradients of the ε-loss of each (x0, τ, ε) under ``prompt``: one backward per
        ``eval_batch`` samples (one in all at the quick scale; bounds the activations at the full scale)."""
        step = self.hparams.eval_batch
        parts = [
            per_sample_row_grads(
                self.model.unet,
                self.gs,
                lambda sl=slice(i, i + step): self.task_losses(x0[sl], prompt, taus[sl], noise[sl]),
            )
            for i in range(0, len(x0), step)
        ]
        self.model.zero_grad(set_to_none=True)
        return {name: torch.cat([part[name] for part in parts]) for name in self.gs.modules}

    def probe_saliency(self, t: int, dm) -> Tensor:
        """Steps 1-2: (M, N) saliency of every neuron on the task's M probes (on the CPU: selection runs there)."""
        m = self.sel.num_probes
        x = self.to_x0(dm.task_images(t))
        x0 = x[torch.arange(m) % len(x)]
        taus = torch.tensor([self.sel.probe_t0 + self.sel.probe_dt * i for i in range(m)])
        noise = torch.randn(x0.shape, generator=task_generator("probes", t))
        grads = self.row_grads(x0, dm.concept_prompt(t), taus, noise)
        return row_saliency(self.model.unet, self.gs, grads).cpu()

    @torch.no_grad()
    def general_set(self, dm) -> Tensor:
        """Step 3: the general neurons G, from the calibration prompts' activations."""
        ids = self.tokenize(dm.calibration_prompts())
        h = self.encode(ids)  # (R, L, d_txt)
        keep = self.model.token_mask(ids).to(h.device, h.dtype).unsqueeze(-1)  # real tokens, not padding
        acts = []
        for name in self.gs.modules:
            w = self.model.unet.get_submodule(name).weight
            a = (h @ w.T).abs()  # (R, L, d_out)
            acts.append(((a * keep).sum(1) / keep.sum(1)).cpu())
        return general_neurons(acts, self.sel.general_q)

    def candidates(self, w: Tensor, general: Tensor) -> Tensor:
        """Step 3: C_t, the top ``top_p`` neurons by w_n outside G."""
        mask = torch.ones(len(w), dtype=torch.bool)
        mask[general] = False
        cand = torch.nonzero(mask).squeeze(1)
        if self.sel.top_p and self.sel.top_p < len(cand):
            order = torch.argsort(w[cand], descending=True, stable=True)[: self.sel.top_p]
            cand = torch.sort(cand[order]).values
        return cand

    def greedy(self, sal: Tensor, cand: Tensor, lam: float) -> tuple[Tensor, dict[str, float]]:
        """Steps 4-6: the cost-aware greedy over C_t with risk weight ``lam``."""
        a = sal[:, cand]
        w = a.mean(0)
        if self.sel.fl_mode == "probes":  # demand points = probes: f(S) = Σ_m max_{n∈S} a_n^(m) / Σ_m max_n
            sim_pm = a / a.max(dim=1, keepdim=True).values.clamp_min(1e-30)  # (M, |C|)
            fl = _ProbeFL(sim_pm)
        else:
            fl = FacilityLocation(similarity(a, self.sel.sim), w / w.sum())
        res = cost_aware_greedy(
            fl,
            self.gs.costs[cand],
            self.omega[cand],
            lam=lam,
            tau_cov=self.sel.tau_cov,
            budget=self.sel.budget_frac * self.unet_params,
            delta_min=self.sel.delta_min,
            r_max=self.sel.r_max,
            risk_mode=self.sel.risk_mode,
        )
        return cand[torch.tensor(res.selected, dtype=torch.long)], {"coverage": res.value}

    # ---- step 9 ------------------------------------------------------------------------------------
    def task_fisher(self, t: int, dm) -> Tensor:
        """Per-neuron diagonal empirical Fisher of task t on the merged model (M_F per-sample gradients)."""
        m = self.sel.fisher_samples
        x = self.to_x0(dm.task_images(t))
        gen = task_generator("fisher", t)
        x0 = x[torch.arange(m) % len(x)]
        taus = torch.randint(0, self.num_train_timesteps, (m,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        grads = self.row_grads(x0, dm.concept_prompt(t), taus, noise)
        return neuron_fisher(self.gs, diag_empirical_fisher(grads)).cpu()

    # ---- checkpoints: Ω travels with the stream ------------------------------------------------------
    def stream_state(self) -> dict:
        return {**super().stream_state(), "omega": self.omega}

    def load_stream_state(self, state: dict) -> None:
        super().load_stream_state(state)
        self.omega = state["omega"]


class _ProbeFL(FacilityLocation):
    """``fl_mode: probes`` [R, the spec's alternative]: demand points are the M probes, f(S) = mean_m max_{n∈S}
    â_n^(m) with â the saliency divided by each probe's maximum (so f(C) = 1)."""

    def __init__(self, sim_pm: Tensor):  # (M, |C|)
        self.sim = sim_pm.double()
        self.weights = torch.full((sim_pm.shape[0],), 1.0 / sim_pm.shape[0], dtype=torch.float64)
        self.n = sim_pm.shape[1]

    def empty(self) -> Tensor:
        return torch.zeros(self.sim.shape[0], dtype=torch.float64)


def report(result, out_dir):
    """The card's report: every run on the stability-plasticity plane (the runs no other beats on both axes
    joined: the frontier) and the first seed's samples per concept of every run that saved samples."""
    from litlab.lit_modules.core.results import ReportExtras
    from litlab.lit_modules.diffusion.report import concept_samples_report, frontier_report

    frontier = frontier_report(result, out_dir, "scns")
    samples = concept_samples_report(result, out_dir, "scns")
    return ReportExtras(
        figures=[*frontier.figures, *samples.figures],
        markdown="\n".join(m for m in (frontier.markdown, samples.markdown) if m),
    )
