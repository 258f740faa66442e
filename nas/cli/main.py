"""The `nas` command.

  nas search [hydra overrides] [-m]   run a search (Hydra config in conf/)
  nas compare DIR... [--baseline S]   aggregate runs: mean ± std, curves, paired tests, Pareto fronts
  nas arch validate FILE              check a block file or model .py (exit 0 valid, 1 not)
  nas arch show FILE [--json]         key, width, params, FLOPs, PyTorch source
  nas arch draw FILE -o OUT.png       draw a block file's graphs
  nas train ARCH [overrides]          train one model .py, block file or NB201 cell (data=, recipe=, engine=)
  nas train-supernet [overrides]      train a space's weight-sharing supernet (space=, data=, supernet.*=, out=)
  nas knowledge ingest|search|tree|stats   the design-knowledge store (papers -> tagged ideas)
  nas export RUN_DIR [--out DIR]      the best model: PyTorch source + state dict, ONNX (TorchScript fallback)
  nas serve [--list] [overrides]      serve prefect.yaml's deployments on a local Prefect Runner
  nas ui [--no-start]                 the Prefect UI's address (the local server's, started if none runs)
  nas regress [--suite S]             the benchmark-regression suite against stored baselines
"""

from __future__ import annotations

import importlib
import os
import sys

from nas.errors import ConfigError
from nas.lazy import LazyImport
from nas.secrets import install_log_scrubbing, scrub
from nas.terminal import printable, safe_streams

# the config registries, only for a command with overrides: `nas --help` stays light
config = LazyImport("nas.config")

# One module per command, imported on use: `nas` starts fast.
COMMANDS = {"search": "nas.cli.search", "compare": "nas.cli.compare", "arch": "nas.cli.arch",
            "train": "nas.cli.train", "train-supernet": "nas.cli.supernet", "knowledge": "nas.cli.knowledge",
            "export": "nas.cli.export", "serve": "nas.cli.serve", "regress": "nas.cli.regress", "ui": "nas.cli.ui"}


def fail(message: str) -> None:
    print(f"nas: error: {printable(scrub(message), lines=True)}", file=sys.stderr)  # no escape from a model's text
    raise SystemExit(2)


def check_group_overrides(args: list[str]) -> None:
    """An unknown group option stops a command in one line, before anything runs."""
    try:
        config.validate_group_overrides(args)
    except ConfigError as err:
        fail(str(err))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Flows report to one local Prefect server that the first command starts and later ones reuse
    # (flows/prefect_server.py), not to a temporary one started anew by every command (~10 s)
    os.environ.setdefault("NASFLOW_PREFECT_SERVER", "local")
    install_log_scrubbing()  # every log line, search.log included, is written without secrets
    safe_streams()  # a latin-1 or ASCII terminal: letters it lacks print as escapes, never raise
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0 if argv else 2)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        fail(f"unknown command '{command}' (valid: {', '.join(COMMANDS)})")
    importlib.import_module(COMMANDS[command]).main(rest)


if __name__ == "__main__":
    main()
