"""The analyses behind ``litlab analyze`` (``diffract``, ``complexity``, ``lockin``; litlab/analyze.py says what
each reads and writes): each takes the parsed arguments, writes its report folder and returns an exit code. torch
and the analysis family load with this module, which ``litlab analyze`` imports only once a kind is named."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from litlab.datamodules.domain_corpus import DOMAINS, lm_tokenizer
from litlab.datamodules.sums_task import TASKS, SumsTaskDataModule  # noqa: F401  (TASKS: litlab.analyze's choices)
from litlab.lit_modules.analysis import checkpoints
from litlab.lit_modules.analysis import curvature as C
from litlab.lit_modules.analysis import diffract as D
from litlab.lit_modules.analysis import lock_in as LI
from litlab.lit_modules.analysis import task_complexity as TCX
from litlab.lit_modules.analysis.contract import DomainEvalData, domain_eval_set
from litlab.lit_modules.core.corpus import CharTokenizer
from litlab.lit_modules.core.errors import CheckpointError, ConfigError
from litlab.lit_modules.core.io import atomic_write_json, atomic_write_text
from litlab.lit_modules.core.seeding import derive_seed


def _char_vocab(model: torch.nn.Module) -> bool:
    head = getattr(model, "lm_head", None)
    return isinstance(head, torch.nn.Linear) and head.out_features == CharTokenizer().vocab_size


def _reads_windows(model: torch.nn.Module, tokenizer: str | None) -> bool:
    """Whether the evaluation windows (characters, or ``tokenizer``'s tokens) are valid input ids of ``model``."""
    if tokenizer is None:
        return _char_vocab(model)
    # an LM's embedding table, found through nn.Module's __getattr__ (typed Tensor | Module for checkers)
    rows = model.get_input_embeddings().num_embeddings  # type: ignore[operator]
    size = len(lm_tokenizer(tokenizer))
    if size > rows:
        raise ValueError(
            f"--tokenizer {tokenizer} has {size} tokens, more than the model's {rows} embedding rows"
        )
    return True


def _fmt(v: object) -> str:
    return f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else str(v)


def diffract(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    domains = args.domain or ["code"]
    if len(domains) not in (1, len(args.tuned)):
        raise ValueError(f"give one --domain, or one per --tuned ({len(args.tuned)}), not {len(domains)}")
    domains = domains * len(args.tuned) if len(domains) == 1 else domains
    plan = D.RewindPlan(criteria=tuple(args.criteria), n_random=args.n_random)
    base = checkpoints.load(args.base)
    base_state = base.state()
    lines = [f"# litlab analyze diffract\n\nbase: `{args.base}`\n"]
    results, tuned_states = [], []
    for i, (src, domain) in enumerate(zip(args.tuned, domains)):
        tuned = checkpoints.load(src)
        state = tuned.state()
        if set(state) != set(base_state) or any(state[k].shape != base_state[k].shape for k in state):
            raise ValueError(f"{src} and the base {args.base} do not have the same tensors and shapes")
        tuned_states.append((tuned, state, domain))
        evaluate = domain != "none" and _reads_windows(tuned.model, args.tokenizer)
        block = min(args.block_size, getattr(tuned.model, "block_size", args.block_size))
        dom = domain_eval_set(domain, block, args.windows, args.tokenizer) if evaluate else None
        gen = domain_eval_set(args.general, block, args.windows, args.tokenizer) if evaluate else None
        with checkpoints.under_run_seed(args.seed):  # the random orderings a fit of that seed draws
            res = D.analyze_pair(
                tuned.model, base_state, state, base.n_heads, base.n_kv_heads, dom, gen, plan
            )
        folder = out / f"tuned{i}"
        D.write_figures(res, folder, f"{domain}")
        atomic_write_json(folder / "diffract.json", {"source": src, "domain": domain, **res})
        results.append({"source": src, "domain": domain, "scalars": res["scalars"]})
        lines.append(f"\n## tuned{i}: `{src}` (domain {domain})\n")
        if not evaluate:
            lines.append("\n(no loss evaluations: spectra and head ratios only)\n")
        lines.append("\n| quantity | value |\n|---|---|\n")
        lines += [f"| {k} | {_fmt(v)} |\n" for k, v in res["scalars"].items()]
        lines.append(f"\nfigures: {', '.join(p.name for p in sorted(folder.glob('*.png')))} in `{folder}`\n")
    if len(tuned_states) >= 2 and all(
        d != "none" and _reads_windows(t.model, args.tokenizer) for t, _, d in tuned_states[:2]
    ):
        (ta, sa, da), (_, sb, db) = tuned_states[:2]
        alphas = [j / (args.alphas - 1) for j in range(args.alphas)]
        block = min(args.block_size, getattr(ta.model, "block_size", args.block_size))
        sets = {f"L_{da}": da, f"L_{db}": db, f"L_general({args.general})": args.general}
        curves = {}
        for name, dom in sets.items():
            ev = D.evaluator(ta.model, domain_eval_set(dom, block, args.windows, args.tokenizer))
            curves[name] = [ev(D.interpolate(sa, sb, a)) for a in alphas]
        barriers = {k: D.barrier(alphas, v) for k, v in curves.items()}
        base_curve = D.evaluator(ta.model, domain_eval_set(da, block, args.windows, args.tokenizer))
        base_path = [base_curve(D.interpolate(base_state, sa, a)) for a in alphas]
        inter = {"alphas": alphas, "curves": curves, "barriers": barriers, "base_to_tuned0": base_path}
        results.append({"interpolation": inter})
        lines.append(
            "\n## interpolation tuned0 → tuned1\n\n| loss | barrier (max over α of loss − chord) |\n|---|---|\n"
        )
        lines += [f"| {k} | {_fmt(v)} |\n" for k, v in barriers.items()]
        _plot_interpolation(inter, out / "diffract_interpolation.png")
    atomic_write_json(out / "results.json", {"base": args.base, "results": results})
    atomic_write_text(out / "report.md", "".join(lines))
    print("".join(lines))
    print(f"report: {out / 'report.md'}")
    return 0


def _plot_interpolation(inter: dict, path: Path) -> None:
    import matplotlib  # a second to import: only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, ys in inter["curves"].items():
        ax.plot(inter["alphas"], ys, marker=".", label=name)
        ax.plot([0, 1], [ys[0], ys[-1]], ls="--", lw=0.7, color=ax.lines[-1].get_color())
    ax.set(xlabel="α (tuned0 → tuned1)", ylabel="loss (nats)", title="interpolation (dashed: chords)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


STATE_NAMES = {"pre": "pretrained", "post": "posttrained", "rand": "random"}


def complexity(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pairs = [c.partition("=") for c in args.checkpoints]
    if any(not name or not src for name, _, src in pairs):
        raise ValueError(f"--checkpoints takes NAME=SOURCE items, got {args.checkpoints}")
    plan = TCX.StrategyPlan(
        icl_k=tuple(args.icl_k),
        online_n=tuple(args.online_n),
        steps=args.steps,
        lora_bits=tuple(args.lora_bits),
        lora_examples=args.lora_examples,
    )
    dm = SumsTaskDataModule(args.task)
    frontiers: dict[str, Sequence[dict]] = {}
    summaries: dict[str, dict] = {}
    lines = [f"# litlab analyze complexity\n\ntask: `{args.task}` (run seed {args.seed}); payload bits\n"]
    for name, _, src in pairs:
        loaded = checkpoints.load(src)
        if not _char_vocab(loaded.model):
            raise ValueError(f"{src}: the local sums tasks need litlab's character vocabulary (a TinyGPT)")
        with checkpoints.under_run_seed(args.seed):  # the order and init a fit of that seed draws
            rows = TCX.measure_frontier(loaded.model, dm.examples(), dm.eval_pairs(), plan)
        frontiers[name], summaries[name] = rows, TCX.summarize(rows, args.deltas)
        lines.append(
            f"\n## {name}: `{src}`\n\n| strategy | knob | payload bits | script bits | perf |\n|---|---|---|---|---|\n"
        )
        lines += [
            f"| {r['strategy']} | {r['knob']} | {r['bits_payload']} | {r['bits_script']} | {r['perf']:.3f} |\n"
            for r in rows
        ]
        lines += ["\n"] + [f"- {k}: {_fmt(float(v))}\n" for k, v in summaries[name].items()]
    named: dict[str, Sequence[dict]] = {STATE_NAMES.get(k, k): v for k, v in frontiers.items()}
    red = TCX.reductions(named)
    if red:
        lines.append("\n## reductions R = C_lo(δ*) / C_hi(δ*), δ* = best perf of the lower checkpoint\n\n")
        lines += [f"- {k}: {_fmt(float(v))}\n" for k, v in red.items()]
    TCX.write_frontier_figure(frontiers, out / "frontier.png", args.task)
    lines.append("\nfigure: `frontier.png`\n")
    atomic_write_json(
        out / "results.json",
        {
            "task": args.task,
            "seed": args.seed,
            "checkpoints": {n: s for n, _, s in pairs},
            "frontiers": frontiers,
            "summaries": summaries,
            "reductions": red,
        },
    )
    atomic_write_text(out / "report.md", "".join(lines))
    print("".join(lines))
    print(f"report: {out / 'report.md'}")
    return 0


def _lockin_source(item: str) -> tuple[str, Path, Path]:
    """``[NAME=]RUN`` → (label, run folder, checkpoint)."""
    name, eq, rest = item.partition("=")
    label, raw = (name, rest) if eq and name and "/" not in name and not Path(item).exists() else ("", item)
    path = Path(raw)
    if path.is_dir():
        ckpt = path / "checkpoints" / "last.ckpt"
        if not ckpt.exists():
            raise CheckpointError(
                f"{raw}: no checkpoints/last.ckpt; analyze lockin needs the run's final weights (a run folder "
                "written by `litlab fit`, or a Lightning .ckpt)"
            )
        folder = path
    elif path.suffix == ".ckpt":
        if not path.exists():
            raise CheckpointError(f"checkpoint {path} does not exist")
        ckpt, folder = path, path.parent.parent if path.parent.name == "checkpoints" else path.parent
    else:
        raise CheckpointError(
            f"{raw}: analyze lockin takes a run folder or a Lightning .ckpt: it needs θ0, which it rebuilds from the "
            "checkpoint's hyper-parameters (#base); a Hugging Face model id or folder has none"
        )
    return label or folder.name, folder, ckpt


def _digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:12]


def _lockin_run(item: str, args: argparse.Namespace, bases: dict) -> dict:
    """One run: θ0 (``#base``) and θ_t from its checkpoint, its evaluation windows, the curvature basis at θ0
    (shared by runs with the same θ0 and calibration set), the final point recomputed, the logged trajectory."""
    label, folder, ckpt = _lockin_source(item)
    raw = torch.load(ckpt, map_location="cpu", weights_only=True)
    module0 = checkpoints.module_from_checkpoint(ckpt, load_state=False)
    lockin = (
        module0 if isinstance(module0, LI.LockInFT) else None
    )  # a LockInFT run: its own plan, cached basis
    plan0 = lockin.curv if lockin is not None else LI.CURVATURE
    base = checkpoints.from_module(f"{ckpt}#base", module0, base_only=True)
    tuned = checkpoints.load(str(ckpt))
    if not _char_vocab(base.model):
        raise CheckpointError(
            f"{item}: the local corpora need litlab's character vocabulary (a TinyGPT base)"
        )
    dm = checkpoints.datamodule_from_checkpoint(ckpt)
    dm_ok = isinstance(dm, DomainEvalData)
    task = args.task_domain or (dm.domain if dm_ok else None)
    if task is None:
        raise ConfigError(
            f"{item}: its DataModule ({type(dm).__name__ if dm is not None else 'none saved'}) names no task "
            f"domain for L_T; pass --task-domain (one of {', '.join(DOMAINS)})"
        )
    broad = args.broad_domain or (dm.general_domain if dm_ok else "text")
    own = dm_ok and (task, broad) == (dm.domain, dm.general_domain)
    if own:
        task_set, broad_set = dm.eval_set("domain"), dm.eval_set("general")
    else:
        block = min(args.block_size, getattr(base.model, "block_size", args.block_size))
        task_set, broad_set = (domain_eval_set(d, block, args.windows) for d in (task, broad))
    overrides = {"k": args.k, "lanczos_iters": args.lanczos_iters, "n_cal_windows": args.cal_windows}
    plan = dataclasses.replace(plan0, **{k: v for k, v in overrides.items() if v is not None})
    run_seed = checkpoints.run_seed_of(ckpt)
    with checkpoints.under_run_seed(run_seed if args.seed is None else args.seed):
        lanczos_seed = derive_seed("curvature")  # the start vector a LockInFT fit of that seed draws
    with checkpoints.under_run_seed(run_seed):
        base_seed = derive_seed("backbone")

    params = dict(base.model.named_parameters())
    flat = C.FlatParams.of(params)
    t_params = dict(tuned.model.named_parameters())
    if set(t_params) != set(params) or any(t_params[n].shape != params[n].shape for n in params):
        raise CheckpointError(
            f"{item}: the trained and the #base model do not have the same parameters and shapes"
        )
    theta0 = flat.flatten(params)
    cal = LI.calibration_batches(broad_set, plan.n_cal_windows)
    key = _digest(theta0, *(b["input_ids"] for b in cal)) + f"-{plan.k}-{plan.lanczos_iters}-{lanczos_seed}"
    if key not in bases:
        # a LockInFT run analysed with its own plan, windows and seed: the basis its fit used (cached per base)
        own_basis = lockin is not None and own and plan == plan0 and args.seed in (None, run_seed)
        path = (
            LI.basis_cache_path(lockin.base_cfg, plan, base_seed, lanczos_seed)
            if lockin is not None and own_basis
            else None
        )
        eig = LI.load_basis(path) if path is not None else None
        source = "the run's cached basis" if eig is not None else "Lanczos"
        if eig is None:
            eig = LI.broad_hessian_basis(base.model, cal, plan, lanczos_seed, flat, theta0)
            if path is not None:
                LI.save_basis(eig, path)
        f = C.lm_loss_fn(base.model, cal, flat, dict(base.model.named_buffers()))
        check = C.rayleigh_check(C.hessian_operator(f, theta0), eig.values, eig.vectors, args.rayleigh)
        bases[key] = {
            "name": f"basis{len(bases)}",
            "eig": eig,
            "source": source,
            "plan": {**dataclasses.asdict(plan), "lanczos_seed": lanczos_seed},
            "broad_domain": broad,
            "P": flat.size,
            "rayleigh": check,
            "runs": [],
        }
    basis = bases[key]
    basis["runs"].append(label)
    eig = basis["eig"]

    def losses(model, state):
        return {
            "L_T": float(D.lm_losses(model, state, task_set).mean()),
            "L_B": float(D.lm_losses(model, state, broad_set).mean()),
        }

    start = losses(base.model, base.state())
    final = losses(tuned.model, tuned.state())
    final["dL_B"] = final["L_B"] - start["L_B"]
    delta = (flat.flatten(t_params) - theta0).double()  # as LockInFT: subtract in float32, then to float64
    final.update(LI.point_probes(delta, eig))
    final["t"] = int(raw.get("global_step", 0))
    traj = raw.get("lock_in_trajectory") or None
    traj_source = "the checkpoint"
    if traj is None and (folder / "trajectory.json").exists():
        traj, traj_source = (
            json.loads((folder / "trajectory.json").read_text())["trajectory"],
            "trajectory.json",
        )
    logged_diff = None
    if traj is None:
        first = {**start, "t": 0, "dL_B": 0.0, "drift": 0.0, "h": 0.0, "f": 0.0, "c": 0.0}
        traj, traj_source = [first, {k: final[k] for k in first}], "θ0 and the final weights (none logged)"
    else:
        last = traj[-1]
        logged_diff = {
            k: abs(final[k] - last[k]) for k in ("L_T", "L_B", "dL_B", "drift", "h", "f") if k in last
        }
    setting: dict = {}
    if lockin is not None:
        setting = {**dataclasses.asdict(lockin.stab), "projection": lockin.projection}
    return {
        "label": label,
        "source": str(ckpt),
        "class": type(module0).__name__,
        "setting": setting,
        "task_domain": task,
        "broad_domain": broad,
        "eval_sets": "the run's DataModule" if own else f"{args.windows} windows of {args.block_size}",
        "basis": basis["name"],
        "start": start,
        "final": final,
        "trajectory": list(traj),
        "trajectory_source": traj_source,
        "logged_minus_recomputed": logged_diff,
    }


def lockin(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bases: dict[str, dict] = {}
    runs: dict[str, dict] = {}
    for item in args.run:
        r = _lockin_run(item, args, bases)
        label, n = r["label"], 2
        while label in runs:
            label, n = f"{r['label']}#{n}", n + 1
        r["label"] = label
        runs[label] = r
    labels = list(runs)
    pts = [p for r in runs.values() for p in r["trajectory"]]
    harm = LI.linear_fit([p["h"] for p in pts], [p["L_B"] for p in pts]) if len(pts) >= 3 else {}
    if harm:
        harm["spearman_h_dLB"] = LI.spearman([p["h"] for p in pts], [p["dL_B"] for p in pts])
        harm["n_points"] = len(pts)
        harm["collapse_r2"] = LI.collapse_r2([p["L_T"] for p in pts], [p["L_B"] for p in pts])
        harm["drift_r2"] = LI.drift_r2([p["drift"] for p in pts], [p["L_B"] for p in pts])
    if len(runs) >= 3:
        finals = [r["final"] for r in runs.values()]
        harm["spearman_final_h_dLB"] = LI.spearman([f["h"] for f in finals], [f["dL_B"] for f in finals])
    per_run_fit = {
        lab: LI.linear_fit([p["h"] for p in r["trajectory"]], [p["L_B"] for p in r["trajectory"]])["r2"]
        for lab, r in runs.items()
        if len(r["trajectory"]) >= 3
    }
    ref = runs[labels[0]]
    comparisons = {lab: LI.bifurcation(ref, runs[lab], args.matched_rel) for lab in labels[1:]}

    md = ["# litlab analyze lockin\n\n"]
    listed = ", ".join(f"`{lab}` (`{r['source']}`)" for lab, r in runs.items())
    md.append(f"runs: {listed}; reference `{labels[0]}`\n")
    md.append("\n## curvature basis at θ0 (broad-loss Hessian, Lanczos with full re-orthogonalisation)\n\n")
    md.append(
        "| basis | runs | source | P | k | iters | cal. windows | λ_1 | λ_k | max Rayleigh rel. diff | "
    )
    md.append("max residual | pairs with residual < 1e-2 |\n|" + "---|" * 12 + "\n")
    for b in bases.values():
        ck, pl = b["rayleigh"], b["plan"]
        ok = sum(r < 1e-2 for r in ck["residual"])
        md.append(
            f"| {b['name']} | {', '.join(b['runs'])} | {b['source']} | {b['P']} | {pl['k']} | {pl['lanczos_iters']} "
            f"| {pl['n_cal_windows']} ({b['broad_domain']}) | {_fmt(float(b['eig'].values[0]))} | "
            f"{_fmt(float(b['eig'].values[-1]))} | {_fmt(max(ck['rel_diff']))} | {_fmt(max(ck['residual']))} | "
            f"{ok}/{len(ck['residual'])} |\n"
        )
    md.append("\nRayleigh check (a fresh Hessian product per pair): q_i = v_iᵀHv_i / v_iᵀv_i against λ_i\n\n")
    md.append("| basis | i | λ_i | q_i | residual |\n|---|---|---|---|---|\n")
    for b in bases.values():
        ck = b["rayleigh"]
        for i in range(min(5, len(ck["value"]))):
            md.append(
                f"| {b['name']} | {i + 1} | {_fmt(ck['value'][i])} | {_fmt(ck['rayleigh'][i])} | "
                f"{_fmt(ck['residual'][i])} |\n"
            )
    md.append("\n## final points (recomputed from the weights against the basis above)\n\n")
    md.append(
        "| run | setting | L_T | L_B | ΔL_B | drift | h | stiff fraction f | f / (k/P) | c | trajectory from | "
    )
    md.append("max abs(logged - recomputed) |\n|" + "---|" * 12 + "\n")
    for lab, r in runs.items():
        f = r["final"]
        setting = ", ".join(f"{k} {v}" for k, v in r["setting"].items()) or r["class"]
        diff = r["logged_minus_recomputed"]
        md.append(
            f"| {lab} | {setting} | {_fmt(f['L_T'])} | {_fmt(f['L_B'])} | {_fmt(f['dL_B'])} | {_fmt(f['drift'])} "
            f"| {_fmt(f['h'])} | {_fmt(f['f'])} | {_fmt(f['f'] / f['f_floor'])} | {_fmt(f['c'])} | "
            f"{r['trajectory_source']} | {_fmt(max(diff.values())) if diff else '-'} |\n"
        )
    if harm:
        md.append("\n## harm signal against the broad loss (pooled over the runs' (run, t) points)\n\n")
        md.append(f"- linear fit L_B = {_fmt(harm['intercept'])} + {_fmt(harm['slope'])} · h_t: ")
        md.append(f"R² {_fmt(harm['r2'])} over {harm['n_points']} points\n")
        md.append(f"- Spearman(h_t, ΔL_B) pooled: {_fmt(harm['spearman_h_dLB'])}\n")
        if "spearman_final_h_dLB" in harm:
            md.append(f"- Spearman(final h, final ΔL_B) over the {len(runs)} runs: ")
            md.append(f"{_fmt(harm['spearman_final_h_dLB'])}\n")
        md.append(f"- collapse R²_T (isotonic L_B on L_T) {_fmt(harm['collapse_r2'])}; ")
        md.append(f"R²_d (isotonic L_B on drift) {_fmt(harm['drift_r2'])}\n")
        md += [f"- {lab}: R² of its own points {_fmt(v)}\n" for lab, v in per_run_fit.items()]
        md.append("\n(the trajectories' h_t and f_t are the ones each run logged, against its own basis)\n")
    if comparisons:
        md.append(f"\n## bifurcation against `{labels[0]}`\n\n")
        md.append(
            "| run | ΔL_T | drift ratio | f ratio | L_B gain (final) | witness | curve dev. (signed) | "
        )
        md.append("ref. noise | L* | gain at L* | §7.6 check |\n|" + "---|" * 11 + "\n")
        for lab, c in comparisons.items():
            md.append(
                f"| {lab} | {_fmt(c['dL_T'])} | {_fmt(c['drift_ratio'])} | {_fmt(c['f_ratio'])} | "
                f"{_fmt(c['broad_gain'])} | {c['witness']} | {_fmt(c['dev'])} ({_fmt(c['dev_signed'])}, "
                f"{c['n_in_range']} pts) | {_fmt(c['ref_noise'])} | {_fmt(c['L_star'])} | {_fmt(c['gain_matched'])} "
                f"| {'pass' if c['check_7_6'] else 'fail'} |\n"
            )
        md.append(
            "\n§7.6 check: |ΔL_T| < 0.05, drift ratio in [0.95, 1.05], L_B gain >= 0.3; witness: drift within 10 %, "
            "ΔL_B differing by >= 1.5x; curve dev.: mean |L_B - Φ_ref(L_T)| over the run's points in the "
            "reference's L_T range; gain at L*: L_B(ref) - L_B(run) at each one's first point with L_T <= L*.\n"
        )
    spectra = {
        b["name"]: {"ritz_all": b["eig"].ritz_all.tolist(), "rayleigh": b["rayleigh"]} for b in bases.values()
    }
    figures = LI.write_analysis_figures(runs, spectra, harm, out)
    md.append(f"\nfigures: {', '.join(f'`{p.name}`' for p in figures)}\n")
    results = {
        "runs": {lab: {k: v for k, v in r.items() if k != "label"} for lab, r in runs.items()},
        "bases": {
            b["name"]: {
                **{k: v for k, v in b.items() if k not in ("eig", "name")},
                "values": b["eig"].values.tolist(),
                "lanczos_residuals": b["eig"].residuals.tolist(),
                "ritz_all": b["eig"].ritz_all.tolist(),
            }
            for b in bases.values()
        },
        "harm_fit": {**harm, "per_run_r2": per_run_fit},
        "reference": labels[0],
        "bifurcation": comparisons,
    }
    atomic_write_json(out / "results.json", results)
    atomic_write_text(out / "report.md", "".join(md))
    print("".join(md))
    print(f"report: {out / 'report.md'}")
    return 0
