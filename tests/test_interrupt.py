"""Ctrl-C (and SIGTERM, taken the same way by `nas search`): a terminal sends SIGINT to the whole process group, once or twice. Workers (runner=processes,
runner=local pools) leave it to the search's process, which stops them at once; a second Ctrl-C while the
first unwinds is ignored (it printed a traceback). The end-to-end line and exit code:
tests/test_cli_config.py::test_ctrl_c_stops_a_search_in_one_line_and_the_same_command_resumes."""

from __future__ import annotations

import os
import signal
import time

import pytest

from flows.task_runners import build_task_runner
from nas.cli.search import Terminated, interrupt_once, interrupted, terminate_once


def test_a_second_ctrl_c_while_the_first_unwinds_is_ignored():
    previous = signal.signal(signal.SIGINT, interrupt_once)
    try:
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # would raise again mid-cleanup
    finally:
        signal.signal(signal.SIGINT, previous)



def test_sigterm_unwinds_as_ctrl_c_once_and_a_second_signal_is_ignored():
    """SIGTERM raises a KeyboardInterrupt (the search's Ctrl-C path saves and says how to resume);
    while it unwinds, another SIGTERM or a Ctrl-C is ignored."""
    previous = {s: signal.signal(s, h) for s, h in ((signal.SIGTERM, terminate_once),
                                                   (signal.SIGINT, interrupt_once))}
    try:
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("terminated, what, code", [(False, "interrupted", 130), (True, "terminated", 143)])
def test_a_stop_before_the_run_dir_is_known_is_the_nothing_saved_line(capsys, terminated, what, code):
    """Ctrl-C or SIGTERM while the config resolves: no run dir yet (it raised a NameError in the handler)."""
    with pytest.raises(SystemExit) as info:
        interrupted(None, terminated)
    assert info.value.code == code
    assert capsys.readouterr().err == f"nas: {what} before the search started; nothing was saved\n"


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


def test_local_pool_workers_ignore_ctrl_c_and_finish_their_evaluation():
    """runner=local with workers: each worker printed a KeyboardInterrupt traceback."""
    import numpy as np

    from nas.core.trial import Candidate
    from nas.pool import WorkerPool
    from nas.search.spec import Component, SearchSpec
    from nas.spaces.nb201.space import NB201Space

    spec = SearchSpec(space=Component("nb201"), strategy=Component("random"),
                      evaluator=Component("simulated", {"median_seconds": 0.5, "sigma": 0.01}), seed=0, trials=1)
    pool = WorkerPool.from_settings(spec.to_dict(), {"workers": 1}, 1)
    try:
        pool.submit(0, Candidate(NB201Space().sample(np.random.default_rng(0))))
        os.kill(pool.pids[0], signal.SIGINT)
        ticket, (result, _, _) = pool.next_done()
        assert ticket == 0 and result.ok and pool.stats.deaths == 0
    finally:
        pool.close()
