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
import asyncio
import os
import signal
import sys

from nas.errors import NasError

START_SERVER = ("start a server with `prefect server start --host 127.0.0.1` and "
                "`export PREFECT_API_URL=http://127.0.0.1:4200/api`")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nas serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="default",
                        help="a name in nas/conf/serve/ or a YAML file (default: default)")
    parser.add_argument("--list", action="store_true", help="print the deployments and exit")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted overrides of the serve config; KEY=null drops an entry")
    return parser


def check_server() -> str:
    """The API URL, once its health endpoint answers; a dead server would otherwise
    surface as retries and a traceback."""
    import httpx
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise NasError(f"PREFECT_API_URL is not set; {START_SERVER}")
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=5).raise_for_status()
    except httpx.HTTPError as err:
        raise NasError(f"no Prefect server answers at {url} ({type(err).__name__}); {START_SERVER}") from None
    return url


def ui_warning(url: str) -> str | None:
    """A line when the server's UI calls another API address than `url` (a server started with
    --port but no PREFECT_UI_API_URL: its UI calls port 4200 and shows nothing)."""
    import httpx

    try:
        ui_api = httpx.get(f"{url.rstrip('/').removesuffix('/api')}/ui-settings", timeout=5).json().get("api_url")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None  # UI disabled or not answering: nothing to check
    if not ui_api or ui_api.rstrip("/") == url.rstrip("/"):
        return None
    return (f"nas serve: warning: the server's UI calls the API at {ui_api}, not {url}; restart it with "
            f"PREFECT_UI_API_URL={url} prefect server start ...")


def _list(config) -> None:
    from nas.orchestration.flows.deployments import load_flow

    for entry in config.entries:
        try:
            full = f"{load_flow(entry).name}/{entry.name}"
        except NasError as err:
            full = f"?/{entry.name} (not servable: {err})"
        print(f"{full}\n  flow: {entry.flow}\n  schedule: {entry.cron or 'none (runs on demand)'}\n"
              f"  parameters: {entry.parameters}")
    print(f"limit: {config.limit or 'none'} flow runs at once")


def main(argv: list[str]) -> None:
    from nas.cli.main import fail

    args = _parser().parse_args(argv)
    # A served flow's logs are what the UI shows of it; the CLI's default of WARNING hides them.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    try:
        from nas.orchestration.flows.deployments import build, load_config

        config = load_config(args.config, args.overrides)
        if args.list:
            _list(config)
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
    from prefect.runner import Runner

    runner = Runner(name="nas-serve", limit=config.limit, pause_on_shutdown=True)
    for deployment in deployments:
        runner.add_deployment(deployment)
    try:
        asyncio.run(_run(runner))
    except KeyboardInterrupt:
        pass
    print("nas serve: stopped", flush=True)


async def _run(runner) -> None:
    """prefect.serve's loop, but Ctrl-C and SIGTERM both take the runner's own stop path:
    runs in flight are cancelled (not left Running), schedules paused; a second signal
    exits at once. (Prefect's SIGTERM handler calls the async stop without awaiting it.)"""
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task | None] = []

    def stop(*_: object) -> None:
        if stopping or not runner.started:
            raise KeyboardInterrupt
        stopping.append(None)
        loop.call_soon_threadsafe(lambda: stopping.append(loop.create_task(runner.astop())))

    runner.handle_sigterm = stop  # Runner.start installs it for SIGTERM
    signal.signal(signal.SIGINT, stop)
    await runner.start()
