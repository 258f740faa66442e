"""`nas serve [--config NAME|FILE] [--list] [KEY=VALUE ...]`: serve every flow as a
Prefect deployment, with the schedules of nas/conf/serve/default.yaml, against the server
at PREFECT_API_URL, until Ctrl-C or SIGTERM.

  prefect server start --host 127.0.0.1            # in another terminal
  export PREFECT_API_URL=http://127.0.0.1:4200/api
  nas serve                                        # then start runs from the UI or `prefect deployment run`
  nas serve --list                                 # what would be served; no server needed
  nas serve deployments.table-search.cron='0 * * * *' deployments.nightly-regression=null

On another port, tell the server's UI where its API is (else it calls port 4200):
  PREFECT_UI_API_URL=http://127.0.0.1:4300/api prefect server start --host 127.0.0.1 --port 4300
"""

from __future__ import annotations

import argparse
import os
import sys

from nas.errors import NasError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nas serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="default",
                        help="a name in nas/conf/serve/ or a YAML file (default: default)")
    parser.add_argument("--list", action="store_true", help="print the deployments and exit")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted overrides of the serve config; KEY=null drops an entry")
    return parser


def main(argv: list[str]) -> None:
    from nas.cli.main import fail

    args = _parser().parse_args(argv)
    # A served flow's logs are what the UI shows of it; the CLI's default of WARNING hides them.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    try:
        from nas.orchestration.flows.deployments import build, load_config
        from nas.orchestration.serve import describe, serve
        from nas.orchestration.server import check_server, ui_warning

        config = load_config(args.config, args.overrides)
        if args.list:
            print("\n".join(describe(config)))
            return
        deployments = [build(entry) for entry in config.entries]
        url = check_server()
    except NasError as err:
        fail(str(err))
    print(f"nas serve: serving on {url} (UI: {url.removesuffix('/api')}/deployments); Ctrl-C to stop", flush=True)
    if (warning := ui_warning(url)) is not None:
        print(warning, file=sys.stderr, flush=True)
    for entry, deployment in zip(config.entries, deployments):
        print(f"  {deployment.flow_name}/{entry.name}  [{entry.cron or 'on demand'}]", flush=True)
    serve(config, deployments)
    print("nas serve: stopped", flush=True)
