"""A flow run's heartbeats that stop at once when its body ends.

Prefect's engine sends a flow run's heartbeat events (`prefect.flow-run.heartbeat`, every
`PREFECT_FLOWS_HEARTBEAT_FREQUENCY` seconds, from which the server's automations tell a crashed run
from a running one) from a thread that sleeps in one-second steps, and joins it as the run ends: every
run's end waited for the rest of that second (0.5 s on average, a seventh of a 100-trial table
search). `quick_heartbeats` turns the engine's off for the flow call it wraps, and the flow's body
(`heartbeats`) sends the same events, as often, from a thread that stops as soon as it is told."""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from prefect import __version__ as prefect_version
from prefect.context import FlowRunContext, SettingsContext, get_settings_context
from prefect.events import emit_event
from prefect.events.related import tags_as_related_resources
from prefect.settings import get_current_settings

log = logging.getLogger(__name__)
MINIMUM_SECONDS = 30  # Prefect's own floor (flow_engine.MINIMUM_HEARTBEAT_INTERVAL)

# The interval the engine would have used, for the body of the flow call `quick_heartbeats` wraps.
_INTERVAL: ContextVar[int | None] = ContextVar("nas_heartbeat_seconds", default=None)


@contextmanager
def quick_heartbeats() -> Iterator[None]:
    """Around a flow call: the engine sends no heartbeats; `heartbeats` in its body does."""
    interval = get_current_settings().flows.heartbeat_frequency
    if interval is None:  # off already: nothing to send
        yield
        return
    token = _INTERVAL.set(max(interval, MINIMUM_SECONDS))
    try:
        with _heartbeat_frequency(None):
            yield
    finally:
        _INTERVAL.reset(token)


@contextmanager
def heartbeats() -> Iterator[None]:
    """In a flow's body: its run's heartbeats, the first now, stopped (without waiting) when the
    block ends; the setting is back for whatever runs inside (a nested flow beats on its own).
    Nothing outside `quick_heartbeats` (the engine sends them there)."""
    interval, context = _INTERVAL.get(), FlowRunContext.get()
    if interval is None or context is None or context.flow_run is None:
        yield
        return
    resource, related = heartbeat_resources(context.flow_run, context.flow.name if context.flow else "")
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                emit_event(event="prefect.flow-run.heartbeat", resource=resource, related=related)
            except Exception:  # as the engine's: a missed heartbeat is not the run's error
                log.debug("failed to emit a heartbeat", exc_info=True)
            if stop.wait(interval):
                return

    # the settings context (the API's URL) as this thread's: the events go to the same server
    thread = threading.Thread(target=contextvars.copy_context().run, args=(beat,), daemon=True,
                              name="nas-heartbeat")
    token = _INTERVAL.set(None)
    thread.start()
    try:
        with _heartbeat_frequency(interval):
            yield
    finally:
        _INTERVAL.reset(token)
        stop.set()
        thread.join()


def heartbeat_resources(run: Any, flow_name: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """A heartbeat event's resource (the flow run) and related resources (its flow, deployment and
    tags), as the engine names them."""
    resource = {"prefect.resource.id": f"prefect.flow-run.{run.id}", "prefect.resource.name": run.name or "",
                "prefect.version": prefect_version}
    related = [{"prefect.resource.id": f"prefect.flow.{run.flow_id}", "prefect.resource.role": "flow",
                "prefect.resource.name": flow_name}] if run.flow_id else []
    if run.deployment_id:
        related.append({"prefect.resource.id": f"prefect.deployment.{run.deployment_id}",
                        "prefect.resource.role": "deployment"})
    related += [dict(r) for r in tags_as_related_resources(set(run.tags or []))]
    return resource, related


@contextmanager
def _heartbeat_frequency(seconds: int | None) -> Iterator[None]:
    """The current settings with `flows.heartbeat_frequency` set, for the block: a copy of the two
    models it touches (Prefect's `temporary_settings` re-reads and re-validates every setting, tens of
    milliseconds each time). No other setting is derived from this one, so nothing else needs redoing."""
    context = get_settings_context()
    current = context.settings
    settings = current.model_copy(update={"flows": current.flows.model_copy(update={"heartbeat_frequency": seconds})})
    with SettingsContext(profile=context.profile, settings=settings):
        yield
