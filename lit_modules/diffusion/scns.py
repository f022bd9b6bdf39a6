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

Per task t (the loop is ``harness.ContinualNeuronTuning``; this file is ``select`` and ``after_merge``):
  0. <V_t>'s embedding row ← its class word's                                            (harness)
  1. M probes (x_i, τ_m, ε_m): images cycled, τ_m = probe_t0 + probe_dt·m, one seeded noise each        [R]
  2. saliency a_n^(m) = |<W_n, ∂L_m/∂W_n>| (first-order Taylor), w_n = mean_m a_n^(m)                    [R]
  3. general neurons G: activation α_n(p) = mean_tokens |W_n·T(p)_tok| on generic calibration prompts,
     z-scored within its layer, mean over prompts; G = top ``general_q`` of all neurons (CNS step b)      [R]
     candidates C_t = top ``top_p`` neurons by w_n outside G (0: all of them)
  4. similarity s(u, n) = max(0, cos) of the per-probe-normalised, row-centred profiles, s(n, n) = 1
     (``sim: pearson``; raw cosine ``sim: cosine`` collapses to a handful of neurons)                    [R]
  5. risk r(n) = Ω^(t−1)_n = Σ_{k<t} F_k(n) / max F_k  (0 for t = 1)                                      [R]
  6. S_t = cost-aware greedy on f(S) = Σ_u w̃_u max_{n∈S} s(u, n) with cost (c_n / c̄)(1 + λ r(n)), stop at
     f ≥ τ_cov, spent ≥ budget_frac·|θ_UNet| or gain < δ_min (``submodular.cost_aware_greedy``)           [R]
  7. train Δ on rows S_t + the token row; 8. merge W[S_t] += Δ                                          (harness)
  9. F_t(n) = Σ_i mean_m (∂L_m/∂W_{n,i})² over M_F draws of D_t on the merged model; Ω ← Ω + F_t / max F_t [R]

``selection`` switches the baselines that share the loop, the data and the optimiser (spec §6): ``all`` (every
K/V row, Custom-Diffusion-style), ``random`` (random candidates, as many as SCNS would select with
``size_lambda`` at this state), ``topk`` (top-|S| candidates by w_n: CNS-like, same size rule) and ``scns``.
The Fisher is computed for every selection (the risk of what each one selects is logged as ``val/risk_sum``).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import Tensor

from litlab.lit_modules.core.config import config_part
from litlab.lit_modules.diffusion.ddpm import TinyT2IConfig
from litlab.lit_modules.diffusion.harness import ContinualNeuronTuning
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


class SCNS(ContinualNeuronTuning):
    """SCNS and its baselines (``selection``) on the shared loop; see the module docstring."""

    def __init__(
        self,
        selection: Selection = "scns",
        select: SelectionConfig = SelectionConfig(),  # noqa: B008
        size_lambda: float = 10.0,
        select_seed: int = 0,
        base: TinyT2IConfig = TinyT2IConfig(),  # noqa: B008
        base_seed: int = 0,
        pretrained_path: str | None = None,
        ground_set: str = "kv",
        lr_rows: float = 1e-3,
        lr_token: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.999),
        eval_batch: int = 128,
        full_matrix: bool = False,
        samples_per_concept: int = 0,
        sample_steps: int = 50,
        sample_t_start: int = 300,
        sample_guidance: float = 1.0,
    ):
        super().__init__(
            base,
            base_seed,
            pretrained_path,
            ground_set,
            lr_rows,
            lr_token,
            betas,
            eval_batch,
            full_matrix,
            samples_per_concept,
            sample_steps,
            sample_t_start,
            sample_guidance,
        )
        self.save_hyperparameters()
        self.sel = select if isinstance(select, SelectionConfig) else SelectionConfig(**select)
        self.omega: Tensor | None = None

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.omega is None:
            self.omega = torch.zeros(self.gs.size, dtype=torch.float64)

    def risk(self) -> Tensor:
        return self.omega.clone()

    # ---- steps 1-3 --------------------------------------------------------------------------------
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
        """(M, N) saliency of every neuron on the task's M probes (on the CPU: selection runs there)."""
        m = self.sel.num_probes
        x = self.to_x0(dm.task_images(t))
        x0 = x[torch.arange(m) % len(x)]
        taus = torch.tensor([self.sel.probe_t0 + self.sel.probe_dt * i for i in range(m)])
        gen = torch.Generator().manual_seed(self.hparams.select_seed * 1_000 + t)
        noise = torch.randn(x0.shape, generator=gen)
        grads = self.row_grads(x0, dm.concept_prompt(t), taus, noise)
        return row_saliency(self.model.unet, self.gs, grads).cpu()

    @torch.no_grad()
    def general_set(self, dm) -> Tensor:
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
        mask = torch.ones(len(w), dtype=torch.bool)
        mask[general] = False
        cand = torch.nonzero(mask).squeeze(1)
        if self.sel.top_p and self.sel.top_p < len(cand):
            order = torch.argsort(w[cand], descending=True, stable=True)[: self.sel.top_p]
            cand = torch.sort(cand[order]).values
        return cand

    def greedy(self, sal: Tensor, cand: Tensor, lam: float) -> tuple[Tensor, dict[str, float]]:
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

    def select(self, t: int, dm) -> tuple[Tensor, dict[str, float]]:
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
        gen = torch.Generator().manual_seed(self.hparams.select_seed * 1_000 + 500 + t)
        pick = torch.randperm(len(cand), generator=gen)[:k]
        return torch.sort(cand[pick]).values, info

    # ---- step 9 ------------------------------------------------------------------------------------
    def task_fisher(self, t: int, dm) -> Tensor:
        """Per-neuron diagonal empirical Fisher of task t on the merged model (M_F per-sample gradients)."""
        m = self.sel.fisher_samples
        x = self.to_x0(dm.task_images(t))
        gen = torch.Generator().manual_seed(self.hparams.select_seed * 1_000 + 900 + t)
        x0 = x[torch.arange(m) % len(x)]
        taus = torch.randint(0, self.num_train_timesteps, (m,), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        grads = self.row_grads(x0, dm.concept_prompt(t), taus, noise)
        return neuron_fisher(self.gs, diag_empirical_fisher(grads)).cpu()

    def after_merge(self, t: int, dm) -> None:
        self.omega = accumulate_risk(self.omega, self.task_fisher(t, dm), self.sel.fisher_norm)

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


def selection_config(**overrides) -> SelectionConfig:
    return dataclasses.replace(SelectionConfig(), **overrides)


def report(result, out_dir):
    """The card's report: the stability-plasticity plane of every method (the lambda sweep joined by a line:
    its frontier) and the first seed's samples per concept for SCNS lambda 10 and all K/V rows."""
    from litlab.lit_modules.core.results import ReportExtras
    from litlab.lit_modules.diffusion.report import concept_samples_report, frontier_report

    runs = {
        "full_kv": "all K/V rows",
        "topk": "top-k saliency (CNS-like)",
        "random": "random rows",
        "scns0": "SCNS lambda 0",
        "scns10": "SCNS lambda 10",
        "scns1000": "SCNS lambda 1000",
        "no_update": "no update (control)",
    }
    frontier = frontier_report(result, out_dir, "scns", runs, ["scns0", "scns10", "scns1000"])
    samples = concept_samples_report(
        result, out_dir, "scns", {"scns10": "SCNS lambda 10", "full_kv": "all K/V rows"}
    )
    return ReportExtras(
        figures=[*frontier.figures, *samples.figures],
        markdown="\n".join(m for m in (frontier.markdown, samples.markdown) if m),
    )
