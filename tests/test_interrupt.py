"""Ctrl-C: a terminal sends SIGINT to the whole process group, once or twice. `runner=processes`
workers leave it to the flow's process, which stops them at once; a second Ctrl-C while the
first unwinds is ignored (it printed a traceback). The end-to-end line and exit code:
tests/test_cli_config.py::test_ctrl_c_stops_a_search_in_one_line_and_the_same_command_resumes."""

from __future__ import annotations

import signal
import time

import pytest

from nas.cli.search import interrupt_once
from nas.orchestration.flows.runners import build_task_runner


def test_a_second_ctrl_c_while_the_first_unwinds_is_ignored():
    previous = signal.signal(signal.SIGINT, interrupt_once)
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # would raise again mid-cleanup
    finally:
        signal.signal(signal.SIGINT, previous)


def test_process_workers_ignore_ctrl_c_and_stop_with_the_flows_interrupt():
    """An idle worker died of SIGINT with a traceback; a busy one was waited for (an evaluation
    can take minutes)."""
    with pytest.raises(KeyboardInterrupt), build_task_runner({"name": "processes", "workers": 1}) as runner:
        executor = runner._executor
        assert executor.submit(signal.getsignal, signal.SIGINT).result(timeout=120) == signal.SIG_IGN
        executor.submit(time.sleep, 600)
        workers = list(executor._processes.values())
        raise KeyboardInterrupt
    for worker in workers:
        worker.join(timeout=30)
        assert not worker.is_alive()
