"""What a person sees on the console during `nas search`: the bar fits 80 columns, log lines
print above it (never into its line), the run dir comes first and a resume says so, and a
run-dir refusal is one line with no traceback (the real CLI in a subprocess)."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from nas.search.console import logs_above, search_columns, search_progress

ROOT = Path(__file__).resolve().parents[1]
STATUS = "modifier: generating 412 tokens at 3.1 tok/s (attempt 2 of 3), retry with a longer limit"


def bar_lines(width: int, label: str = "[bold]nader[/] on nader", total: int = 100) -> list[str]:
    out = io.StringIO()
    progress = search_progress(label, total, Console(file=out, width=width, force_terminal=True, color_system=None))
    with progress:
        progress.add_task("search", total=total, completed=3, best="93.04", llm=STATUS)
    return [line for line in screen_lines(out) if "3/" in line]


def screen_lines(out: io.StringIO) -> list[str]:
    """What a terminal shows, line by line: each carriage return starts a line again; no escapes."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).replace("\r", "\n")
    return [line for line in text.splitlines() if line.strip()]


def test_search_bar_fits_80_columns_and_keeps_its_count_best_and_elapsed_time():
    for width in (80, 120):
        for label, total in (("[bold]nader[/] on nader", 100), ("[bold]fairnad[/] on a_very_long_space_name", 1000)):
            line = bar_lines(width, label, total)[-1]
            assert len(line) <= width, line
            assert f"3/{total}" in line and "best 93.04" in line and "0:00:0" in line, line
    assert "modifier: generating" in bar_lines(80)[-1] and bar_lines(80)[-1].rstrip().endswith("…")


def test_log_lines_print_above_the_bar_never_into_its_line(capsys):
    out = io.StringIO()
    progress = search_progress("[bold]random[/] on nb201", 10,
                               Console(file=out, width=80, force_terminal=True, color_system=None))
    handler = logging.StreamHandler(sys.stderr)  # as Hydra's console handler
    handler.setFormatter(logging.Formatter("[%(name)s][%(levelname)s] - %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with progress, logs_above(progress):
            task = progress.add_task("search", total=10, completed=0, best="-", llm="")
            progress.update(task, completed=4)
            progress.refresh()
            logging.getLogger("nas.test").warning("a warning during the search")
            progress.update(task, completed=5)
        assert handler.stream is sys.stderr  # put back
    finally:
        root.removeHandler(handler)
    assert "a warning" not in capsys.readouterr().err  # not written past the bar
    lines = screen_lines(out)
    assert "[nas.test][WARNING] - a warning during the search" in lines  # a line of its own
    assert lines[-1].startswith("random on nb201") and "5/10" in lines[-1]  # the bar drawn again below


def nas_search(tmp_path: Path, run: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NASFLOW_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "nas.cli.main", "search", "space=nb201", "strategy=random",
                           "evaluator=table", "progress=false", f"hydra.run.dir={run}", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_resumed_search_says_so_and_lowering_the_budget_is_one_line(tmp_path):
    run = tmp_path / "run"
    first = nas_search(tmp_path, run, "budget.trials=3", "runner=local")
    assert first.returncode == 0, first.stderr
    assert first.stderr.splitlines()[0] == f"run dir: {run}"  # first, before any trial
    more = nas_search(tmp_path, run, "budget.trials=5", "runner=local")
    assert more.returncode == 0, more.stderr
    assert more.stderr.splitlines()[0] == f"run dir: {run} (resuming after 3 trials)"
    config = (run / ".hydra" / "config.yaml").read_text()
    fewer = nas_search(tmp_path, run, "budget.trials=2")  # the default runner: Prefect's flow
    assert fewer.returncode == 2
    assert fewer.stderr.splitlines() == [f"nas: error: {run} already holds 5 trials, more than budget.trials=2: "
                                         "raise budget.trials to extend it, or use a new hydra.run.dir"]
    assert (run / ".hydra" / "config.yaml").read_text() == config  # the refused command changed nothing


def test_a_long_label_is_cut_to_24_columns_and_the_status_gets_the_rest():
    columns = search_columns("x" * 40, 100, 80)
    label = columns[0].get_table_column()
    assert (label.min_width, label.max_width) == (24, 24)
    widths = [24, 12, 7, len("best 100.00"), len("0:00:00")]
    status = columns[-1].get_table_column()
    assert status.max_width == 80 - sum(widths) - len(widths) - 1
