"""Crash-safe file helpers (nas.io) and multi-run comparison (nas.compare)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nas import io as nio
from nas.compare import aggregate, compare, find_runs, load_curves, render_table
from nas.core.trial import best_so_far, read_history
from nas.errors import NasError, RunDirError
from nas.evaluators.table import TableEvaluator
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.spec import Component, SearchSpec
from nas.spaces.nb201.space import NB201Space

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def leftovers(directory: Path) -> list[Path]:
    return [p for p in Path(directory).iterdir() if p.name.endswith(".tmp")]


# --- output paths ------------------------------------------------------------------

DATA = Path(__file__).parent / "data"
CELL = "|nor_conv_3x3~0|+|nor_conv_1x1~0|nor_conv_1x1~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"
# (command, its output as '{file}' (a file is there) or '{dir}' (a directory is there), what is in the way)
OUTPUTS = [
    (["compare", "{run}", "--out", "{file}"], "{file}: is a file, expected a directory"),
    (["regress", "--suite", "smoke", "--out", "{file}"], "{file}: is a file, expected a directory"),
    (["regress", "--suite", "smoke", "--out", "{file}/sub"], "{file}: is a file, cannot hold {file}/sub"),
    (["knowledge", "ingest", "{paper}", "--out", "{file}"], "{file}: is a file, expected a directory"),
    (["knowledge", "ingest", "{paper}", "--out", "{run}"], "{run}: exists and is not an earlier ingest record "
                                                            "(holds history.jsonl); pass a new or empty --out"),
    (["knowledge", "stats", "--plot", "{dir}/"], "{dir}: is a directory, expected a file path"),
    (["train", CELL, "--out", "{dir}/"], "{dir}: is a directory, expected a file path"),
    (["arch", "draw", str(DATA / "blocks" / "residual.txt"), "-o", "{dir}/"],
     "{dir}: is a directory, expected a file path"),
    (["arch", "draw", str(DATA / "blocks" / "residual.txt"), "-o", "{file}/x.png"],
     "{file}: is a file, cannot hold {file}/x.png"),
    (["search", "hydra.run.dir={file}"], "{file}: is a file, expected a directory"),
    (["search", "hydra.run.dir={file}/sub"], "{file}: is a file, cannot hold {file}/sub"),
    (["search", "hydra.run.dir="], "hydra.run.dir is empty: give a directory (an empty one would write into the "
                                   "current one)"),
]


@pytest.mark.parametrize("args, message", OUTPUTS, ids=[" ".join(a[:2])[:24] for a, _ in OUTPUTS])
def test_output_path_of_the_wrong_kind_is_one_line_and_loses_nothing(tmp_path, monkeypatch, capsys, args, message):
    from nas.cli import main as cli

    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path / "home"))
    run = tmp_path / "run"
    run.mkdir()
    kept = {"summary.json": '{"strategy": "rea"}', "history.jsonl": ""}
    for name, text in kept.items():
        (run / name).write_text(text)
    (tmp_path / "somefile.txt").write_text("mine")
    (tmp_path / "somedir").mkdir()
    (tmp_path / "paper.txt").write_text("# A paper\n\n## Abstract\nGates.\n")
    names = {"run": run, "file": tmp_path / "somefile.txt", "dir": tmp_path / "somedir", "paper": tmp_path / "paper.txt"}
    with pytest.raises(SystemExit) as info:
        cli.main([a.format(**names) for a in args])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err == f"nas: error: {message.format(**names)}\n"
    assert (tmp_path / "somefile.txt").read_text() == "mine" and not any((tmp_path / "somedir").iterdir())
    assert {name: (run / name).read_text() for name in kept} == kept


@pytest.mark.parametrize("text, why", [("[1]", "expected a JSON object, found list ([1])"),
                                       ("{", "corrupt JSON at line 1 col 2: Expecting property name enclosed in "
                                             "double quotes")])
def test_ingest_out_with_a_bad_summary_is_a_user_error_naming_the_file(tmp_path, monkeypatch, capsys, text, why):
    from nas.cli import main as cli

    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path / "home"))
    (tmp_path / "paper.txt").write_text("# A paper\n\n## Abstract\nGates.\n")
    summary = tmp_path / "rec" / "summary.json"
    summary.parent.mkdir()
    summary.write_text(text)
    with pytest.raises(SystemExit) as info:
        cli.main(["knowledge", "ingest", str(tmp_path / "paper.txt"), "--out", str(summary.parent)])
    assert info.value.code == 2 and capsys.readouterr().err == f"nas: error: {summary}: {why}; pass a new or empty --out\n"
    assert summary.read_text() == text


def test_a_read_only_place_is_one_line_naming_the_path(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(nio.tempfile, "mkstemp", refuse)
    with pytest.raises(NasError) as info:
        nio.atomic_write_json(tmp_path / "out.json", {})
    assert str(info.value) == f"{tmp_path / 'out.json'}: cannot write (Read-only file system)"
    assert isinstance(info.value, OSError)  # code that tolerates a failed write still does


# --- atomic writes -----------------------------------------------------------------

def test_atomic_write_bytes_creates_parents_and_replaces(tmp_path):
    path = tmp_path / "a" / "b" / "file.bin"
    nio.atomic_write_bytes(path, b"one")
    assert path.read_bytes() == b"one"
    nio.atomic_write_bytes(path, b"two, longer")
    assert path.read_bytes() == b"two, longer"
    nio.atomic_write_text(path, "héllo")
    assert path.read_bytes() == "héllo".encode()
    assert leftovers(path.parent) == []
    assert sorted(p.name for p in path.parent.iterdir()) == ["file.bin"]


def test_atomic_writes_get_the_mode_open_gives(tmp_path):
    """mkstemp makes 0600 files: summary.json, reports and plots would be unreadable to a team."""
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # open(): 0666 less the umask
    nio.atomic_write_json(tmp_path / "summary.json", {"a": 1})
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_atomic_write_json_is_sorted_and_handles_numpy_paths_tuples(tmp_path):
    path = tmp_path / "doc.json"
    nio.atomic_write_json(path, {"b": np.float64(1.5), "a": (1, 2), "c": Path("/x/y"),
                                 "d": {3}, "e": np.int64(7)})
    text = path.read_text()
    assert text.endswith("\n")
    assert text.index('"a"') < text.index('"b"') < text.index('"c"')
    assert json.loads(text) == {"a": [1, 2], "b": 1.5, "c": "/x/y", "d": [3], "e": 7}
    assert nio.read_json(path) == json.loads(text)
    assert leftovers(tmp_path) == []


def test_failed_json_serialisation_leaves_original_untouched(tmp_path):
    path = tmp_path / "state.json"
    nio.atomic_write_json(path, {"ok": 1})
    before = path.read_bytes()

    class Opaque:
        pass

    with pytest.raises(TypeError, match="not JSON serialisable: Opaque"):
        nio.atomic_write_json(path, {"ok": 2, "z": [1, 2, Opaque()]})
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("fail", ["fsync", "replace"])
def test_failure_mid_write_leaves_original_and_no_temp(tmp_path, monkeypatch, fail):
    path = tmp_path / "state.json"
    nio.atomic_write_json(path, {"version": 1})
    before = path.read_bytes()
    seen: list[str] = []

    def boom(*args, **kwargs):
        seen.append(fail)
        # the temp file has been fully written by now
        assert any(p.name.startswith(".state.json.") for p in tmp_path.iterdir())
        raise OSError(f"{fail} failed")

    monkeypatch.setattr(nio.os, fail, boom)
    with pytest.raises(OSError, match=f"{fail} failed"):
        nio.atomic_write_json(path, {"version": 2, "big": "x" * 100_000})
    monkeypatch.undo()
    assert seen == [fail]
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_interrupt_mid_write_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    nio.atomic_write_text(path, "old")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(nio.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        nio.atomic_write_text(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert leftovers(tmp_path) == []


def test_read_json_corrupt_names_path_and_position(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text('{\n  "a": 1,\n  "b": \n}\n')
    with pytest.raises(RunDirError) as info:
        nio.read_json(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: corrupt JSON at line 4 col 1")


@pytest.mark.parametrize("reader, data", [
    ("read_json", b"\xff\xfe{}"),
    ("read_jsonl", b'{"a": 1}\n{"a": "\xff"}\n{"a": 3}\n'),
])
def test_invalid_utf8_is_rundir_error(tmp_path, reader, data):
    path = tmp_path / "file"
    path.write_bytes(data)
    with pytest.raises(RunDirError):
        getattr(nio, reader)(path)


# --- JSONL --------------------------------------------------------------------------------

def test_append_and_read_jsonl_round_trip(tmp_path):
    path = tmp_path / "h.jsonl"
    assert nio.read_jsonl(path) == []
    nio.append_jsonl(path, [])
    assert not path.exists()  # nothing to append: no file
    recs = [{"trial": i, "b": [i, None], "a": "x"} for i in range(5)]
    nio.append_jsonl(path, recs[:2])
    nio.append_jsonl(path, recs[2:])
    assert nio.read_jsonl(path) == recs
    lines = path.read_text().splitlines()
    assert lines[0] == '{"a":"x","b":[0,null],"trial":0}'  # compact, sorted
    assert nio.dumps_line({"z": np.float32(0.5), "a": (1,)}) == '{"a":[1],"z":0.5}'


def test_torn_last_line_dropped_and_repaired_only_on_request(tmp_path):
    path = tmp_path / "h.jsonl"
    nio.append_jsonl(path, [{"i": 0}, {"i": 1}])
    good = path.read_bytes()
    with open(path, "ab") as fh:
        fh.write(b'{"i": 2, "x')
    torn = path.read_bytes()
    assert nio.read_jsonl(path) == [{"i": 0}, {"i": 1}]
    assert path.read_bytes() == torn  # read-only by default
    assert nio.read_jsonl(path, repair=True) == [{"i": 0}, {"i": 1}]
    assert path.read_bytes() == good
    nio.append_jsonl(path, [{"i": 2}])
    assert nio.read_jsonl(path) == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_complete_json_without_newline_counts_as_torn(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text('{"i": 0}\n{"i": 1}')
    assert nio.read_jsonl(path, repair=True) == [{"i": 0}]
    assert path.read_text() == '{"i": 0}\n'


@pytest.mark.parametrize("lines, bad_line", [
    (['{"i": 0}', "{oops", '{"i": 2}'], 2),
    (['{"i": 0}', "", '{"i": 1', '{"i": 3}'], 3),  # blank lines still count
    (['{"i": 0}', '{"i": 1}', "not json"], 3),  # a complete (newline-ended) last line is not torn
])
def test_corrupt_line_names_file_and_line(tmp_path, lines, bad_line):
    path = tmp_path / "history.jsonl"
    path.write_text("\n".join(lines) + "\n")
    before = path.read_bytes()
    with pytest.raises(RunDirError) as info:
        nio.read_jsonl(path, repair=True)
    assert str(info.value).startswith(f"{path}:{bad_line}: corrupt JSON line")
    assert path.read_bytes() == before


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_text('{"i": 0}\n\n  \n{"i": 1}\n')
    assert nio.read_jsonl(path) == [{"i": 0}, {"i": 1}]


def test_a_blank_line_between_numbered_records_is_an_error_naming_it(tmp_path):
    """In history.jsonl a record's line is its trial number: a blank line is named, not read as a
    trial-number mismatch on the line after it."""
    path = tmp_path / "history.jsonl"
    path.write_text('{"i": 0}\n{"i": 1}\n\n  \n{"i": 2}\n')
    before = path.read_bytes()
    with pytest.raises(RunDirError) as info:
        nio.read_jsonl(path, repair=True, numbered=True)
    assert str(info.value) == f"{path}:3: empty line between records"
    assert path.read_bytes() == before


@pytest.mark.parametrize("numbered", [False, True])
def test_blank_lines_at_the_end_are_dropped_and_cut_on_repair(tmp_path, numbered):
    """So that the next append does not strand them between records."""
    path = tmp_path / "history.jsonl"
    path.write_text('{"i": 0}\n{"i": 1}\n\n \n{"i": 2, "x')
    before = path.read_bytes()
    assert nio.read_jsonl(path, numbered=numbered) == [{"i": 0}, {"i": 1}]
    assert path.read_bytes() == before  # read-only by default
    assert nio.read_jsonl(path, repair=True, numbered=numbered) == [{"i": 0}, {"i": 1}]
    assert path.read_text() == '{"i": 0}\n{"i": 1}\n'
    nio.append_jsonl(path, [{"i": 2}])
    assert nio.read_jsonl(path, numbered=True) == [{"i": 0}, {"i": 1}, {"i": 2}]


def test_rewrite_and_truncate(tmp_path):
    path = tmp_path / "h.jsonl"
    nio.append_jsonl(path, [{"i": i} for i in range(4)])
    nio.rewrite_jsonl(path, [{"i": 9}])
    assert path.read_text() == '{"i":9}\n'
    assert leftovers(tmp_path) == []
    nio.truncate_bytes(path, 3)
    assert path.read_bytes() == b'{"i'


# --- compare --------------------------------------------------------------------------------

STRATS = ("random", "rea")
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def runs_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("multirun")
    evaluator = TableEvaluator(NB201Space())
    for strategy in STRATS:
        for seed in SEEDS:
            spec = SearchSpec(Component("nb201"), Component(strategy), Component("table"),
                              seed=seed, trials=30)
            SearchLoop(spec, root / f"{strategy}_s{seed}", LocalExecutor(evaluator, None),
                       progress=False).run_search()
    return root


def curves_by_strategy(root: Path) -> dict[str, list[list[float | None]]]:
    out: dict[str, list] = {s: [] for s in STRATS}
    for strategy in STRATS:
        for seed in SEEDS:
            hist = read_history(root / f"{strategy}_s{seed}" / "history.jsonl")
            out[strategy].append(best_so_far(hist))
    return out


def test_find_runs(runs_root):
    runs = find_runs([runs_root])
    assert runs == sorted(runs_root / f"{s}_s{seed}" for s in STRATS for seed in SEEDS)
    assert find_runs([runs_root, runs_root / "rea_s1"]) == runs  # deduplicated
    assert find_runs([runs_root / "rea_s1"]) == [runs_root / "rea_s1"]


def test_compare_writes_outputs_with_numpy_statistics(runs_root, tmp_path):
    at = [1, 10, 30]
    report = compare([runs_root], tmp_path / "out", at)
    table = report["groups"]
    out = tmp_path / "out"
    assert json.loads((out / "compare.json").read_text()) == report
    assert report["at"] == at and report["tests"] is None
    assert (out / "compare.png").read_bytes()[:8] == PNG_MAGIC
    assert (out / "pareto.png").read_bytes()[:8] == PNG_MAGIC  # the table gives params and FLOPs
    md = (out / "compare.md").read_text()
    assert "| strategy @ space/evaluator | runs | best @ 1 | best @ 10 | best @ 30 |" in md.splitlines()

    curves = curves_by_strategy(runs_root)
    assert set(table) == {f"{s} @ nb201/table" for s in STRATS}
    for strategy in STRATS:
        row = table[f"{strategy} @ nb201/table"]
        assert row["runs"] == 3
        assert row["seeds"] == list(SEEDS)
        for n in at:
            vals = np.array([c[n - 1] for c in curves[strategy]], dtype=float)
            stats = row["at"][str(n)]
            assert stats["n"] == 3
            assert stats["mean"] == pytest.approx(float(np.mean(vals)), abs=1e-12)
            assert stats["std"] == pytest.approx(float(np.std(vals, ddof=1)), abs=1e-12)
            assert f"{stats['mean']:.2f} ± {stats['std']:.2f} (n=3)" in md
    # best-so-far never decreases, so neither does the mean
    for row in table.values():
        means = [row["at"][str(n)]["mean"] for n in at]
        assert means == sorted(means)
    assert leftovers(out) == []


def test_compare_beyond_run_length_gives_none(runs_root, tmp_path):
    table = compare([runs_root / "rea_s0"], tmp_path, [30, 31])["groups"]
    row = table["rea @ nb201/table"]
    assert row["runs"] == 1
    assert row["at"]["30"]["std"] == 0.0 and row["at"]["30"]["n"] == 1
    assert row["at"]["31"] is None
    lines = (tmp_path / "compare.md").read_text().splitlines()
    line = next(x for x in lines if x.startswith("| rea @ nb201/table | 1 | "))
    assert line.endswith("| - |")


def test_aggregate_and_render_directly():
    groups = {"g": [{"seed": 1, "curve": [None, 50.0, 60.0]},
                    {"seed": 0, "curve": [40.0, 40.0, 80.0]}]}
    table = aggregate(groups, [1, 2, 3])
    row = table["g"]
    assert row["seeds"] == [0, 1]
    assert row["at"]["1"] == {"mean": 40.0, "std": 0.0, "n": 1}  # None values are skipped
    assert row["at"]["2"]["mean"] == 45.0
    assert row["at"]["2"]["std"] == pytest.approx(float(np.std([50.0, 40.0], ddof=1)))
    assert row["at"]["3"]["mean"] == 70.0
    assert render_table(table, [2]).splitlines()[2] == "| g | 2 | 45.00 ± 7.07 (n=2) |"


def test_load_curves_labels(runs_root):
    groups = load_curves(find_runs([runs_root]))
    assert sorted(groups) == ["random @ nb201/table", "rea @ nb201/table"]
    assert sorted(r["seed"] for r in groups["rea @ nb201/table"]) == list(SEEDS)
    assert all(len(r["curve"]) == 30 for g in groups.values() for r in g)


def test_compare_nonexistent_dir(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(NasError, match=f"compare: {missing} does not exist"):
        compare([missing], tmp_path / "out", [10])
    assert not (tmp_path / "out").exists()


def test_compare_dir_without_runs(tmp_path):
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "history.jsonl").write_text("{}\n")
    with pytest.raises(NasError, match="no summary.json found under"):
        compare([tmp_path / "empty"], tmp_path / "out", [10])


@pytest.mark.parametrize("at", [[], [0], [10, -1], [0, 5]])
def test_compare_rejects_non_positive_at(runs_root, tmp_path, at):
    with pytest.raises(NasError, match="trial counts must be positive integers"):
        compare([runs_root], tmp_path / "out", at)
    assert not (tmp_path / "out").exists()


def test_compare_corrupt_summary_is_rundir_error(runs_root, tmp_path):
    import shutil

    copy = tmp_path / "runs"
    shutil.copytree(runs_root / "rea_s0", copy / "rea_s0")
    (copy / "rea_s0" / "summary.json").write_text("{")
    with pytest.raises(RunDirError, match="summary.json: corrupt JSON"):
        compare([copy], tmp_path / "out", [10])
