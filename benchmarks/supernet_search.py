"""Two-stage NAS on a CPU-trained OFA MobileNetV3 supernet: best subnet
accuracy vs evaluations for CoLLM-NAS (local SmolLM2) and OFA's constrained
evolution under one FLOPs constraint, and seconds per subnet score.

Stage 1 trains (2 epochs on 6k images; 1 on 3k with --quick) the small OFA supernet (`space=ofa_mbv3_small`: width 0.5,
24-32 px, sandwich rule with progressive shrinking and in-place distillation)
on a Fashion-MNIST subset, once; `--checkpoint` reuses a trained one. Stage 2
runs each strategy through the library (SearchLoop + LocalExecutor) with the
`supernet` evaluator (BN recalibrated per subnet, validation accuracy). The
FLOPs limit is the median FLOPs of 200 random subnets, so half the space is
infeasible and the constraint binds. CoLLM-NAS's claim is 4-10x fewer
evaluations than evolution for the same accuracy; the JSON records, per
strategy, how many evaluations it needed to reach evolution's final best.

    python benchmarks/supernet_search.py                         # ~20-30 min on 2 CPU cores
    python benchmarks/supernet_search.py --quick                 # smaller supernet run and budgets
    python benchmarks/supernet_search.py --checkpoint runs/sn/supernet.pt
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from collm_nb201 import collm_counts, local_llm, plot  # noqa: E402

from nas.core.constraint import Constraint  # noqa: E402
from nas.core.trial import best_so_far, read_history  # noqa: E402
from nas.io import atomic_write_json, atomic_write_text, read_json  # noqa: E402
from nas.search.loop import LocalExecutor, SearchLoop  # noqa: E402
from nas.search.spec import Component, SearchSpec  # noqa: E402

DATA = {"name": "fashion_mnist"}
STRATEGIES: dict[str, tuple[str, dict[str, Any]]] = {  # label -> (registered strategy, params)
    "evolution": ("evolution", {"population_size": 10, "parent_ratio": 0.25, "mutation_ratio": 0.5,
                                "mutate_prob": 0.1}),
    "random": ("random", {"unique": True}),
    "collm": ("collm", {"candidates_per_iteration": 5, "temperature": 0.6, "navigator_memory": True,
                        "generator_memory": False}),
}
PAPER = {"claim": "CoLLM-NAS reaches OFA-S accuracy with 4x fewer evaluations than OFA's evolution "
                  "(77.6 % top-1 at 297 MFLOPs on ImageNet)", "source": "CoLLM-NAS, seed 003"}


def space_config() -> dict[str, Any]:
    """The preset as `nas search space=ofa_mbv3_small data=fashion_mnist` composes it."""
    from nas.config import compose_config

    return compose_config(["space=ofa_mbv3_small", f"data={DATA['name']}"])["space"]


def train(out: Path, quick: bool, seed: int) -> Path:
    from supernets.train import SupernetSettings, train_supernet

    cfg = yaml.safe_load((ROOT / "conf" / "supernet" / "default.yaml").read_text())
    cfg.pop("out"), cfg.pop("params")
    cfg.update(epochs=1 if quick else 2, train_subset=3000 if quick else 6000, val_subset=500)
    settings = SupernetSettings(**cfg)
    trained = train_supernet(space_config(), {}, DATA, settings, seed, out, progress=True)
    return trained.path


def flops_limit(seed: int = 0, samples: int = 200) -> float:
    from nas.spaces import SPACES

    cfg = space_config()
    space = SPACES.create(cfg.pop("name"), cfg)
    rng = np.random.default_rng(seed)
    return float(np.median([space.cost(space.sample(rng)).flops for _ in range(samples)]))


def run(label: str, name: str, params: dict[str, Any], seed: int, trials: int, evaluator: dict[str, Any],
        limit: float, workdir: Path) -> dict[str, Any]:
    space = space_config()
    spec = SearchSpec(space=Component(space.pop("name"), space), strategy=Component(name, params),
                      evaluator=Component("supernet", evaluator), seed=seed, trials=trials,
                      constraint=Constraint(flops=limit))
    run_dir = workdir / f"{label}_s{seed}"
    start = time.perf_counter()
    built = spec.build_space()
    SearchLoop(spec, run_dir, LocalExecutor(spec.build_evaluator(built), None), progress=False).run_search()
    history = read_history(run_dir / "history.jsonl")
    curve = best_so_far(history)
    curve = [c if c is not None else float("nan") for c in curve]
    curve += [curve[-1]] * (trials - len(curve))
    scored = [r for r in history if r.accuracy is not None and not r.cached]
    return {"curve": curve, "seconds": time.perf_counter() - start,
            "score_seconds": [r.cost_seconds for r in scored],
            "over_limit": sum(1 for r in history if (r.flops or 0) > limit),
            "summary": read_json(run_dir / "summary.json")}


def evaluations_to_reach(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, c in enumerate(curve) if c >= target), None)


def summarise(runs: list[dict[str, Any]], target: float | None) -> dict[str, Any]:
    curves = np.array([r["curve"] for r in runs], dtype=float)
    def std(x):
        return float(np.nanstd(x, ddof=1)) if len(x) > 1 else 0.0
    out = {"seeds": len(runs), "final_best": {"mean": round(float(np.nanmean(curves[:, -1])), 3),
                                             "std": round(std(curves[:, -1]), 3)},
           "curve_mean": [round(float(x), 3) for x in np.nanmean(curves, axis=0)],
           "curve_std": [round(std(curves[:, i]), 3) for i in range(curves.shape[1])],
           "seconds_per_run": round(float(np.mean([r["seconds"] for r in runs])), 1),
           "seconds_per_subnet_score": round(float(np.mean([s for r in runs for s in r["score_seconds"]])), 3),
           "evaluated_over_limit": sum(r["over_limit"] for r in runs)}
    if target is not None:
        out["evaluations_to_evolution_best"] = [evaluations_to_reach(r["curve"], target) for r in runs]
    return out


def markdown(results: dict[str, Any], limit: float) -> str:
    rows = [f"FLOPs limit {limit / 1e6:.2f} M (median of random subnets).", "",
            "| strategy | seeds | final best (%) | evals to evolution's best | s / subnet score |",
            "|---|---|---|---|---|"]
    for label, res in results.items():
        reach = res.get("evaluations_to_evolution_best", "-")
        rows.append(f"| {label} | {res['seeds']} | {res['final_best']['mean']:.2f} ± {res['final_best']['std']:.2f} "
                    f"| {reach} | {res['seconds_per_subnet_score']:.2f} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=None, help="a trained ofa_mbv3_small supernet.pt to reuse")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=2, help="seeds for evolution and random")
    ap.add_argument("--llm-seeds", type=int, default=1, help="seeds for collm (the local LLM is slow)")
    ap.add_argument("--quick", action="store_true", help="1-epoch supernet on 3k images, 20 trials, 1 seed each")
    ap.add_argument("--no-collm", action="store_true")
    ap.add_argument("--cache", type=Path, default=None, help="LLM reply cache root (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "supernet_search.json")
    args = ap.parse_args()
    if args.quick:
        args.trials, args.seeds, args.llm_seeds = 20, 1, 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt = args.checkpoint or train(ROOT / "runs" / "bench_supernet_ofa_mbv3_small", args.quick, 0)
        train_wall = time.perf_counter() - start
        meta = read_json(ckpt.with_suffix(".json"))
        limit = flops_limit()
        evaluator = {"checkpoint": str(ckpt), "data": DATA, "recal_batches": 5, "batch_size": 128,
                     "val_subset": 1000}
        results: dict[str, Any] = {}
        counts: dict[str, Any] = {}
        target = None
        for label, (name, params) in STRATEGIES.items():
            if name == "collm" and args.no_collm:
                continue
            seeds = args.llm_seeds if name == "collm" else args.seeds
            runs = []
            for seed in range(seeds):
                cache = (args.cache or work / "llm-cache") / f"seed{seed}"
                p = {**params, "llm": local_llm(cache)} if name == "collm" else params
                runs.append(run(label, name, p, seed, args.trials, evaluator, limit, work))
            results[label] = {"strategy": name, "params": params, **summarise(runs, target)}
            if name == "collm":
                counts = collm_counts(runs)
            if label == "evolution":
                target = results[label]["final_best"]["mean"]
                results[label] = {"strategy": name, "params": params, **summarise(runs, target)}
            print(f"{label:9s} ({seeds} seeds) best {results[label]['final_best']['mean']:.2f} "
                  f"± {results[label]['final_best']['std']:.2f}, {results[label]['seconds_per_subnet_score']:.2f} "
                  "s per subnet score", flush=True)
    payload = {"benchmark": "supernet_search", "space": "ofa_mbv3 (conf/space/ofa_mbv3_small.yaml)",
               "data": DATA["name"], "metric": "validation accuracy of the subnet with inherited weights (%)",
               "checkpoint": {"path": str(ckpt), "sha256": meta.get("sha256"),
                              "train_wall_seconds": round(train_wall, 1) if args.checkpoint is None else None},
               "flops_limit": limit, "trials": args.trials, "quick": args.quick,
               "strategies": results, "collm": counts, "paper": PAPER,
               "command": " ".join(["python benchmarks/supernet_search.py", *sys.argv[1:]]),
               "wall_seconds": round(time.perf_counter() - start, 1)}
    atomic_write_json(args.out, payload)
    plot(results, args.trials, args.out.with_suffix(".png"), xlabel="subnets evaluated",
         ylabel="best validation accuracy so far (%)",
         title=f"OFA-MBv3 (small) supernet on Fashion-MNIST, FLOPs <= {limit / 1e6:.2f} M", ylim=None)
    atomic_write_text(args.out.with_suffix(".md"), markdown(results, limit))
    print(f"wrote {args.out} (+ .png, .md)")


if __name__ == "__main__":
    main()
