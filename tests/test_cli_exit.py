"""The `nas` command's exit (nas.cli.main.entry): Python's exit steps without its teardown. A
command's threads finish, its atexit handlers run, its buffered output is written, and the status
is the one `SystemExit` carried; only the freeing of every object one by one is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _nas(body: str) -> subprocess.CompletedProcess[str]:
    """`entry()` with `main` replaced by `body` (a function's statements), in a fresh interpreter
    whose stdout is a pipe (so block-buffered: only a flush writes it)."""
    program = "import atexit, sys, threading, time\nimport nas.cli.main as m\ndef main():\n" + \
        textwrap.indent(textwrap.dedent(body), "    ") + "\nm.main = main\nm.entry()\nprint('after entry')\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env)


def test_threads_atexit_handlers_and_buffered_output_all_finish():
    proc = _nas("""
        threading.Thread(target=lambda: (time.sleep(0.3), print('thread finished'))).start()
        atexit.register(lambda: print('atexit ran'))
        print('buffered', end='')
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("buffered")
    assert "thread finished" in proc.stdout and proc.stdout.rstrip().endswith("atexit ran")
    assert "after entry" not in proc.stdout  # the process ended in entry


@pytest.mark.parametrize("code, status, stderr", [
    ("None", 0, ""), ("0", 0, ""), ("2", 2, ""), ("130", 130, ""), ("'nas: a message'", 1, "nas: a message"),
])
def test_the_status_is_the_one_system_exit_carried(code, status, stderr):
    proc = _nas(f"print('out')\nraise SystemExit({code})")
    assert proc.returncode == status and proc.stdout == "out\n"
    assert proc.stderr.strip() == stderr


def test_a_real_command_exits_with_its_status_and_its_line():
    proc = subprocess.run([sys.executable, "-m", "nas.cli", "search", "strategy=nosuch"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("nas: error: unknown strategy 'nosuch'")
