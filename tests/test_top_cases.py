"""nas's own top-level modules case by case (issue 52, the library mutation run): the worker pool's
death accounting (a scripted process stands in for a worker), the secret scrubber's lengths and its
log filter, the terminal escapes and clips at their bounds, the lazy import, the status line, and the
crash-safe file helpers' every message. In-process."""

from __future__ import annotations

import json
import logging
import os
import sys
import types
from collections import deque
from pathlib import Path

import pytest

from nas import home, io, lazy, secrets, status, terminal
from nas.core.trial import Candidate, EvalResult
from nas.errors import ConfigError, InputError, OutputPathError, RunDirError
from nas.pool import PoolStats, WorkerPool, _Worker
from nas.search.slots import Slot

# ---------------------------------------------------------------- the worker pool


class Arch:
    def key(self) -> str:
        return "k"

    def encode(self) -> str:
        return "e"


class Process:
    """A worker process that has exited with `code`."""

    pid = 4242

    def __init__(self, code: int = -9) -> None:
        self.code = code

    def wait(self, timeout: float | None = None) -> int:
        return self.code


class Conn:
    def __init__(self) -> None:
        self.sent: list = []
        self.closed = False

    def send(self, obj: object) -> None:
        self.sent.append(obj)

    def close(self) -> None:
        self.closed = True


class Pool(WorkerPool):
    """The pool's bookkeeping with scripted workers: `_spawn` gives a fresh stand-in, ready at once."""

    def __init__(self, max_attempts: int) -> None:
        self.spec_dict, self.max_attempts, self.stats = {}, max_attempts, PoolStats()
        self._queue, self._running, self._deaths, self._done = deque(), {}, {}, deque()
        self.spawned = 0
        self._workers = [self._spawn(Slot(0, None))]

    def _spawn(self, slot: Slot) -> _Worker:
        self.spawned += 1
        return _Worker(slot, Process(), Conn())  # type: ignore[arg-type]

    def _await_ready(self, worker: _Worker) -> None:
        pass


@pytest.mark.parametrize("attempts, deaths_to_fail", [(1, 1), (2, 2), (3, 3)])
def test_a_candidate_fails_after_exactly_max_attempts_deaths_and_is_rerun_before(attempts, deaths_to_fail):
    pool = Pool(attempts)
    pool.submit(0, Candidate(Arch()))  # type: ignore[arg-type]
    for death in range(1, deaths_to_fail + 1):
        worker = pool._workers[0]
        assert worker.ticket == 0 and worker.conn.sent == [(0, "e")]  # type: ignore[attr-defined]
        pool._died(worker)
        assert worker.conn.closed and pool.stats.deaths == death and pool.spawned == death + 1  # type: ignore
        if death < deaths_to_fail:
            assert list(pool._done) == [] and [t for t, _ in pool._queue] == [0]
            pool._dispatch()
    ticket, (result, cached, wall) = pool._done.popleft()
    assert ticket == 0 and cached is False and wall >= 0 and not pool._queue and not pool._running
    assert result.error == f"worker process died {deaths_to_fail} times evaluating it (last exit code -9)"
    assert not result.ok and result.accuracy is None


def test_a_finished_evaluation_is_not_cached_and_frees_its_worker():
    pool = Pool(3)
    pool.submit(5, Candidate(Arch()))  # type: ignore[arg-type]
    worker = pool._workers[0]
    pool._finish(worker, 5, EvalResult(70.0).to_dict(), 1.5)
    assert worker.ticket is None and pool._done.popleft() == (5, (EvalResult(70.0), False, 1.5))
    assert pool.pids == {}


def test_the_pool_queues_behind_a_busy_worker_and_reports_pids():
    pool = Pool(3)
    pool.submit(0, Candidate(Arch()))  # type: ignore[arg-type]
    pool.submit(1, Candidate(Arch()))  # type: ignore[arg-type]
    assert pool.pids == {0: 4242} and [t for t, _ in pool._queue] == [1]
    with pytest.raises(RuntimeError, match=r"^next_done\(\) with nothing submitted$"):
        Pool(1).next_done()


@pytest.mark.parametrize("slots, attempts, message", [
    ([], 3, "runner.workers: a worker pool needs at least one slot"),
    ([Slot(0, None)], 0, "runner.max_attempts: expected a positive integer, got 0"),
    ([Slot(0, None)], True, "runner.max_attempts: expected a positive integer, got True"),
    ([Slot(0, None)], 1.0, "runner.max_attempts: expected a positive integer, got 1.0"),
])
def test_a_pool_needs_a_slot_and_a_positive_attempt_count(slots, attempts, message):
    with pytest.raises(ConfigError) as info:
        WorkerPool({}, slots, max_attempts=attempts)
    assert str(info.value) == message


def test_a_worker_starts_when_it_says_ready_and_otherwise_says_why():
    from multiprocessing import Pipe

    from nas.errors import EvaluationError

    pool = Pool(1)
    for told, message in (("ready", None), ("ValueError: bad spec", "worker 0 could not build the evaluator: "
                                                                   "ValueError: bad spec")):
        ours, theirs = Pipe()
        theirs.send(told)
        worker = _Worker(Slot(0, None), Process(3), ours)  # type: ignore[arg-type]
        if message is None:
            WorkerPool._await_ready(pool, worker)
            continue
        with pytest.raises(EvaluationError) as info:
            WorkerPool._await_ready(pool, worker)
        assert str(info.value) == message
    ours, theirs = Pipe()
    theirs.close()
    with pytest.raises(EvaluationError, match=r"^worker 0 exited while starting \(exit code 3\)$"):
        WorkerPool._await_ready(pool, _Worker(Slot(0, None), Process(3), ours))  # type: ignore[arg-type]


def test_next_done_takes_a_worker_s_answer_and_a_closed_end_as_its_death():
    from multiprocessing import Pipe

    pool = Pool(1)
    ours, theirs = Pipe()
    pool._workers = [_Worker(Slot(0, None), Process(), ours)]  # type: ignore[arg-type]
    pool.submit(0, Candidate(Arch()))  # type: ignore[arg-type]
    assert theirs.recv() == (0, "e")
    theirs.send((0, EvalResult(12.5).to_dict(), 0.25))
    assert pool.next_done() == (0, (EvalResult(12.5), False, 0.25))
    pool.submit(1, Candidate(Arch()))  # type: ignore[arg-type]
    theirs.close()
    ticket, (result, cached, _) = pool.next_done()  # max_attempts 1: its one death fails it
    assert ticket == 1 and result.error == "worker process died 1 times evaluating it (last exit code -9)"
    assert pool.stats.deaths == 1 and pool._workers[0].conn is not ours


def test_a_batch_is_evaluated_in_its_order_and_close_kills_what_overstays():
    import subprocess

    class Slow(Process):
        killed = False

        def wait(self, timeout: float | None = None) -> int:
            if timeout is not None and not self.killed:
                raise subprocess.TimeoutExpired("w", timeout)
            return self.code

        def kill(self) -> None:
            self.killed = True

    pool = Pool(1)
    answers = iter([(1, EvalResult(2.0).to_dict(), 0.1), (0, EvalResult(1.0).to_dict(), 0.1)])

    def next_done():
        ticket, result, wall = next(answers)
        return ticket, (EvalResult.from_dict(result), False, wall)

    pool.next_done = next_done  # type: ignore[method-assign]
    assert [r.accuracy for r, _, _ in pool.evaluate([Candidate(Arch()), Candidate(Arch())])] == [1.0, 2.0]  # type: ignore
    slow = Slow()
    pool._workers = [_Worker(Slot(0, None), slow, Conn())]  # type: ignore[arg-type]
    conn = pool._workers[0].conn
    pool.close(grace=0.0)
    assert slow.killed and conn.sent == [None] and conn.closed and pool._workers == []  # type: ignore[attr-defined]


