"""The `nas` command.

  nas search [hydra overrides] [-m]   run a search (Hydra config in nas/conf/)
  nas compare DIR... [--baseline S]   aggregate runs: mean ± std, curves, paired tests, Pareto fronts
  nas arch validate FILE              check a block file or model .py (exit 0 valid, 1 not)
  nas arch show FILE [--json]         key, width, params, FLOPs, PyTorch source
  nas arch draw FILE -o OUT.png       draw a block file's graphs
  nas train ARCH [overrides]          train one model .py, block file or NB201 cell (data=, recipe=, engine=)
  nas train-supernet [overrides]      train a space's weight-sharing supernet (space=, data=, supernet.*=, out=)
  nas knowledge ingest|search|tree|stats   the design-knowledge store (papers -> tagged ideas)
  nas export RUN_DIR [--out DIR]      the best model: PyTorch source + state dict, ONNX (TorchScript fallback)
  nas serve [overrides]               serve every flow as a Prefect deployment (schedules from nas/conf/serve)
  nas regress [--suite S]             the benchmark-regression suite against stored baselines
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from nas.errors import ConfigError, NasError
from nas.secrets import install_log_scrubbing

# Commands with their own module (imported on use: `nas` starts fast).
SUBCOMMANDS = {"arch": "nas.cli.arch", "train": "nas.cli.train", "train-supernet": "nas.cli.supernet",
               "knowledge": "nas.cli.knowledge", "export": "nas.cli.export", "serve": "nas.cli.serve",
               "regress": "nas.cli.regress"}
GROUPS = ("space", "strategy", "evaluator", "runner", "data", "recipe", "engine", "llm", "knowledge")


def fail(message: str) -> None:
    from nas.secrets import scrub

    print(f"nas: error: {scrub(message)}", file=sys.stderr)
    raise SystemExit(2)


def available(group: str) -> list[str]:
    folder = resources.files("nas.conf") / group
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def validate_group_overrides(args: list[str]) -> None:
    """Hydra's own message for an unknown option is many lines; say it in one (ConfigError)."""
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if sep and key == "experiment" and not arg.startswith("+"):  # not in the defaults list
            raise ConfigError(f"experiment presets are added, not overridden: write +experiment={value}")
        if not sep or key not in (*GROUPS, "experiment") or "(" in value:
            continue
        valid = available(key)
        for name in value.split(","):
            if name.strip() not in valid:
                raise ConfigError(f"unknown {key} '{name.strip()}' (valid: {', '.join(valid)})")


def check_group_overrides(args: list[str]) -> None:
    try:
        validate_group_overrides(args)
    except ConfigError as err:
        fail(str(err))


def compose_config(overrides: list[str]) -> dict[str, Any]:
    """The composed config (`nas/conf/config.yaml` + overrides), resolved, for commands outside `nas search`."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_module("nas.conf", version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(one_line(err)) from None


def one_line(err: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages in one line, without their
    `+key` hint (a key the config lacks is a typo, not something to append)."""
    skip = ("To append to your", "Set the environment variable HYDRA_FULL_ERROR", "See https://", "full_key:",
            "object_type=", "reference_type=", "Did you mean to override")
    parts: list[str] = []
    listing = False  # "Available options in 'g':" is followed by one option per line
    for line in str(err).split("Config search path:")[0].splitlines():
        line = line.strip().rstrip(".")
        if not line or line.startswith(skip):
            continue
        if listing:
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
        else:
            parts.append(line)
            listing = line.endswith(":")
    return "; ".join(parts) or type(err).__name__


def execute(spec, run_dir: Path, runner: dict[str, Any], progress: bool) -> dict[str, Any]:
    """Run one search with the configured runner; `nas` itself never needs Prefect."""
    import logging

    from nas.search.loop import LocalExecutor, SearchLoop
    from nas.search.rundir import RunDir

    # One INFO line per Prefect API call (httpx) or LLM call (httpx2, the openai SDK's), and model loading.
    for noisy in ("httpx", "httpx2", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    spec.check_pairing()
    space = spec.build_space()
    spec.check_budget(space)
    spec.build_strategy(space)  # validate before any work starts
    evaluator = spec.build_evaluator(space)
    run = RunDir(run_dir)
    with run.lock():  # held by this process (the flow runs in it) until the search ends
        run.prepare(spec.identity(), spec.batch_size)  # a bad run dir fails before Prefect starts
        name = runner.get("name", "prefect")
        if name == "local":
            from nas.report import write_run_report

            executor = LocalExecutor(evaluator, spec.seed if evaluator.uses_seed else None)
            summary = SearchLoop(spec, run_dir, executor, progress=progress, runner="local").run_search()
            write_run_report(run_dir, summary)
            return summary
        from nas.orchestration.flows.search import run_search_flow  # prefect, processes, dask, ray: nas/orchestration/flows/runners.py

        return run_search_flow(spec, run_dir, runner=runner, retries=int(runner.get("retries", 1)),
                               progress=progress)


def print_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    print(f"run dir: {run_dir}")
    best = summary.get("best")
    if best is None:
        print(f"best: none ({summary['trials']} trials, all failed)")
        return
    print(f"best: {best['accuracy']:.2f}% {best['encoding']} key={best['key']} "
          f"(trial {best['trial']} of {summary['trials']}, {summary['wall_seconds']:.1f}s, "
          f"{summary['cache_hits']} cached)")


def _compare(argv: list[str]) -> None:
    from nas.compare import BANDS, compare, render_report

    parser = argparse.ArgumentParser(prog="nas compare", description="Aggregate search runs into a statistics report.")
    parser.add_argument("dirs", nargs="+", type=Path, help="run or multirun directories")
    parser.add_argument("--at", nargs="+", type=int, default=None,
                        help="trial counts to report (default: quartiles of the shortest run's length)")
    parser.add_argument("--baseline", default=None,
                        help="group label or strategy name to test every other group against (paired by seed)")
    parser.add_argument("--band", choices=BANDS, default="std",
                        help="curve band: mean ± 1 std, or median and interquartile range (default: std)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: the first DIR)")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="compare runs that differ in dataset, space, evaluator, budget or constraint "
                             "(one group per setting) instead of refusing")
    args = parser.parse_args(argv)
    out = args.out or args.dirs[0]
    try:
        report = compare(args.dirs, out, args.at, baseline=args.baseline, band=args.band,
                         allow_mixed=args.allow_mixed)
    except NasError as err:
        fail(str(err))
    for warning in report["warnings"]:
        print(f"nas: warning: compare: {warning}", file=sys.stderr)
    print(render_report(report), end="")
    written = ["compare.json", "compare.md", *(f for f in report["figures"].values() if f)]
    print("wrote " + ", ".join(str(out / f) for f in written))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    install_log_scrubbing()  # every log line, search.log included, is written without secrets
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if command == "search":
        # every job's config is checked before Hydra writes anything
        from nas.cli.search import main as search

        search(rest)
    elif command == "compare":
        _compare(rest)
    elif command in SUBCOMMANDS:
        import importlib

        importlib.import_module(SUBCOMMANDS[command]).main(rest)
    else:
        fail(f"unknown command '{command}' (valid: {', '.join(['search', 'compare', *SUBCOMMANDS])})")

if __name__ == "__main__":
    main()
