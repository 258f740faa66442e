"""The Prefect server `nas serve` talks to: is it there, and does its UI call the same API."""

from __future__ import annotations

from typing import Any

from nas.errors import NasError

START_SERVER = ("start a server with `prefect server start --host 127.0.0.1` and "
                "`export PREFECT_API_URL=http://127.0.0.1:4200/api`")


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


def start_temporary_server(show: bool) -> Any | None:
    """Prefect's temporary API server for this process (Prefect starts the same one, once, on
    its first API call), started here so that its ten-odd silent seconds show a status line;
    None when PREFECT_API_URL names a server."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # one per process: the flow's API calls find it running
    if not server.running:
        from nas.status import status
        from tasks.env import check_prefect_database

        check_prefect_database()  # a damaged one would cost minutes and end in "Timed out ..."
        with status("starting Prefect's temporary server", show=show):
            server.start()
    return server
