"""The `nas` command.

  nas search [hydra overrides] [-m]   run a search (Hydra config in conf/)
  nas compare DIR... [--at N ...]     aggregate runs: mean ± std, curves with bands
  nas arch validate FILE              check a block file or model .py (exit 0 valid, 1 not)
  nas arch show FILE [--json]         key, width, params, FLOPs, PyTorch source
  nas arch draw FILE -o OUT.png       draw a block file's graphs
  nas train ARCH [overrides]          train one model .py, block file or NB201 cell (data=, recipe=, engine=)
  nas train-supernet [overrides]      train a space's weight-sharing supernet (space=, data=, supernet.*=, out=)
  nas knowledge ingest|search|tree|stats   the design-knowledge store (papers -> tagged ideas)
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from nas.errors import NasError

GROUPS = ("space", "strategy", "evaluator", "runner", "data", "recipe", "engine", "llm", "knowledge")


def fail(message: str) -> None:
    print(f"nas: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def available(group: str) -> list[str]:
    folder = resources.files("conf") / group
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def check_group_overrides(args: list[str]) -> None:
    """Hydra's own message for an unknown option is many lines; say it in one."""
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if not sep or key not in GROUPS or "(" in value:
            continue
        valid = available(key)
        for name in value.split(","):
            if name.strip() not in valid:
                fail(f"unknown {key} '{name.strip()}' (valid: {', '.join(valid)})")


def compose_config(overrides: list[str]) -> dict[str, Any]:
    """The composed config (`conf/config.yaml` + overrides), resolved, for commands outside `nas search`."""
    from hydra import compose, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from nas.errors import ConfigError

    try:
        with initialize_config_module("conf", version_base="1.3"):
            cfg = compose("config", overrides=overrides)
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(str(err).splitlines()[0]) from None


def execute(spec, run_dir: Path, runner: dict[str, Any], progress: bool) -> dict[str, Any]:
    """Run one search with the configured runner; `nas` itself never needs Prefect."""
    import logging

    from nas.search.loop import LocalExecutor, SearchLoop
    from nas.search.rundir import RunDir

    # One INFO line per Prefect API call (httpx) or LLM call (httpx2, the openai SDK's), and model loading.
    for noisy in ("httpx", "httpx2", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    space = spec.build_space()
    spec.build_strategy(space)  # validate before any work starts
    evaluator = spec.build_evaluator(space)
    RunDir(run_dir).prepare(spec.identity())
    name = runner.get("name", "prefect")
    if name == "local":
        executor = LocalExecutor(evaluator, spec.seed if evaluator.uses_seed else None)
        return SearchLoop(spec, run_dir, executor, progress=progress, runner="local").run_search()
    if name == "prefect":
        from flows.search import run_search_flow

        return run_search_flow(spec, run_dir, workers=int(runner.get("workers", 4)),
                               retries=int(runner.get("retries", 1)), progress=progress)
    raise NasError(f"unknown runner '{name}' (valid: {', '.join(available('runner'))})")


def _search_entry() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    @hydra.main(config_path="pkg://conf", config_name="config", version_base="1.3")
    def search(cfg: DictConfig) -> None:
        from nas.search.spec import SearchSpec

        try:
            container = OmegaConf.to_container(cfg, resolve=True)
            spec = SearchSpec.from_config(container)
            run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
            summary = execute(spec, run_dir, container.get("runner") or {}, bool(container.get("progress", True)))
        except NasError as err:
            fail(str(err))
        print_summary(run_dir, summary)

    search()


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
    from nas.compare import compare, render_table

    parser = argparse.ArgumentParser(prog="nas compare", description="Aggregate search runs.")
    parser.add_argument("dirs", nargs="+", type=Path, help="run or multirun directories")
    parser.add_argument("--at", nargs="+", type=int, default=[25, 50, 100],
                        help="trial counts to report (default: 25 50 100)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: the first DIR)")
    args = parser.parse_args(argv)
    out = args.out or args.dirs[0]
    try:
        table = compare(args.dirs, out, args.at)
    except NasError as err:
        fail(str(err))
    print(render_table(table, args.at), end="")
    print(f"wrote {out / 'compare.json'}, {out / 'compare.md'}, {out / 'compare.png'}")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if command == "search":
        check_group_overrides(rest)
        sys.argv = ["nas search", *rest]
        _search_entry()
    elif command == "compare":
        _compare(rest)
    elif command == "arch":
        from nas.cli_arch import main as arch_main

        arch_main(rest)
    elif command == "train":
        from nas.cli_train import main as train_main

        train_main(rest)
    elif command == "train-supernet":
        from nas.cli_supernet import main as supernet_main

        supernet_main(rest)
    elif command == "knowledge":
        from nas.cli_knowledge import main as knowledge_main

        knowledge_main(rest)
    else:
        fail(f"unknown command '{command}' (valid: search, compare, arch, train, train-supernet, knowledge)")


if __name__ == "__main__":
    main()
