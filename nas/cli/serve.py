"""`nas serve [--file PREFECT_YAML] [--limit N] [--list] [NAME.KEY=VALUE ...]`: serve the
deployments of prefect.yaml (the ones `prefect deploy --all` deploys to a work pool) on a
local Prefect Runner, until Ctrl-C or SIGTERM, against the server at PREFECT_API_URL, else
the local one that `nas` commands share (started if none runs; it stays up while serve does).

  nas serve                                        # then start runs from the UI or `prefect deployment run`
  nas serve --list                                 # what would be served; no server needed
  nas serve table-search.cron='0 * * * *' nightly-regression=null

prefect.yaml: by default the checkout's (beside the `flows` package); an installed wheel has
none there and reads ./prefect.yaml instead (the Docker image's /app holds one); --file names
another. Overrides reach one deployment by its name:
  NAME.cron='0 4 * * *'            replace its schedules with this cron (UTC); NAME.cron=null: on demand
  NAME.parameters.KEY=VALUE        a default parameter of its runs, e.g. table-search.parameters.root=/data/runs
  NAME.KEY=VALUE                   any other key of its prefect.yaml entry (description, concurrency_limit, ...)
  NAME=null                        do not serve it

On another port, tell the server's UI where its API is (else it calls port 4200):
  PREFECT_UI_API_URL=http://127.0.0.1:4300/api prefect server start --host 127.0.0.1 --port 4300
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack

from flows.prefect_server import check_server, prefect_api, ui_warning
from nas.cli.main import fail
from nas.errors import NasError
from nas.lazy import LazyImport
from tasks.env import configure_prefect_env

# Prefect: imported after configure_prefect_env has set its home
serving = LazyImport("flows.deployments")


def _limit(text: str) -> int | None:
    if text == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or 'none', got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nas serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--file", default=None, metavar="PREFECT_YAML",
                        help="the deployments (default: the project's prefect.yaml)")
    parser.add_argument("--limit", type=_limit, default=2, metavar="N",
                        help="flow runs at once across all deployments (default: 2; 'none': no limit)")
    parser.add_argument("--list", action="store_true", help="print the deployments and exit")
    parser.add_argument("overrides", nargs="*", metavar="NAME.KEY=VALUE",
                        help="overrides of one deployment's entry; NAME=null drops it")
    return parser


def main(argv: list[str]) -> None:
    args = _parser().parse_args(argv)
    # A served flow's logs are what the UI shows of it; the CLI's default of WARNING hides them.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")

    configure_prefect_env()  # before flows import Prefect: its home under NASFLOW_HOME
    with ExitStack() as held:
        try:
            entries = serving.load(args.file, args.overrides)
            if args.list:
                print("\n".join(serving.describe(entries, args.limit)))
                return
            deployments = [serving.build(entry) for entry in entries]
            # PREFECT_API_URL's server, else the shared local one (held, so never idle, until serve returns)
            held.enter_context(prefect_api(show=True, temporary=False))
            url = check_server()
        except NasError as err:
            fail(str(err))
        print(f"nas serve: serving on {url} (UI: {url.removesuffix('/api')}/deployments); Ctrl-C to stop",
              flush=True)
        if (warning := ui_warning(url)) is not None:
            print(warning, file=sys.stderr, flush=True)
        for entry, deployment in zip(entries, deployments, strict=True):
            schedule = ", ".join(map(str, entry.schedules)) or "on demand"
            print(f"  {deployment.flow_name}/{entry.name}  [{schedule}]", flush=True)
        serving.serve(deployments, args.limit)
    print("nas serve: stopped", flush=True)
