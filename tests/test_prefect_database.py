"""A damaged Prefect database (NASFLOW_HOME/prefect/prefect.db) is one line naming the file and
what to do, found before Prefect's ephemeral server starts (which would retry for minutes and
say only "Timed out"), and the attempt leaves no run dir."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from conftest import run_nas
from nas.errors import InputError
from tasks.env import check_prefect_database, check_sqlite

PAGE = 4096


def make_db(path: Path) -> bytes:
    """A sound database of many pages (one file: no write-ahead log)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, body TEXT)")
        db.executemany("INSERT INTO runs VALUES (?, ?)", ((i, "x" * 200) for i in range(2000)))
    db.close()
    return path.read_bytes()


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "garbage":  # overwritten
        path.write_bytes(os.urandom(len(data)))
    elif how == "truncated":
        path.write_bytes(data[:len(data) // 2])
    else:  # pages in the middle overwritten: the header still reads well
        path.write_bytes(data[:4 * PAGE] + os.urandom(8 * PAGE) + data[12 * PAGE:])


@pytest.mark.parametrize("how", ["garbage", "truncated", "pages"])
def test_a_damaged_database_is_one_line_naming_it_and_what_to_do(tmp_path, how):
    path = tmp_path / "prefect.db"
    make_db(path)
    damage(path, how)
    with pytest.raises(InputError) as err:
        check_sqlite(path)
    message = str(err.value)
    assert message.startswith(f"{path}: Prefect's database is damaged (") and "\n" not in message
    assert "move it aside, with any prefect.db-wal and prefect.db-shm beside it" in message


def test_a_sound_empty_or_missing_database_passes(tmp_path):
    make_db(tmp_path / "sound.db")
    (tmp_path / "empty.db").write_bytes(b"")  # SQLite makes a database there
    for name in ("sound.db", "empty.db", "missing.db"):
        check_sqlite(tmp_path / name)


def test_the_checked_file_is_prefects_unless_a_server_is_given(tmp_path):
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

    path = tmp_path / "prefect.db"
    path.write_bytes(b"not a database at all")
    with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{path}"}):
        with pytest.raises(InputError, match=str(path)):
            check_prefect_database()
        with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
            check_prefect_database()  # that server's database is its own


def test_nas_search_on_a_damaged_database_fails_at_once_and_leaves_no_run_dir(tmp_path, nas_env):
    db = Path(nas_env["NASFLOW_HOME"]) / "prefect" / "prefect.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(os.urandom(PAGE))
    run_dir = tmp_path / "run"
    out = run_nas(["search", "space=nb201", "strategy=random", "budget.trials=2", "progress=false",
                   f"hydra.run.dir={run_dir}"], nas_env, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"nas: error: {db}: Prefect's database is damaged (not an SQLite file); move it aside, with any "
        f"prefect.db-wal and prefect.db-shm beside it, and run again: Prefect makes a new one (it holds "
        f"Prefect's run records only; nasflow keeps its results in the run dirs and its caches as files "
        f"under {nas_env['NASFLOW_HOME']})"]
    assert not run_dir.exists()



def test_knowledge_ingest_as_a_flow_on_a_damaged_database_fails_at_once(tmp_path, nas_env):
    """The check sits where the temporary server starts, so every command that starts it has it."""
    db = Path(nas_env["NASFLOW_HOME"]) / "prefect" / "prefect.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(os.urandom(PAGE))
    out = run_nas(["knowledge", "ingest", "--prefect", "--out", str(tmp_path / "ingest")], nas_env, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith(f"nas: error: {db}: Prefect's database is damaged")
    assert not (tmp_path / "ingest").exists()

def test_prefect_client_telemetry_is_off_like_the_servers_analytics(tmp_path):
    """No first-run telemetry notice on a terminal and no calls home (an offline machine's would only
    fail); a user's own DO_NOT_TRACK wins."""
    import subprocess
    import sys

    probe = ("import os; from tasks.env import configure_prefect_env; configure_prefect_env(); "
             "from prefect._internal.analytics.enabled import is_telemetry_enabled; "
             "print(os.environ['DO_NOT_TRACK'], is_telemetry_enabled())")
    env = {k: v for k, v in os.environ.items() if k != "DO_NOT_TRACK" and not k.startswith("PREFECT_")}
    env["NASFLOW_HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False"], out.stderr
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "DO_NOT_TRACK": "0"}, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split()[0] == "0", out.stderr
