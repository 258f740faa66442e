"""`nas ui [--no-start]`: where the Prefect UI of this home's runs is. The local server that `nas`
commands share listens on port 4200 when it is free and on another port when it is not (another
user's server on 4200 shows that user's runs), so the address is asked for, not assumed."""

from __future__ import annotations

import argparse

import flows.prefect_server as server
from nas.cli.main import fail
from nas.errors import NasError
from tasks.env import configure_prefect_env


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="nas ui", description="Print the address of the Prefect UI that nas commands report to: the local "
                                   "server they share (started when none runs), or the one PREFECT_API_URL names.")
    parser.add_argument("--no-start", action="store_true",
                        help="only say whether the local server runs (exit 1 when it does not)")
    args = parser.parse_args(argv)

    configure_prefect_env()  # Prefect's home (its profile, the server's state) under NASFLOW_HOME

    try:
        ui = server.configured_ui()
        if ui is not None:
            print(f"Prefect UI: {ui} (the server PREFECT_API_URL names)")
            return
        if server.server_mode() == "temporary":
            fail(f"{server.SERVER_MODE}=temporary: each command reports to a temporary Prefect server, which has "
                 f"no UI and stops with the command; unset {server.SERVER_MODE} to share a local server and its UI")
        if args.no_start:
            state = server.running_local_server()
            if state is None:
                print("no local Prefect server runs for this NASFLOW_HOME; `nas ui` starts one")
                raise SystemExit(1)
        else:
            with server.local_server(show=True):  # started when none runs; its idle clock restarts as this ends
                state = server.running_local_server()
        if state is None:  # stopped the moment it answered (its NASFLOW_HOME removed)
            fail("the local Prefect server stopped as it started; see $NASFLOW_HOME/prefect/local-server.log")
            return
        print(f"Prefect UI: {server.ui_address(str(state['url']))} (the local server nas commands share; it stops "
              f"after {state.get('idle_minutes', server.idle_minutes()):g} idle minutes)")
    except NasError as err:
        fail(str(err))
