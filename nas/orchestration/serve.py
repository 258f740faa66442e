"""Serving the deployments of a serve config (nas/orchestration/flows/deployments.py)
on a Prefect Runner, until Ctrl-C or SIGTERM; `nas serve` parses and prints around it."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from nas.errors import NasError
from nas.orchestration.flows.deployments import ServeConfig, load_flow


def describe(config: ServeConfig) -> list[str]:
    """What would be served, one paragraph per deployment, then the limit; no server needed."""
    lines = []
    for entry in config.entries:
        try:
            full = f"{load_flow(entry).name}/{entry.name}"
        except NasError as err:
            full = f"?/{entry.name} (not servable: {err})"
        lines.append(f"{full}\n  flow: {entry.flow}\n  schedule: {entry.cron or 'none (runs on demand)'}\n"
                     f"  parameters: {entry.parameters}")
    lines.append(f"limit: {config.limit or 'none'} flow runs at once")
    return lines


def serve(config: ServeConfig, deployments: list[Any]) -> None:
    """Serve built deployments until stopped; returns once the runner has stopped."""
    from prefect.runner import Runner

    runner = Runner(name="nas-serve", limit=config.limit, pause_on_shutdown=True)
    for deployment in deployments:
        runner.add_deployment(deployment)
    try:
        asyncio.run(_run(runner))
    except KeyboardInterrupt:
        pass


async def _run(runner: Any) -> None:
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
