"""``litlab analyze <kind>``: training-free analyses of saved checkpoints (the analysis family,
``litlab.lit_modules.analysis``). Each writes a report folder (``report.md``, ``results.json``, figures).

    litlab analyze diffract --base <src> --tuned <src> [--tuned <src> ...] [--domain code] [--out DIR]
    litlab analyze complexity --checkpoints pre=<src> post=<src> random=<src> [--task words] [--out DIR]

A source is a Lightning checkpoint (``.ckpt``; adapters merged; ``<ckpt>#base`` is the module as its constructor
builds it, before training: the frozen base of an adapter run, θ0 of a litlab CPT run), a run folder (its
``checkpoints/last.ckpt``), or a Hugging Face folder / hub id. With two or more ``--tuned`` the report adds the
interpolation between the first two (and between the base and the first). Losses (swap test, head rewinding,
interpolation) are evaluated on the local domain corpora (``litlab.datamodules.domain_corpus``) for models with
litlab's character vocabulary; other models get the spectral table and head heatmaps (``--domain none``).
``complexity`` measures each checkpoint's rate–accuracy frontier (baseline, ICL k, online coding n, LoRA and its
quantised payloads; ``lit_modules.analysis.task_complexity``) on a local sums task and reads C(δ) off it; the
names ``pre``/``post``/``random`` also give the reductions R.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from litlab.datamodules.domain_corpus import DOMAINS
from litlab.datamodules.sums_task import TASKS, SumsTaskDataModule
from litlab.lit_modules.analysis import checkpoints
from litlab.lit_modules.analysis import diffract as D
from litlab.lit_modules.analysis import task_complexity as TCX
from litlab.lit_modules.analysis.contract import domain_eval_set
from litlab.lit_modules.core.corpus import CharTokenizer
from litlab.lit_modules.core.io import atomic_write_json, atomic_write_text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="litlab analyze", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="kind", required=True)
    d = sub.add_parser(
        "diffract", help="spectra, swap test, head rewinding, interpolation of CPT checkpoints"
    )
    d.add_argument(
        "--base", required=True, help="checkpoint / run folder / HF id of θ0 (append #base: see above)"
    )
    d.add_argument("--tuned", required=True, action="append", help="a tuned checkpoint (repeat for several)")
    d.add_argument(
        "--domain",
        action="append",
        choices=[*DOMAINS, "none"],
        help="the CPT domain of each --tuned (one value: for all; default code; none: spectra only)",
    )
    d.add_argument("--general", default="text", choices=DOMAINS, help="the general domain (default text)")
    d.add_argument("--criteria", nargs="+", default=list(D.CRITERIA), choices=D.CRITERIA)
    d.add_argument("--n-random", type=int, default=3)
    d.add_argument("--seed", type=int, default=0, help="seed of the random orderings")
    d.add_argument("--windows", type=int, default=64, help="evaluation windows per domain")
    d.add_argument("--block-size", type=int, default=64)
    d.add_argument("--alphas", type=int, default=11, help="points of the interpolation grid [0, 1]")
    d.add_argument("--out", default="runs/analyze/diffract", help="report folder")
    c = sub.add_parser("complexity", help="rate–accuracy frontiers and C(target) of checkpoints on a task")
    c.add_argument(
        "--checkpoints", nargs="+", required=True, metavar="NAME=SRC", help="pre=… post=… random=…"
    )
    c.add_argument("--task", default="words", choices=sorted(TASKS))
    c.add_argument("--seed", type=int, default=0, help="order of the task's examples; epoch order, LoRA init")
    c.add_argument("--deltas", type=float, nargs="+", default=[0.25, 0.40], help="targets δ of C(δ)")
    c.add_argument("--icl-k", type=int, nargs="*", default=list(TCX.PLAN.icl_k))
    c.add_argument("--online-n", type=int, nargs="*", default=list(TCX.PLAN.online_n))
    c.add_argument(
        "--steps", type=int, default=TCX.PLAN.steps, help="fine-tuning steps (online coding, LoRA)"
    )
    c.add_argument("--lora-bits", type=int, nargs="*", default=list(TCX.PLAN.lora_bits))
    c.add_argument("--lora-examples", type=int, default=TCX.PLAN.lora_examples, help="0: no LoRA points")
    c.add_argument("--out", default="runs/analyze/complexity", help="report folder")
    return p


def _char_vocab(model: torch.nn.Module) -> bool:
    head = getattr(model, "lm_head", None)
    return isinstance(head, torch.nn.Linear) and head.out_features == CharTokenizer().vocab_size


def _fmt(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) and math.isfinite(v) else str(v)


def diffract(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    domains = args.domain or ["code"]
    if len(domains) not in (1, len(args.tuned)):
        raise ValueError(f"give one --domain, or one per --tuned ({len(args.tuned)}), not {len(domains)}")
    domains = domains * len(args.tuned) if len(domains) == 1 else domains
    plan = D.RewindPlan(criteria=tuple(args.criteria), n_random=args.n_random, random_seed=args.seed)
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
        evaluate = domain != "none" and _char_vocab(tuned.model)
        block = min(args.block_size, getattr(tuned.model, "block_size", args.block_size))
        dom = domain_eval_set(domain, block, args.windows) if evaluate else None
        gen = domain_eval_set(args.general, block, args.windows) if evaluate else None
        res = D.analyze_pair(tuned.model, base_state, state, base.n_heads, base.n_kv_heads, dom, gen, plan)
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
    if len(tuned_states) >= 2 and all(d != "none" and _char_vocab(t.model) for t, _, d in tuned_states[:2]):
        (ta, sa, da), (_, sb, db) = tuned_states[:2]
        alphas = [j / (args.alphas - 1) for j in range(args.alphas)]
        block = min(args.block_size, getattr(ta.model, "block_size", args.block_size))
        sets = {f"L_{da}": da, f"L_{db}": db, f"L_general({args.general})": args.general}
        curves = {}
        for name, dom in sets.items():
            ev = D.evaluator(ta.model, domain_eval_set(dom, block, args.windows))
            curves[name] = [ev(D.interpolate(sa, sb, a)) for a in alphas]
        barriers = {k: D.barrier(alphas, v) for k, v in curves.items()}
        base_curve = D.evaluator(ta.model, domain_eval_set(da, block, args.windows))
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
    import matplotlib

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
        seed=args.seed,
    )
    dm = SumsTaskDataModule(args.task, args.seed)
    frontiers, summaries = {}, {}
    lines = [f"# litlab analyze complexity\n\ntask: `{args.task}` (seed {args.seed}); payload bits\n"]
    for name, _, src in pairs:
        loaded = checkpoints.load(src)
        if not _char_vocab(loaded.model):
            raise ValueError(f"{src}: the local sums tasks need litlab's character vocabulary (a TinyGPT)")
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
    named = {STATE_NAMES.get(k, k): v for k, v in frontiers.items()}
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


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.kind == "diffract":
        return diffract(args)
    if args.kind == "complexity":
        return complexity(args)
    print(f"litlab analyze: unknown kind {args.kind}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
