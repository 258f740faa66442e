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

import atexit
import importlib
import os
import sys
import threading
from typing import NoReturn

from nas.cli import warm as warm_start
from nas.errors import ConfigError
from nas.home import home
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


def entry(warm: bool = True) -> NoReturn:
    """The `nas` command: `main`, then the interpreter's own exit steps without its teardown, which
    frees every object one by one (0.4 s after a search, which loaded Prefect, Hydra and numpy).
    A `nas search` runs in a warm process's child when one serves it (nas/cli/warm.py), and a cold
    one starts one for the next command. `warm=False`: in that child."""
    argv, env = sys.argv[1:], dict(os.environ)
    use_warm = warm and warm_start.enabled(argv, env)
    if use_warm:
        served = warm_start.run(argv, env, home())
        if served is not None:
            exit_now(served)
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = exit_status(stop.code)
    if use_warm:
        warm_start.start(env, home())
    exit_now(code)


def exit_status(code: object) -> int:
    """The status `raise SystemExit(code)` exits with (a message is printed, status 1), as Python's."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def exit_now(code: int) -> NoReturn:
    """What Python does at exit, up to its teardown: the threads that are not daemons joined (and the
    thread pools' exit hooks), the atexit handlers (logging's flush, Prefect's event and log senders,
    temporary folders), the standard streams flushed; then the process ends with `code`."""
    getattr(threading, "_shutdown", lambda: None)()  # CPython's first exit step
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, a closed stream: nothing more can reach it
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