def test_a_worker_reads_none_once_the_pool_s_end_closes():
    from multiprocessing import Pipe

    from nas.pool import _receive

    ours, theirs = Pipe()
    theirs.send((1, "x"))
    assert _receive(ours) == (1, "x")
    theirs.close()
    assert _receive(ours) is None


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize("value, min_len, masked", [
    ("abcd", 4, True), ("abc", 4, False), ("", 4, False), (None, 4, False),
    ("abcdefgh", 8, True), ("abcdefg", 8, False),
])
def test_a_secret_is_masked_from_its_minimum_length(value, min_len, masked):
    s = secrets.Scrubber()
    s.register(value, min_len=min_len)
    assert s.scrub(f"x {value} y") == (f"x {secrets.MASK} y" if masked else f"x {value} y")


def test_the_configured_key_s_minimum_is_four_and_an_environment_token_s_eight():
    s = secrets.Scrubber()
    s.register("wxyz")
    s.register("pqr")
    s.register_env({"MY_API_KEY": "1234567", "A_TOKEN": "tok-12345", "other_token": "low-er-case", "PATH": "/usr/b"})
    assert s.scrub("wxyz pqr 1234567 tok-12345 low-er-case /usr/b") == "*** pqr 1234567 *** *** /usr/b"


def test_the_longest_secret_is_masked_whole_and_key_like_text_too():
    s = secrets.Scrubber()
    s.register("abcd")
    s.register("abcdefgh")
    s.register("abcd")  # again: nothing changes
    assert s.scrub("abcdefgh abcd sk-123456 sk-12345") == "*** *** *** sk-12345"


def test_scrub_data_scrubs_every_string_keys_paths_and_sequences():
    s = secrets.Scrubber()
    s.register("hush")
    out = s.scrub_data({"hush": ["hush", ("a", "hush"), {"hush"}], 3: Path("/hush/x"), "n": 1.5, "b": None})
    assert out == {"***": ["***", ["a", "***"], ["***"]], 3: "/***/x", "n": 1.5, "b": None}


def log_record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("sk-abcdefgh inside")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("n", logging.INFO, "f", 1, msg, args, info)


def test_a_log_line_s_tab_is_four_columns_its_controls_escaped_and_its_secrets_masked():
    record = log_record("a\tb %s\x1b[2J\n", "sk-abcdefgh")
    assert secrets.ScrubFilter().filter(record) is True
    assert (record.msg, record.args) == ("a   b ***\\x1b[2J\n", None)
    assert record.getMessage() == "a   b ***\\x1b[2J\n"


def test_a_log_record_s_traceback_and_stack_are_scrubbed_and_bad_args_kept():
    record = log_record("m", exc=True)
    record.stack_info = "stack sk-abcdefgh\x07"
    secrets.ScrubFilter().filter(record)
    assert record.exc_text.endswith("ValueError: *** inside") and "sk-" not in record.exc_text
    assert record.stack_info == "stack ***\\x07"
    bad = log_record("%d", "x")
    assert secrets.ScrubFilter().filter(bad) is True and bad.msg == "%d" and bad.args == ("x",)
    plain = log_record("m")
    secrets.ScrubFilter().filter(plain)
    assert plain.exc_text is None and plain.stack_info is None


def test_log_scrubbing_is_installed_once(monkeypatch):
    monkeypatch.setattr(logging, "_logRecordFactory", logging.LogRecord)
    secrets.install_log_scrubbing()
    factory = logging.getLogRecordFactory()
    assert factory.scrubs is True  # type: ignore[attr-defined]
    secrets.install_log_scrubbing()
    assert logging.getLogRecordFactory() is factory
    made = factory("n", logging.INFO, "f", 1, "key sk-abcdefgh", (), None)
    assert made.msg == "key ***"


# ---------------------------------------------------------------- terminal


@pytest.mark.parametrize("text, lines, out", [
    ("plain ascii ~", False, "plain ascii ~"),
    ("é ü 中", False, "é ü 中"),
    ("a\nb", False, "a\\x0ab"),
    ("a\nb", True, "a\nb"),
    ("\x1b[31m\x7f\x9b", True, "\\x1b[31m\\x7f\\x9b"),
    ("\u202e\u200b\ufeff", False, "\\u202e\\u200b\\ufeff"),
    ("\U000e0041\U000f0000", False, "\\U000e0041\\U000f0000"),
    ("\ud800", False, "\\ud800"),
    ("\u2028\u2029", True, "\\u2028\\u2029"),
    ("\\x1b", False, "\\x1b"),
])
def test_printable_escapes_the_unsafe_categories_only(text, lines, out):
    assert terminal.printable(text, lines=lines) == out
    assert terminal.printable(out, lines=lines) == out  # escaping twice changes nothing


@pytest.mark.parametrize("text, n, tail, out", [
    ("abcde", 5, False, "abcde"), ("abcdef", 5, False, "abcd…"), ("abcdef", 5, True, "…cdef"),
    ("abcde", 5, True, "abcde"), ("ab", 1, False, "…"), ("", 0, False, ""),
])
def test_clipped_keeps_n_characters_with_the_ellipsis(text, n, tail, out):
    assert terminal.clipped(text, n, tail=tail) == out and len(terminal.clipped(text, n, tail=tail)) <= max(n, 0)


def test_safe_streams_make_unencodable_text_escapes(monkeypatch):
    import io as stdio

    raw = stdio.BytesIO()
    stream = stdio.TextIOWrapper(raw, encoding="ascii")
    monkeypatch.setattr(sys, "stdout", stream)
    monkeypatch.setattr(sys, "stderr", types.SimpleNamespace())  # not a text stream: left alone
    terminal.safe_streams()
    print("é", file=stream)
    stream.flush()
    assert raw.getvalue() == b"\\xe9\n"


# ---------------------------------------------------------------- lazy, home, status


def test_a_lazy_module_imports_on_first_read_and_says_whether_it_has():
    name = "json.tool"
    sys.modules.pop(name, None)
    mod = lazy.LazyImport(name)
    assert repr(mod) == "<lazy module 'json.tool' (not loaded yet)>"
    assert callable(mod.main) and repr(mod) == "<lazy module 'json.tool' (loaded)>"
    with pytest.raises(ModuleNotFoundError):
        lazy.LazyImport("nas.no_such_module_here").x  # noqa: B018


def test_home_is_nasflow_home_absolute_or_the_default(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NASFLOW_HOME", "rel")
    assert home.home() == tmp_path / "rel"
    monkeypatch.delenv("NASFLOW_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert home.home() == tmp_path / ".nasflow"


class Clock:
    def __init__(self, *readings: float) -> None:
        self.readings = list(readings)

    def monotonic(self) -> float:
        return self.readings.pop(0)


def test_off_a_terminal_a_counted_status_speaks_once_at_two_seconds(monkeypatch, capsys):
    monkeypatch.setattr(status, "time", Clock(10.0, 11.9, 12.0, 13.0))
    with status.status("checking", total=3, tty=False) as advance:
        advance()
        assert capsys.readouterr().err == ""
        advance()
        advance()
    assert capsys.readouterr().err == "checking ...\n"


def test_off_a_terminal_an_uncounted_status_speaks_at_once_and_show_false_never(monkeypatch, capsys):
    monkeypatch.setattr(status, "time", Clock(0.0, 100.0))
    with status.status("starting", tty=False) as advance:
        assert capsys.readouterr().err == "starting ...\n"
        advance()
    assert capsys.readouterr().err == ""
    with status.status("hidden", show=False, tty=False) as advance:
        advance()
    assert capsys.readouterr().err == ""


def test_on_a_terminal_a_status_is_a_transient_bar(capsys):
    with status.status("working", total=2, tty=True) as advance:
        advance()
    with status.status("spinning", tty=True) as advance:
        advance()
    capsys.readouterr()


# ---------------------------------------------------------------- io


def test_atomic_writes_give_open_s_mode_and_scrub_secrets(tmp_path, monkeypatch):
    secrets.register("sekrit-value")
    io.atomic_write_text(tmp_path / "a" / "t.txt", "k=sekrit-value")
    assert (tmp_path / "a" / "t.txt").read_text() == "k=***"
    assert (tmp_path / "a" / "t.txt").stat().st_mode & 0o777 == io._FILE_MODE
    io.atomic_write_json(tmp_path / "j.json", {"b": (1, 2), "a": Path("/p"), "s": {"sekrit-value"}}, sync=False)
    assert (tmp_path / "j.json").read_text() == '{\n  "a": "/p",\n  "b": [\n    1,\n    2\n  ],\n  "s": [\n    "***"\n  ]\n}\n'
    (tmp_path / "other").write_text("x")
    io.atomic_write_bytes(tmp_path / "b", b"data", sync_also=tmp_path / "other")
    assert (tmp_path / "b").read_bytes() == b"data" and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_fsync_of_the_other_file_that_fails_is_raised_and_no_temp_file_stays(tmp_path):
    with pytest.raises(FileNotFoundError):
        io.atomic_write_bytes(tmp_path / "b", b"data", sync_also=tmp_path / "missing")
    assert list(tmp_path.iterdir()) == []
    io.atomic_write_bytes(tmp_path / "b", b"data", sync_also=tmp_path / "missing", sync=False)
    assert (tmp_path / "b").read_bytes() == b"data"


def test_the_umask_is_read_from_proc():
    mask = os.umask(0o027)
    os.umask(mask)
    assert io._umask() == mask


def test_check_output_and_make_dir_name_what_is_in_the_way(tmp_path):
    (tmp_path / "f").write_text("")
    (tmp_path / "d").mkdir()
    with pytest.raises(OutputPathError, match=rf"^{tmp_path}/d: is a directory, expected a file path$"):
        io.check_output(tmp_path / "d")
    with pytest.raises(OutputPathError, match=rf"^{tmp_path}/f: is a file, expected a directory$"):
        io.check_output(tmp_path / "f", directory=True)
    with pytest.raises(OutputPathError, match=rf"^{tmp_path}/f: is a file, cannot hold {tmp_path}/f/x/y$"):
        io.check_output(tmp_path / "f" / "x" / "y")
    assert io.check_output(tmp_path / "d" / "new") == tmp_path / "d" / "new"
    assert io.make_dir(tmp_path / "d" / "n" / "m") == tmp_path / "d" / "n" / "m" and (tmp_path / "d/n/m").is_dir()
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(OutputPathError, match=r"link: is a file, cannot hold"):
        io.check_output(tmp_path / "link" / "x")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_parent_is_named(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o500)
    with pytest.raises(OutputPathError, match=r"ro/x: cannot create directory \(Permission denied\)$"):
        io.make_dir(tmp_path / "ro" / "x")
    with pytest.raises(OutputPathError, match=r"ro/x: cannot write \(Permission denied\)$"):
        io.atomic_write_bytes(tmp_path / "ro" / "x", b"")


def test_keyed_files_read_none_a_record_or_why_not(tmp_path):
    files = io.KeyedFiles(tmp_path)
    assert files.path("abcdef") == tmp_path / "ab" / "abcdef.json"
    assert files.read("abcdef") == (None, None)
    files.write("abcdef", {"x": 1})
    assert files.read("abcdef") == ({"x": 1}, None)
    files.path("abcdef").write_text("{bad")
    record, why = files.read("abcdef")
    assert record is None and why == "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    files.path("abcdef").write_text("[" * 100_000)
    assert files.read("abcdef")[1] is not None and len(files.read("abcdef")[1]) <= 120


def test_input_text_and_json_errors_are_one_line(tmp_path):
    with pytest.raises(InputError, match=rf"^{tmp_path}/none: no such file$"):
        io.read_input_text(tmp_path / "none")
    with pytest.raises(InputError, match=rf"^{tmp_path}: is a directory, not a file$"):
        io.read_input_text(tmp_path)
    (tmp_path / "bin").write_bytes(b"\xff")
    with pytest.raises(InputError, match=r"bin: cannot read \(UnicodeDecodeError: "):
        io.read_input_text(tmp_path / "bin")
    with pytest.raises(RunDirError, match=r"bin: not UTF-8 text \(byte 0: invalid start byte\)$"):
        io.read_json(tmp_path / "bin")
    (tmp_path / "j").write_text('{\n "a": }')
    with pytest.raises(RunDirError, match=r"j: corrupt JSON at line 2 col 7: Expecting value$"):
        io.read_json(tmp_path / "j")
    (tmp_path / "deep").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(RunDirError, match=r"deep: JSON nested too deeply$"):
        io.read_json(tmp_path / "deep")
    (tmp_path / "list").write_text(json.dumps(list(range(30))))
    with pytest.raises(RunDirError) as info:
        io.read_json_object(tmp_path / "list")
    assert str(info.value) == f"{tmp_path}/list: expected a JSON object, found list ({json.dumps(list(range(30)))[:40]})"
    (tmp_path / "o").write_text('{"a": 1}')
    assert io.read_json_object(tmp_path / "o") == {"a": 1} and io.read_input_text(tmp_path / "o") == '{"a": 1}'


def test_jsonl_appends_whole_lines_and_reads_back_dropping_a_torn_end(tmp_path):
    path = tmp_path / "h.jsonl"
    io.append_jsonl(path, [])
    assert not path.exists() and io.read_jsonl(path) == []
    io.append_jsonl(path, [{"b": 1, "a": (1,)}, {"c": None}], sync=False)
    assert path.read_text() == '{"a":[1],"b":1}\n{"c":null}\n'
    with open(path, "a") as fh:
        fh.write("\n\n{\"torn")
    assert io.read_jsonl(path) == [{"a": [1], "b": 1}, {"c": None}] and path.read_text().endswith("torn")
    assert io.read_jsonl(path, repair=True, numbered=True) == [{"a": [1], "b": 1}, {"c": None}]
    assert path.read_text() == '{"a":[1],"b":1}\n{"c":null}\n'
    io.rewrite_jsonl(path, [{"x": 1}])
    assert path.read_text() == '{"x":1}\n' and io.read_jsonl(path, repair=True) == [{"x": 1}]


@pytest.mark.parametrize("text, message", [
    ('{"a":1}\n\n{"b":2}\n', None),
    ('{"a":1}\nnope\n', ":2: corrupt JSON line: Expecting value"),
    ('{"a":1}\n\xff\n', ":2: not UTF-8 text (invalid start byte)"),
    ("[" * 100_000 + "\n", ":1: JSON nested too deeply"),
])
def test_a_bad_line_inside_a_jsonl_file_is_named_by_its_number(tmp_path, text, message):
    path = tmp_path / "h.jsonl"
    path.write_bytes(text.encode("latin-1") if "\xff" in text else text.encode())
    if message is None:
        assert io.read_jsonl(path) == [{"a": 1}, {"b": 2}]
        with pytest.raises(RunDirError) as info:
            io.read_jsonl(path, numbered=True)
        assert str(info.value) == f"{path}:2: empty line between records"
        return
    with pytest.raises(RunDirError) as info:
        io.read_jsonl(path)
    assert str(info.value) == f"{path}{message}"


def test_json_default_takes_numpy_scalars_sets_tuples_and_paths_only():
    import numpy as np

    assert io.dumps_line({"n": np.float32(0.5), "t": (1,), "p": Path("/x"), "i": np.int64(3)}) == (
        '{"i":3,"n":0.5,"p":"/x","t":[1]}')
    assert json.loads(io.dumps_line({"s": {2}})) == {"s": [2]}
    with pytest.raises(TypeError, match=r"^not JSON serialisable: object$"):
        io.dumps_line(object())


# ---------------------------------------------------------------- config


def test_one_line_joins_hydra_s_lines_drops_its_hints_and_lists_options_after_their_colon():
    from nas.config import one_line

    err = ValueError("Could not override 'x'.\nTo append to your config use +x=1\n"
                     "Available options in 'space':\n\tnb201\n\tnader\nfull_key: x\n"
                     "Config search path:\n\tprovider=hydra")
    assert one_line(err) == "Could not override 'x'; Available options in 'space': nb201, nader"
    assert one_line(ValueError("")) == "ValueError"
    assert one_line(ValueError("a.\n\nb\nSee https://x\nSet the environment variable HYDRA_FULL_ERROR=1")) == "a; b"


def test_the_data_source_is_its_loading_keys_only():
    from nas.config import data_source

    assert data_source({"name": "cifar10", "root": None, "num_classes": 10, "channels": 3}) == {
        "name": "cifar10", "root": None}


@pytest.mark.parametrize("args, message", [
    (["experiment=x"], "experiment presets are added, not overridden: write +experiment=x"),
    (["space=nb201,nope"], "unknown space 'nope' (valid: "),
    (["+experiment=nope"], "unknown experiment 'nope' (valid: "),
    (["space=choice(nb201)", "seed", "~experiment"], None),
])
def test_group_choices_are_checked_before_hydra_composes(args, message):
    from nas.config import available, validate_group_overrides

    if message is None:
        validate_group_overrides(args)
        return
    with pytest.raises(ConfigError) as info:
        validate_group_overrides(args)
    assert str(info.value).startswith(message)
    if "valid: " in message:
        group = message.split()[1]
        assert str(info.value) == f"{message}{', '.join(available(group))})"


@pytest.mark.parametrize("args, message", [
    (["space=nb201", "strategy=optuna", "strategy.sampler_params.x=1"],
     "unknown key 'strategy.sampler_params.x' (valid keys of strategy.sampler_params: ); a key "
     "strategy.sampler_params does not list is added with +strategy.sampler_params.x=1"),
    (["space=nb201", "evaluator=table", "evaluator.nope.deeper=1"],
     "unknown key 'evaluator.nope.deeper' (valid keys of evaluator: name, path, metric, num_classes, resolution, "
     "simulated_cost_seconds)"),
    (["space=nb201", "evaluator=train", "evaluator.sizing=1"],
     "unknown key 'evaluator.sizing' (valid keys of evaluator: name, data, recipe, engine, channels, "
     "cells_per_stage, skeleton, budget, width_multiple, seeds, proxies, sandbox, trust_self_reported); it is a "
     "parameter: add it with +evaluator.sizing=VALUE"),
    (["space=nb201", "space.nope=1"], "unknown key 'space.nope' (valid keys of space: name, channels, cells_per_stage)"),
    (["space=nb201", "strategy=rea", "strategy.max_flops=1"],
     "unknown key 'strategy.max_flops' (valid keys of strategy: name, population_size, sample_size, unique, "
     "max_attempts); size limits live in the evaluator now: evaluator.budget.flops=VALUE"),
    (["space=nb201", "strategy=rea", "+strategy.sub.x=1"],
     "unknown key 'strategy.sub.x' (valid keys of strategy: name, population_size, sample_size, unique, "
     "max_attempts)"),
    (["space=nb201", "evaluator=table", "evaluator.metric.x=1"],
     "unknown key 'evaluator.metric.x': 'evaluator.metric' is a value, not a section"),
    (["+seed=1"], "'seed' is already in the config: write seed=1 (+ adds only keys the config does not have)"),
    (["space=nb201", "strategy=rea", "+strategy.x=1", "~strategy.unique", "evaluator=table",
      "evaluator.metric=null"], None),
])
def test_each_key_an_override_names_is_checked_in_one_line(args, message):
    from nas.config import check_config

    if message is None:
        cfg = check_config(args)
        assert cfg["strategy"]["x"] == 1 and "unique" not in cfg["strategy"] and cfg["evaluator"]["metric"] is None
        return
    with pytest.raises(ConfigError) as info:
        check_config(args)
    assert str(info.value) == message


# ---------------------------------------------------------------- report


def rrec(trial: int, acc: float | None, *, forged: bool = False, error: str | None = None, strategy=None,
         encoding="e", params=None, flops=None, screened: bool = False):
    from nas.core.trial import TrialRecord

    return TrialRecord(trial, f"k{trial}", encoding, acc, {"self_reported": True} if forged else {}, params, flops,
                       error, strategy=strategy or {}, screened=screened)


def summary(**kw):
    return {"strategy": "rea", "space": "nb201", "evaluator": "table", "seed": 0, "trials": 4, "failed": 1,
            "cache_hits": 0, "wall_seconds": 1.234, **kw}


def test_the_report_ranks_what_counts_for_best_and_says_what_was_self_reported():
    from nas import report

    history = [rrec(0, 50.0, params=1234.0, flops=5e6), rrec(1, 90.0, forged=True), rrec(2, None, error="x"),
               rrec(3, 70.0, encoding="a|b")]
    text = report.render_markdown(history, summary(best={"trial": 3, "accuracy": 70.0, "encoding": "a|b"},
                                                   self_reported=1, best_at={"2": 50.0, "4": None}), top=2)
    assert text.split("\n") == [
        "# Search report: rea on nb201", "", "| field | value |", "| --- | --- |", "| evaluator | table |",
        "| seed | 0 |", "| trials | 4 (failed 1, cache hits 0, self-reported 1: not ranked) |",
        "| best accuracy | 70.00 |", "| best encoding | `a\\|b` |", "| wall seconds | 1.23 |",
        "| best at 2 trials | 50.00 |", "| best at 4 trials | - |", "", "## Top 2 architectures", "",
        "| rank | trial | accuracy | params | FLOPs | encoding |", "| --- | --- | --- | --- | --- | --- |",
        "| 1 | 3 | 70.00 | - | - | `a\\|b` |", "| 2 | 0 | 50.00 | 1,234 | 5,000,000 | `e` |", "",
        "![best so far](best_so_far.png)", ""]
    trusted = report.render_markdown(history, summary(best={"trial": 1, "accuracy": 90.0, "encoding": "e"},
                                                      self_reported=1, screened=2,
                                                      spec={"evaluator": {"params": {"trust_self_reported": True}}}))
    lines = trusted.split("\n")
    assert "| trials | 4 (failed 1, cache hits 0, self-reported 1) |" in lines
    assert "| screened out | 2 (asked, scored, not evaluated) |" in lines
    assert "| best accuracy | 90.00 (self-reported by the model's own code, not verified) |" in lines
    assert "| 1 | 1 | 90.00 (self-reported, not verified) | - | - | `e` |" in lines and "## Top 3 architectures" in lines
    plain = report.render_markdown([], summary(best=None, failed=0))
    assert "| trials | 4 (failed 0, cache hits 0) |" in plain and "| best accuracy | - |" in plain
    assert "| best encoding | - |" in plain and "## Top 0 architectures" in plain


def test_a_multi_line_best_design_is_fenced_past_its_own_backticks_and_named_by_its_size():
    from nas import report

    design = "def f():\n    return '````'\x1b\n"
    text = report.render_markdown([rrec(0, 5.0, encoding=design)], summary(best={"trial": 0, "accuracy": 5.0,
                                                                                 "encoding": design}))
    assert "| best encoding | 2-line design (see history.jsonl) |" in text
    assert text.endswith("## Best design\n\n`````\ndef f():\n    return '````'\\x1b\n`````\n")
    assert report._fenced("x") == ["## Best design", "", "```", "x", "```", ""]


def test_the_design_section_tables_each_stage_and_each_design():
    from nas import report

    design = {"proposals": 4, "valid": 3, "pass_rate": 0.75, "duplicates": 1, "executability": 0.5,
              "success_rate": 0.255, "tokens_per_valid_design": 12345.4}
    history = [rrec(0, 60.0, strategy={"valid": True, "stage": "s1", "parent": 2, "idea": "wider | deeper",
                                       "retries": 2}),
               rrec(1, None, error="boom\nline", strategy={"valid": False, "debug_retries": 1, "downscale_retries": 2}),
               rrec(2, None, strategy={"valid": True}, screened=True),
               rrec(3, None, strategy={"valid": True}),
               rrec(4, 1.0, strategy={"origin": "random"})]
    llm = {"total": {"calls": 5, "live": 3, "cached": 2, "prompt_tokens": 1000, "completion_tokens": 20}}
    lines = report._design_section(history, {"design": design, "stages": {"s2": {**design, "tokens_per_valid_design": None},
                                                                          "s1": design}, "llm": llm})
    assert lines == [
        "## Design quality", "",
        "| designs | proposals | valid (pass rate) | duplicates | executability | success rate | tokens / valid |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        "| all | 4 | 3 (75%) | 1 | 50% | 26% | 12,345 |", "| s1 | 4 | 3 (75%) | 1 | 50% | 26% | 12,345 |",
        "| s2 | 4 | 3 (75%) | 1 | 50% | 26% | - |", "",
        "LLM: 5 calls (3 live, 2 cached, 0 replayed, 0 failed), 1,000 prompt + 20 completion tokens.",
        "", "## Designs", "", "| trial | stage | parent | idea | retries | outcome | accuracy |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        "| 0 | s1 | 2 | `wider \\| deeper` | 2 | trained | 60.00 |",
        "| 1 | - | - | - | 3 | `boom line` | - |",
        "| 2 | - | - | - | 0 | screened out | - |",
        "| 3 | - | - | - | 0 | failed | - |", ""]
    assert report._design_section([], {"design": design, "llm": {"total": {}}})[5] == ""


@pytest.mark.parametrize("text, span", [
    ("", ""), ("a", "`a`"), ("a`b", "``a`b``"), ("`a", "`` `a ``"), ("a ", "` a  `"), ("  ", "`  `"),
    ("a``b`", "``` a``b` ```"),
])
def test_a_code_span_is_fenced_past_its_backticks_and_padded_where_it_starts_or_ends_with_one(text, span):
    from nas.report import code_span

    assert code_span(text) == span


def test_cells_clip_escape_and_join_lines():
    from nas import report

    assert report._cell("a\n b\x07|c", 80) == "`a b\\x07\\|c`"
    assert report._cell("x" * 10, 5) == "`xxxx…`"
    assert report._code(None) == "-" and report._code(["a", 1]) == "`['a', 1]`"
    assert report._fmt(None) == "-" and report._fmt(1.005) == "1.00" and report._fmt_int(1234.9) == "1,234"
    assert report._accuracy(rrec(0, None)) == float("-inf") and report._accuracy(rrec(0, 3.0)) == 3.0


# ---------------------------------------------------------------- compare


def cmp_summary(**spec):
    return {"space": "nb201", "evaluator": "table", "strategy": "rea", "spec": spec}


def test_a_run_s_setting_is_its_dataset_space_evaluator_budget_and_constraint_less_what_changes_no_result():
    from nas import compare as C

    spec = {"space": {"name": "nb201", "params": {"channels": 16}},
            "evaluator": {"name": "train", "params": {"data": {"name": "cifar10", "root": "/d"}, "sandbox": {"x": 1},
                                                      "recipe": {"epochs": 2}}},
            "trials": 50, "constraint": {"flops": None, "params": 1e6}}
    assert C.run_setting({"spec": spec}) == {
        "dataset": "cifar10", "space": "nb201", "space.channels": 16, "evaluator": "train",
        "evaluator.recipe.epochs": 2, "budget.trials": 50, "constraint.flops": None, "constraint.params": 1e6}
    assert C.run_setting({"space": "s", "evaluator": "e"}) == {"space": "s", "evaluator": "e"}
    assert C.run_setting({"space": "s", "evaluator": "e", "spec": {"evaluator": {"name": "t", "params": {
        "data": "cifar10"}}}}) == {"space": "s", "evaluator": "t", "evaluator.data": "cifar10"}


def test_runs_that_differ_in_a_setting_are_refused_naming_two_and_the_count_of_others():
    from nas import compare as C

    a, b, c = Path("a"), Path("b"), Path("c")
    assert C.mixed_fields({a: {"x": 1, "y": [1]}, b: {"x": 1, "z": 2}, c: {"y": [1]}}) == []
    C.check_compatible({a: {"x": 1}, b: {"x": 1}})
    with pytest.raises(ConfigError) as info:
        C.check_compatible({a: {"x": 1, "y": 1}, b: {"y": 1}, c: {"x": 2, "y": 3, "w": 0}})
    assert str(info.value) == ("compare: a has x=1 but c has x=2 (and 1 more field): refusing to put them on one "
                               "axis (pass --allow-mixed to compare them anyway, one group per setting)")
    with pytest.raises(ConfigError, match=r"has x=\{\"k\": 1\} but b has x=s \(and 2 more fields\)"):
        C.check_compatible({a: {"x": {"k": 1}, "y": 1, "z": 1}, b: {"x": "s", "y": 2, "z": 2}})


def test_strategy_settings_and_the_screen_label():
    from nas import compare as C

    assert C.strategy_settings({"spec": {"strategy": {"params": {"population_size": 5, "llm": {"timeout_s": 3}}},
                                         "batch_size": 2, "in_flight": 1}}) == {
        "population_size": 5, "budget.batch_size": 2, "budget.in_flight": 1}
    assert C.strategy_settings({}) == {}
    assert C.screen_label({"screen": {"factor": 4, "scorer": "predictor"}}) == "+screen(x4,predictor)"
    assert C.screen_label({"screen": {"factor": 2}}) == "+screen(x2,?)"
    assert C.screen_label({"screen": {"factor": 1, "scorer": "p"}}) == "" and C.screen_label({}) == ""
    assert C.screen_label({"screen": {"factor": 4.0}}) == ""


def crun(seed, curve, strategy="rea", setting="nb201/table", run=None, points=(), random_only=None, screened=0):
    return {"seed": seed, "curve": curve, "strategy": strategy, "setting": setting, "space": "nb201",
            "evaluator": "table", "run": run or f"r{seed}", "points": list(points), "random_only": random_only,
            "screened": screened}


def test_the_default_trial_counts_are_quartiles_of_the_shortest_run():
    from nas import compare as C

    assert C.auto_at({"g": [crun(0, [1.0] * 10), crun(1, [1.0] * 12)]}) == [3, 5, 8, 10]
    assert C.auto_at({"g": [crun(0, [1.0])]}) == [1]
    assert C.auto_at({"g": [crun(0, [1.0] * 2)]}) == [1, 2]


def test_counts_beyond_some_runs_and_duplicate_seeds_and_random_starts_are_said():
    from nas import compare as C

    groups = {"g": [crun(0, [1.0] * 4, run="x"), crun(0, [1.0] * 6, run="y"), crun(1, [1.0] * 5)],
              "h": [crun(0, [1.0] * 6, random_only="only random", run="z"), crun(1, [1.0] * 6)]}
    assert C.beyond_warning(groups, [4]) is None
    assert C.beyond_warning(groups, [3, 5, 6]) == (
        "--at 5 6: beyond the length of 2 of 5 runs (shortest: 4 trials); those runs are left out of these cells "
        "('-' where none is left)")
    assert C.duplicate_seed_warnings(groups) == [
        "g: duplicate seeds 0 (2 runs), e.g. x and y: each run counts in the mean and std, so these seeds weigh more"]
    assert C.random_only_notes(groups) == {"h": "1 of 2 runs: only random"}
    assert C.random_only_notes({"h": [crun(0, [1.0], random_only="r")]}) == {"h": "r"}


def test_aggregate_gives_the_mean_the_sample_std_and_the_count_at_each_trial_count():
    from nas import compare as C

    groups = {"g": [crun(1, [None, 50.0, 60.0], screened=2), crun(0, [40.0, 70.0])], "h": [crun(0, [None])]}
    assert C.aggregate(groups, [1, 2, 3]) == {
        "g": {"runs": 2, "seeds": [0, 1], "screened": 1.0, "at": {
            "1": {"mean": 40.0, "std": 0.0, "n": 1}, "2": {"mean": 60.0, "std": pytest.approx(14.142135623730951),
                                                          "n": 2},
            "3": {"mean": 60.0, "std": 0.0, "n": 1}}},
        "h": {"runs": 1, "seeds": [0], "screened": 0.0, "at": {"1": None, "2": None, "3": None}}}


def test_the_baseline_is_a_label_or_a_strategy_with_one_group_per_axis():
    from nas import compare as C

    groups = {"rea @ a": [crun(0, [1.0])], "random @ a": [crun(0, [1.0], strategy="random")],
              "random[x=1] @ a": [crun(0, [1.0], strategy="random[x=1]")]}
    assert C.baseline_groups(groups, "rea @ a") == ["rea @ a"] and C.baseline_groups(groups, "rea") == ["rea @ a"]
    with pytest.raises(ConfigError) as info:
        C.baseline_groups(groups, "bananas")
    assert str(info.value) == ("compare: --baseline 'bananas' matches no group (groups: random @ a; "
                               "random[x=1] @ a; rea @ a)")
    groups["rea @ b"] = [crun(0, [1.0])]
    groups["rea @ b"][0]["space"] = "ofa"
    assert C.baseline_groups(groups, "rea") == ["rea @ a", "rea @ b"]
    groups["rea @ c"] = [crun(0, [1.0])]
    with pytest.raises(ConfigError, match=r"^compare: --baseline 'rea' is ambiguous, it matches 3 groups "
                                          r"\(rea @ a; rea @ b; rea @ c\): name one in full$"):
        C.baseline_groups(groups, "rea")


@pytest.mark.parametrize("diffs, reason, stats", [
    ([1.0, 2.0, -1.0, 0.0], "too few pairs (4 < 5)", (4, 2, 1, 1, 0.5)),
    ([0.0] * 5, "all differences are zero", (5, 0, 0, 5, 0.0)),
    ([], "too few pairs (0 < 5)", (0, 0, 0, 0, None)),
])
def test_the_wilcoxon_test_needs_five_pairs_and_a_difference(diffs, reason, stats):
    from nas import compare as C

    res = C.wilcoxon_paired(diffs)
    assert res["reason"] == reason and res["p_value"] is None and res["statistic"] is None
    assert (res["pairs"], res["better"], res["worse"], res["tied"], res["median_diff"]) == stats


def test_the_wilcoxon_test_of_five_pairs_all_better_gives_the_exact_p():
    from nas import compare as C

    res = C.wilcoxon_paired([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (res["p_value"], res["statistic"], res["reason"], res["better"]) == (0.0625, 0.0, None, 5)


def test_holm_multiplies_the_sorted_p_values_by_their_remaining_count_monotonically():
    from nas import compare as C

    cells = [{"p_value": p} for p in (0.04, 0.01, 0.03, None, 0.5)]
    C._holm({"a": {"at": {"1": cells[0], "2": cells[1]}}, "b": {"at": {"1": cells[2], "2": cells[3], "3": cells[4]}}})
    assert [c.get("p_holm") for c in cells] == [pytest.approx(0.09), 0.04, pytest.approx(0.09), None, 0.5]
    big = [{"p_value": 0.6}, {"p_value": 0.7}]
    C._holm({"a": {"at": {"1": big[0], "2": big[1]}}})
    assert [c["p_holm"] for c in big] == [1.0, 1.0]


def test_paired_tests_pair_runs_by_seed_and_leave_out_seeds_with_several_runs():
    from nas import compare as C

    base = [crun(s, [50.0, 50.0], strategy="random") for s in range(6)]
    mine = [crun(s, [50.0 + s + 1, 55.0], strategy="rea") for s in range(6)] + [crun(5, [1.0, 1.0])]
    groups = {"random @ a": base, "rea @ a": mine, "other @ b": [crun(0, [1.0], setting="x/y")],
              "far @ a": [crun(9, [1.0])]}
    tests = C.paired_tests(groups, "random", [1, 3])
    assert tests["other @ b"] == {"baseline": None, "note": "no baseline group on x/y", "at": {}}
    assert tests["far @ a"] == {"baseline": "random @ a", "seeds": [], "at": {},
                                "note": "no seeds in common with random @ a"}
    rea = tests["rea @ a"]
    assert rea["seeds"] == [0, 1, 2, 3, 4] and rea["note"] == "seeds with several runs left out: [5]"
    assert rea["at"]["1"]["pairs"] == 5 and rea["at"]["1"]["p_value"] == 0.0625
    assert rea["at"]["1"]["p_holm"] == 0.0625 and rea["at"]["3"]["pairs"] == 0
    text = C.render_tests(tests, "random")
    assert "| rea @ a | random @ a | 1 | 5 | +3.00 | 5/0/0 | 0.062 | 0.062 |" in text
    assert "| rea @ a | random @ a | 3 | 0 | - | 0/0/0 | too few pairs (0 < 5) | - |" in text
    assert text.endswith("- far @ a: no seeds in common with random @ a\n- other @ b: no baseline group on x/y\n"
                         "- rea @ a: seeds with several runs left out: [5]\n")
    assert C.render_tests({}, "random").endswith("\n\n- no group besides the baseline\n")


@pytest.mark.parametrize("p, text", [(0.0625, "0.062"), (0.001, "0.001"), (0.00099, "0.00099"), (1e-7, "1e-07")])
def test_p_values_show_three_places_or_two_significant_digits_below_a_thousandth(p, text):
    from nas import compare as C

    assert C._fmt_p(p) == text


@pytest.mark.parametrize("v, text", [(999.0, "999"), (999.5, "1k"), (1234.0, "1.23k"), (999_499.0, "999k"),
                                     (999_500.0, "1M"), (2.5e9, "2.5G"), (0.5, "0.5")])
def test_sizes_show_three_digits_and_the_unit_after_rounding(v, text):
    from nas import compare as C

    assert C._fmt_int(v) == text


def test_the_pareto_front_keeps_the_most_accurate_per_size_and_drops_the_dominated():
    from nas import compare as C

    pts = [{"accuracy": 60.0, "params": 10, "flops": None}, {"accuracy": 70.0, "params": 20, "flops": None},
           {"accuracy": 65.0, "params": 20, "flops": None}, {"accuracy": 50.0, "params": 30, "flops": None},
           {"accuracy": 80.0, "params": True, "flops": None}, {"accuracy": float("nan"), "params": 5, "flops": None}]
    fronts = C.pareto_fronts({"g": [crun(0, [1.0], points=pts)]})
    g = fronts["params"]["groups"]["g"]
    assert g["trials"] == 4 and [(p["params"], p["accuracy"]) for p in g["front"]] == [(10, 60.0), (20, 70.0)]
    assert g["front"][0]["seed"] == 0 and g["front"][0]["run"] == "r0"
    assert fronts["flops"] == {"groups": {}, "note": "no successful trial has flops"}
    assert fronts["params"]["note"] is None
    text = C.render_pareto(fronts)
    assert "| g | params | 4 | 2 | 70.00% at 20 | 60.00% at 10 |" in text and text.endswith(
        "\n\n- flops: no successful trial has flops\n")
    assert C._finite(1) and C._finite(1.5) and not C._finite(True) and not C._finite(math_inf()) and not C._finite("1")


def test_on_a_tie_at_one_size_the_front_keeps_the_first_runs_point():
    from nas import compare as C

    pts = {"accuracy": 70.0, "params": 20, "flops": None}
    front = C.pareto_fronts({"g": [crun(0, [1.0], points=[pts]), crun(1, [1.0], points=[pts])]})
    assert [(p["seed"], p["run"]) for p in front["params"]["groups"]["g"]["front"]] == [(0, "r0")]


def test_the_curves_plot_has_whole_trial_numbers_on_its_x_axis(tmp_path, monkeypatch):
    from nas import compare as C

    figures = []
    save = C.save_figure
    monkeypatch.setattr(C, "save_figure", lambda fig, path: (figures.append(fig), save(fig, path)))
    C.plot_curves({"g": [crun(0, [1.0, 2.0, 3.0]), crun(1, [1.5, 2.5, 2.5])]}, tmp_path / "c.png")
    (fig,) = figures
    ticks = [t for t in fig.axes[0].get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert (tmp_path / "c.png").stat().st_size > 1000


def math_inf() -> float:
    return float("inf")


def test_the_table_marks_random_starts_screening_and_the_random_search_reference():
    from nas import compare as C

    table = {"g": {"runs": 2, "screened": 1.5, "at": {"1": {"mean": 50.0, "std": 1.0, "n": 2}, "3": None}}}
    ref = {"source": "NB201 table", "optimum": 94.37, "random_expected": [80.0, 85.0]}
    assert C.render_table(table, [1, 3], {"g": "random"}, ref).split("\n") == [
        "| strategy @ space/evaluator | runs | screened / run | best @ 1 | best @ 3 |",
        "| --- | --- | --- | --- | --- |",
        "| g † | 2 | 2 | 50.00 ± 1.00 (n=2) | - |",
        "| random search, expected (NB201 table) | - | - | 80.00 | - |", "",
        "Optimum of the NB201 table: 94.37.",
        "Screened / run: candidates asked and scored but not evaluated (screen.factor); not trials, not failures.",
        "- † g: random", ""]
    plain = {"g": {"runs": 1, "screened": 0.0, "at": {"2": {"mean": 1.0, "std": 0.0, "n": 1}}}}
    assert C.render_table(plain, [2]) == ("| strategy @ space/evaluator | runs | best @ 2 |\n| --- | --- | --- |\n"
                                          "| g | 1 | 1.00 ± 0.00 (n=1) |\n")


def test_the_report_has_its_warnings_tests_and_figures_only_when_there_are_some():
    from nas import compare as C

    groups = {"g": {"runs": 3, "screened": 0.0, "at": {"1": None}}}
    pareto = {"params": {"groups": {}, "note": "n"}}
    report = {"groups": groups, "at": [1], "notes": {}, "reference": None, "band": "iqr", "warnings": ["w1"],
              "tests": None, "pareto": pareto, "figures": {"pareto": None}}
    text = C.render_report(report)
    assert text.startswith("# Comparison of 3 runs\n\n## Warnings\n\n- w1\n\n## Best accuracy so far")
    assert "![best-so-far curves, mean with interquartile range](compare.png)" in text
    assert "Paired tests" not in text and "![Pareto fronts]" not in text
    text = C.render_report({**report, "band": "std", "warnings": [], "tests": {}, "baseline": "b",
                            "figures": {"pareto": "pareto.png"}})
    assert "## Warnings" not in text and "mean with ±1 std" in text and "## Paired tests against the baseline" in text
    assert text.endswith("![Pareto fronts](pareto.png)\n")


@pytest.mark.parametrize("at, band, message", [
    ([], "std", "compare: trial counts must be positive integers, got []"),
    ([1, 0], "std", "compare: trial counts must be positive integers, got [1, 0]"),
    ([1], "max", "compare: unknown band 'max' (valid: std, iqr)"),
])
def test_compare_refuses_bad_counts_and_bands_before_reading_a_run(tmp_path, at, band, message):
    from nas import compare as C
    from nas.errors import NasError

    with pytest.raises(NasError) as info:
        C.compare([tmp_path / "none"], tmp_path / "out", at=at, band=band)
    assert str(info.value) == message


def test_find_runs_names_a_missing_path_or_one_without_runs(tmp_path):
    from nas import compare as C
    from nas.errors import NasError

    with pytest.raises(NasError, match=rf"^compare: {tmp_path}/none does not exist$"):
        C.find_runs([tmp_path / "none"])
    with pytest.raises(NasError, match=rf"^compare: no summary.json found under {tmp_path}$"):
        C.find_runs([tmp_path])
    (tmp_path / "b" / "r").mkdir(parents=True)
    (tmp_path / "b" / "r" / "summary.json").write_text("{}")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "summary.json").write_text("{}")
    assert C.find_runs([tmp_path, tmp_path / "a"]) == [tmp_path / "a", tmp_path / "b" / "r"]


# ---------------------------------------------------------------- measure


class Op(__import__("torch").nn.Module):
    """One product fvcore has no handle for, on fixed operands (its FLOPs are what the handle says)."""

    def __init__(self, fn, *operands) -> None:
        super().__init__()
        self.fn, self.operands = fn, operands

    def forward(self, x):
        return self.fn(*self.operands) + x.sum() * 0


def _ops():
    import torch
    import torch.nn.functional as F

    z = torch.zeros
    return [
        ("baddbmm", Op(torch.baddbmm, z(2, 3, 5), z(2, 3, 4), z(2, 4, 5)), 2 * 3 * 4 * 5),
        ("addbmm", Op(torch.addbmm, z(3, 5), z(2, 3, 4), z(2, 4, 5)), 2 * 3 * 4 * 5),
        ("mv", Op(torch.mv, z(3, 4), z(4)), 12),
        ("addmv", Op(torch.addmv, z(3), z(3, 4), z(4)), 12),
        ("dot", Op(torch.dot, z(7), z(7)), 7),
        ("attention", Op(F.scaled_dot_product_attention, z(2, 4, 5, 8), z(2, 4, 6, 8), z(2, 4, 6, 3)),
         2 * 4 * 5 * 6 * (8 + 3)),
        ("bilinear", Op(F.bilinear, z(2, 3), z(2, 4), z(5, 3, 4)), 2 * 5 * 3 * 4),
        ("conv same", Op(lambda x, w: F.conv2d(x, w, padding="same"), z(2, 3, 5, 5), z(4, 3, 3, 3)),
         2 * 4 * 3 * 3 * 3 * 25),
    ]


@pytest.mark.parametrize("case", range(8))
def test_the_products_fvcore_has_no_handle_for_are_counted(case):
    from nas.measure import count_flops

    name, module, flops = _ops()[case]
    assert count_flops(module, (1,)) == flops, name


def test_a_count_leaves_the_module_in_the_mode_it_was_and_params_add_what_a_class_carries(monkeypatch):
    import torch

    from nas import measure

    net = torch.nn.Sequential(torch.nn.Linear(3, 2))
    net.train()
    assert measure.flops_by_module(net, (1, 3)) == {"": 6, "0": 6} and net.training
    net.eval()
    measure.count_flops(net, (1, 3))
    assert not net.training and measure.count_params(net) == 8
    monkeypatch.setitem(measure.EXTRA_PARAMETERS, torch.nn.Sequential, lambda m: 100)
    assert measure.count_params(net) == 108 and measure.count_params(torch.nn.Linear(3, 2)) == 8


# ---------------------------------------------------------------- more (self-check survivors)


class Recorded(WorkerPool):
    """`from_settings`' choice of slots and attempts, without starting a worker."""

    def __init__(self, spec_dict, slots, *, max_attempts: int = 3) -> None:
        self.args = (spec_dict, slots, max_attempts)


@pytest.mark.parametrize("env, settings, in_flight, slots, attempts", [
    ("0,1", {}, 5, [Slot(0, "0"), Slot(1, "1")], 3),                      # one worker per GPU by default
    ("0,1", {"per_gpu": 2, "max_attempts": 1}, 5, [Slot(i, g, 0.5) for i, g in enumerate("0101")], 1),
    ("", {}, 3, [Slot(0, None), Slot(1, None), Slot(2, None)], 3),        # no GPU: budget.in_flight workers
    ("", {"workers": 2}, 3, [Slot(0, None), Slot(1, None)], 3),
])
def test_the_pool_s_slots_follow_the_gpus_per_gpu_and_in_flight(monkeypatch, env, settings, in_flight, slots,
                                                                 attempts):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    pool = Recorded.from_settings({"s": 1}, settings, in_flight)
    assert pool.args == ({"s": 1}, slots, attempts)  # type: ignore[attr-defined]


def test_einsum_counts_one_operand_and_a_product_as_fvcore_does():
    from nas.measure import einsum_macs

    assert einsum_macs("i->i", [[3]]) == 1
    assert einsum_macs("ij,jk->ik", [[2, 3], [3, 4]]) == 24
    assert einsum_macs("ij,jk", [[2, 3], [3, 4]]) == 24  # implicit output: ik


def test_expected_best_of_n_distinct_draws():
    from nas.compare import expected_best

    assert expected_best([3.0, 1.0, 2.0], 5) == pytest.approx([2.0, 8 / 3, 3.0])
    assert expected_best([1.0, 2.0], 1) == [1.5]


def write_run(run: Path, summary: dict, lines: list[dict]) -> Path:
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "history.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def hline(i: int, acc, **kw) -> dict:
    return {"trial": i, "key": f"k{i}", "encoding": "e", "accuracy": acc, "metrics": {}, "params": 10 + i,
            "flops": None, "error": None if acc is not None else "x", **kw}


def test_runs_of_other_settings_are_refused_unless_mixed_and_then_grouped_by_what_differs(tmp_path):
    from nas import compare as C

    def summary(seed: int, metric: str, pop: int) -> dict:
        spec = {"space": {"name": "nb201"}, "evaluator": {"name": "table", "params": {"metric": metric}},
                "strategy": {"name": "rea", "params": {"population_size": pop}}, "trials": 3}
        return {"space": "nb201", "evaluator": "table", "strategy": "rea", "seed": seed, "spec": spec}

    lines = [hline(0, None), hline(1, 50.0), hline(2, 60.0, screened=True)]
    runs = [write_run(tmp_path / "a", summary(0, "valid", 5), lines),
            write_run(tmp_path / "b", summary(1, "test", 5), lines),
            write_run(tmp_path / "c", summary(2, "test", 9), lines)]
    with pytest.raises(ConfigError, match=r"has evaluator\.metric=valid but .* has evaluator\.metric=test: refusing"):
        C.load_curves(runs)
    groups = C.load_curves(runs, allow_mixed=True)
    assert sorted(groups) == ["rea[population_size=5] @ nb201/table [evaluator.metric=test]",
                              "rea[population_size=5] @ nb201/table [evaluator.metric=valid]",
                              "rea[population_size=9] @ nb201/table [evaluator.metric=test]"]
    run = groups["rea[population_size=9] @ nb201/table [evaluator.metric=test]"][0]
    assert (run["seed"], run["curve"], run["screened"], run["run"]) == (2, [None, 50.0], 1, str(tmp_path / "c"))
    assert [p["trial"] for p in run["points"]] == [1, 2] and run["random_only"] is not None


def test_a_sweep_s_jobs_are_the_product_of_its_values_and_a_run_is_one_job():
    from nas.config import job_overrides

    assert job_overrides(["seed=1,2", "space=nb201"], multirun=True) == [["seed=1", "space=nb201"],
                                                                          ["seed=2", "space=nb201"]]
    assert job_overrides(["seed=1"], multirun=False) == [["seed=1"]]
    with pytest.raises(ConfigError, match=r"^override 'seed' has no value: write seed=VALUE$"):
        job_overrides(["seed"], multirun=False)


def test_the_parameter_hint_is_empty_for_a_class_the_registry_does_not_know():
    from omegaconf import OmegaConf

    from nas.config import _add_hint

    assert _add_hint(OmegaConf.create({"evaluator": {"name": "bogus"}}), ["evaluator", "x"]) == ""
    assert _add_hint(OmegaConf.create({"evaluator": {"name": "train"}}), ["evaluator", "sizing"]) == (
        "; it is a parameter: add it with +evaluator.sizing=VALUE")
    assert _add_hint(OmegaConf.create({"seed": 1}), ["seed", "x"]) == ""
    assert _add_hint(OmegaConf.create({"evaluator": {"name": "train"}}), ["evaluator", "a", "b"]) == ""


def test_the_run_report_draws_from_a_first_failed_trial_on(tmp_path):
    from nas import report

    run = write_run(tmp_path / "r", {}, [hline(0, None), hline(1, 50.0), hline(2, 40.0)])
    report.write_run_report(run, summary(best={"trial": 1, "accuracy": 50.0, "encoding": "e"}, trials=3))
    assert (run / "best_so_far.png").read_bytes()[:4] == b"\x89PNG"
    assert (run / "report.md").read_text().startswith("# Search report: rea on nb201\n")


def test_the_report_child_writes_nothing_when_discarded_and_warns_in_one_line_when_it_fails(tmp_path, capsys):
    from nas import report

    (tmp_path / "d").mkdir()
    child = report.RunReport.start(tmp_path / "d")
    child.discard()
    assert list((tmp_path / "d").iterdir()) == [] and child.proc.returncode is not None
    (tmp_path / "f").mkdir()
    failing = report.RunReport(tmp_path / "f", {"no": "strategy"})
    failing.wait()
    assert capsys.readouterr().err == (f"warning: {tmp_path / 'f'}: best_so_far.png and report.md not written "
                                       "(KeyError: 'strategy')\n")
    good = write_run(tmp_path / "g", {}, [hline(0, 5.0)])
    fine = report.RunReport(good, summary(best=None))
    fine.wait()
    assert capsys.readouterr().err == "" and (good / "report.md").is_file()


def test_on_a_terminal_the_bar_is_drawn_on_stderr_even_when_it_is_captured(capsys):
    with status.status("working", total=2, tty=True) as advance:
        advance()
    assert "working" in capsys.readouterr().err
