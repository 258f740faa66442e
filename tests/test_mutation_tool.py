"""benchmarks/mutation.py's own parts: the sample stratified by package (in proportion to lines, a
minimum each, the same for the same seed) and the coverage map's choice of tests (a line no passing
test ran is 'uncovered': not run, and counted as survived)."""

from __future__ import annotations

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import mutation  # noqa: E402
from mutation import Mutant, Selector, allocate, stratified_sample, tally  # noqa: E402


def _mutants(group: str, n: int) -> list[Mutant]:
    return [Mutant(f"{group}/m.py", i + 1, "compare", "a == b", "a != b", (i + 1, 0), (i + 1, 6), first_line=i + 1)
            for i in range(n)]


def test_allocate_gives_the_minimum_then_the_rest_in_proportion_to_lines():
    lines = {"big": 1000, "mid": 500, "small": 100}
    plenty = {g: 1000 for g in lines}
    # 2 each, then 26 by lines: 16.25, 8.125, 1.625 -> 16, 8, 1 and the one left to the largest remainder
    assert allocate(lines, plenty, 32, 2) == {"big": 18, "mid": 10, "small": 4}
    assert allocate(lines, plenty, 160, 0) == {"big": 100, "mid": 50, "small": 10}
    assert sum(allocate(lines, plenty, 77, 3).values()) == 77


def test_allocate_never_takes_more_than_a_package_has_and_passes_the_rest_on():
    lines = {"big": 1000, "mid": 1000, "tiny": 5000}
    got = allocate(lines, {"big": 100, "mid": 100, "tiny": 3}, 40, 4)
    assert got["tiny"] == 3  # all it has, under the minimum
    assert got == {"big": 19, "mid": 18, "tiny": 3} or got == {"big": 18, "mid": 19, "tiny": 3}
    assert allocate(lines, {"big": 5, "mid": 5, "tiny": 3}, 40, 4) == {"big": 5, "mid": 5, "tiny": 3}


def test_stratified_sample_is_the_same_for_a_seed_and_each_package_draws_on_its_own():
    groups = {"a": _mutants("a", 50), "b": _mutants("b", 50), "c": _mutants("c", 50)}
    lines = {"a": 600, "b": 300, "c": 100}

    def keys(sample):
        return [(m.package, m.line) for m in sample]

    first = stratified_sample({g: list(ms) for g, ms in groups.items()}, lines, 20, 3, seed=7)
    again = stratified_sample({g: list(ms) for g, ms in groups.items()}, lines, 20, 3, seed=7)
    other = stratified_sample({g: list(ms) for g, ms in groups.items()}, lines, 20, 3, seed=8)
    assert keys(first) == keys(again) and keys(first) != keys(other)
    counts = {g: sum(m.package == g for m in first) for g in groups}
    assert counts == allocate(lines, {g: 50 for g in groups}, 20, 3) and counts["c"] >= 3
    # a package's draw does not move when another package changes
    fewer = stratified_sample({"a": list(groups["a"]), "c": list(groups["c"])}, {"a": 600, "c": 100}, 20, 3, seed=7)
    assert [m.line for m in fewer if m.package == "c"][:1] and set(m.line for m in first if m.package == "c") <= set(
        m.line for m in fewer if m.package == "c")


COVMAP = {"test_ids": ["t::fast", "t::failing", "t::slow", "t::other_file"],
          "tests": {"t::fast": {"seconds": 0.1, "outcome": "passed"},
                    "t::failing": {"seconds": 0.05, "outcome": "failed"},
                    "t::slow": {"seconds": 5.0, "outcome": "passed"},
                    "t::other_file": {"seconds": 1.0, "outcome": "passed"}},
          "lines": {"pkg/m.py": {"10": [0, 1, 2], "11": [1], "30": []}, "pkg/n.py": {"5": [3]}},
          "import_lines": {"pkg/m.py": [30]}}


def _at(line: int, first: int | None = None, end: int | None = None) -> Mutant:
    return Mutant("pkg/m.py", line, "compare", "a == b", "a != b", (line, 0), (end or line, 6),
                  first_line=first or line)


def test_selector_picks_the_passing_tests_that_ran_the_line_fastest_first_up_to_the_cap():
    how, tests, expected = Selector(COVMAP, cap=60).select(_at(10))
    assert how == "line" and tests == ["t::fast", "t::slow"] and expected == 5.1  # the failing one never
    assert Selector(COVMAP, cap=1).select(_at(10))[1] == ["t::fast"]
    # a statement over several lines: any of its lines counts
    assert Selector(COVMAP, cap=60).select(_at(12, first=10))[1] == ["t::fast", "t::slow"]


def test_a_line_only_a_failing_test_or_no_test_ran_is_uncovered():
    selector = Selector(COVMAP, cap=60)
    assert selector.select(_at(11)) == ("none", [], 0.0)  # only the failing test ran it
    assert selector.select(_at(99)) == ("none", [], 0.0)


def test_a_module_level_line_run_at_import_gets_the_tests_of_its_file():
    how, tests, _ = Selector(COVMAP, cap=60).select(_at(30))
    assert how == "import" and tests == ["t::fast", "t::slow"]  # not pkg/n.py's test


def test_an_uncovered_mutant_is_not_run_and_counts_as_survived(monkeypatch):
    ran, seen = [], []

    def copy_tree(copy):
        (copy / "pkg").mkdir()
        (copy / "pkg" / "m.py").write_text("x = 1\n" * 9 + "a == b\n")

    def run_tests(copy, tests, limit):
        ran.append(tests)
        seen.append((copy / "pkg" / "m.py").read_text())
        return "killed", 1.0, tests[0]

    monkeypatch.setattr(mutation, "_copy_tree", copy_tree)
    monkeypatch.setattr(mutation, "run_tests", run_tests)
    selector = Selector(COVMAP, cap=60)

    def plan(m):
        m.selection, tests, expected = selector.select(m)
        return tests, 60 + 3 * expected

    uncovered = _at(99)
    mutation._run_all([uncovered], plan, None, 60, 1)
    assert uncovered.outcome == "uncovered" and ran == []
    covered = _at(10)  # its tests run, on the mutated file (the stand-in kills it)
    mutation._run_all([covered], plan, None, 60, 1)
    assert covered.outcome == "killed" and covered.killer == "t::fast" and ran == [["t::fast", "t::slow"]]
    assert seen[0].endswith("(a != b)\n")
    numbers = tally([{**vars(covered), "package": "p"}, {**vars(uncovered), "package": "p"}], set())
    assert (numbers["tried"], numbers["killed"], numbers["uncovered"], numbers["kill_rate"]) == (2, 1, 1, 0.5)


def test_listed_equivalents_are_left_out_of_the_second_rate_only():
    killed = {**vars(_at(1)), "outcome": "killed", "package": "p"}
    survived = {**vars(_at(2)), "outcome": "survived", "package": "p"}
    gone = {**vars(_at(3)), "outcome": "gone", "package": "p"}
    numbers = tally([killed, survived, gone], {mutation._key(survived)})
    assert numbers["kill_rate"] == 0.5 and numbers["kill_rate_less_equivalent"] == 1.0
    assert numbers["tried"] == 2 and numbers["not_counted"] == {"gone": 1}


def test_a_time_budget_keeps_the_fastest_tests_that_fit_and_always_the_fastest():
    assert Selector(COVMAP, cap=60, budget=1.0).select(_at(10))[1] == ["t::fast"]
    assert Selector(COVMAP, cap=60, budget=5.1).select(_at(10))[1] == ["t::fast", "t::slow"]
    assert Selector(COVMAP, cap=60, budget=0.01).select(_at(10))[1] == ["t::fast"]


OWN = {"test_ids": ["tests/test_other.py::a", "tests/test_other.py::b", "tests/test_llm_client.py::slow",
                    "tests/test_llm_cases.py::c", "tests/test_client.py::d"],
       "tests": {"tests/test_other.py::a": {"seconds": 0.1, "outcome": "passed"},
                 "tests/test_other.py::b": {"seconds": 0.2, "outcome": "passed"},
                 "tests/test_llm_client.py::slow": {"seconds": 9.0, "outcome": "passed"},
                 "tests/test_llm_cases.py::c": {"seconds": 0.5, "outcome": "passed"},
                 "tests/test_client.py::d": {"seconds": 0.3, "outcome": "passed"}},
       "lines": {"nas/llm/client.py": {"7": [0, 1, 2, 3, 4]}}, "import_lines": {}}


@pytest.mark.parametrize("test, file, own", [
    ("tests/test_llm_client.py::t", "nas/llm/client.py", True),  # file and folder
    ("tests/test_llm_cases.py::t", "nas/llm/client.py", True),  # the folder
    ("tests/test_client.py::t", "nas/llm/client.py", True),  # the file
    ("tests/test_clients.py::t", "nas/llm/client.py", True),  # a plural
    ("tests/test_supernet_ranking.py::t", "supernets/train.py", True),  # the folder's singular
    ("tests/test_llmclient.py::t", "nas/llm/client.py", False),  # words, not substrings
    ("tests/test_nas_cli.py::t", "nas/secrets.py", False),  # `nas` is the whole library
    ("tests/test_secrets.py::t", "nas/secrets.py", True),
    ("tests/test_init.py::t", "nas/llm/__init__.py", False),  # a package's own file is its folder's
    ("tests/test_llm_cases.py::t", "nas/llm/__init__.py", True),
    ("tests/test_bus.py::t", "nas/bu.py", False),  # no `s` taken off a word of three letters
])
def test_own_tests_are_those_named_for_the_module_file_or_folder(test, file, own):
    assert mutation.own_test(test, file) is own


def test_own_tests_first_come_before_faster_tests_and_a_slow_one_over_budget_is_skipped_not_an_end():
    at = Mutant("nas/llm/client.py", 7, "compare", "a == b", "a != b", (7, 0), (7, 6), first_line=7)
    assert Selector(OWN, cap=60).select(at)[1][:2] == ["tests/test_other.py::a", "tests/test_other.py::b"]
    own = Selector(OWN, cap=60, own_first=True)
    assert own.select(at)[1] == ["tests/test_client.py::d", "tests/test_llm_cases.py::c",
                                 "tests/test_llm_client.py::slow", "tests/test_other.py::a", "tests/test_other.py::b"]
    # over budget: the slow own test is skipped and the faster others still fit
    assert Selector(OWN, cap=60, budget=1.2, own_first=True).select(at)[1] == [
        "tests/test_client.py::d", "tests/test_llm_cases.py::c", "tests/test_other.py::a", "tests/test_other.py::b"]
    assert Selector(OWN, cap=2, own_first=True).select(at)[1] == ["tests/test_client.py::d", "tests/test_llm_cases.py::c"]


def test_file_tests_give_an_uncovered_line_the_tests_of_its_file_and_no_other():
    selector = Selector(COVMAP, cap=60)
    assert selector.pick(_at(99)) == ("none", [], 0.0)
    how, tests, expected = selector.pick(_at(99), file_tests=True)
    assert how == "file" and tests == ["t::fast", "t::slow"] and expected == 5.1  # not the failing one, not n.py's
    assert selector.pick(_at(10), file_tests=True) == selector.select(_at(10))  # a covered line keeps its own
    lonely = Mutant("pkg/unseen.py", 1, "compare", "a == b", "a != b", (1, 0), (1, 6), first_line=1)
    assert selector.pick(lonely, file_tests=True) == ("none", [], 0.0)  # a file no test ran stays uncovered


def test_a_first_run_with_file_tests_runs_the_uncovered_mutants_on_their_files_tests(monkeypatch, tmp_path):
    import json

    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "m.py"
    source.write_text("x = 1\n" + "y = 0\n" * 8 + "z = a == b\n")  # line 10 covered, lines 1-9 not
    covmap = tmp_path / "covmap.json"
    covmap.write_text(json.dumps(COVMAP))
    ran = []

    def run_tests(copy, tests, limit, first=True):
        ran.append(tests)
        return ("killed", 1.0, tests[0]) if first else ("killed", 1.0, "")

    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    monkeypatch.setattr(mutation, "target_groups", lambda targets: {"pkg/m.py": [source]})
    monkeypatch.setattr(mutation, "_copy_tree", lambda copy: (copy / "pkg").mkdir() or (
        copy / "pkg" / "m.py").write_text(source.read_text()))
    monkeypatch.setattr(mutation, "run_tests", run_tests)

    def first_run(*extra):
        ran.clear()
        out = tmp_path / f"out{len(extra)}.json"
        assert mutation.main(["--target", "pkg/m.py", "--map", str(covmap), "--sample", "0", "--out", str(out),
                              *extra]) == 0
        return json.loads(out.read_text())

    plain = first_run()
    assert {m["line"]: m["outcome"] for m in plain["mutants"]} == {1: "uncovered", **{n: "uncovered" for n in
                                                                                      range(2, 10)}, 10: "killed"}
    assert not plain["selection"]["uncovered_ran_file_tests"]
    with_file = first_run("--file-tests")
    outcomes = {(m["line"], m["selection"]): m["outcome"] for m in with_file["mutants"]}
    assert outcomes == {**{(n, "file"): "killed" for n in range(1, 10)}, (10, "line"): "killed"}
    assert with_file["overall"]["uncovered"] == 0 and with_file["selection"]["uncovered_ran_file_tests"]
    assert ["t::fast", "t::slow"] in ran


def test_tests_newer_than_the_map_must_pass_on_the_unmutated_tree_in_a_first_run_and_a_recheck(
        monkeypatch, tmp_path, capsys):
    """`--tests` beside a map was never run on the clean tree: a new test that fails anyway (here
    always) counted every mutant as killed, in a recheck with no clean check of its killers at all."""
    import json

    (tmp_path / "pkg").mkdir()
    source = tmp_path / "pkg" / "m.py"
    source.write_text("x = 1\n" + "y = 0\n" * 8 + "z = a == b\n")
    covmap = tmp_path / "covmap.json"
    covmap.write_text(json.dumps(COVMAP))
    broken = "t::new"

    def run_tests(copy, tests, limit, first=True):
        return ("killed", 1.0, broken) if broken in tests else ("survived", 1.0, "")

    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    monkeypatch.setattr(mutation, "target_groups", lambda targets: {"pkg/m.py": [source]})
    monkeypatch.setattr(mutation, "_copy_tree", lambda copy: (copy / "pkg").mkdir() or (
        copy / "pkg" / "m.py").write_text(source.read_text()))
    monkeypatch.setattr(mutation, "run_tests", run_tests)
    out = tmp_path / "out.json"
    common = ["--target", "pkg/m.py", "--map", str(covmap), "--sample", "0", "--out", str(out)]
    assert mutation.main(common) == 0
    assert len(json.loads(out.read_text())["survivors"]) == 10  # none of the map's tests kills one
    assert mutation.main([*common, "--tests", broken]) == 1
    assert "do not pass on the unmutated tree" in capsys.readouterr().err
    assert mutation.main(common) == 0
    assert mutation.main([*common, "--recheck", "--tests", broken]) == 1
    assert "do not pass on the unmutated tree" in capsys.readouterr().err
    assert "final" not in json.loads(out.read_text())


BEFORE = "def f(alpha, beta):\n    x = g(True)\n    return alpha == beta and h(True)\n"


def _drawn(source: str, line: int, original: str) -> Mutant:
    (m,) = [m for m in mutation.mutants_of_source(source, "p/m.py") if m.line == line and m.original == original]
    return m


@pytest.mark.parametrize("after, line", [
    (BEFORE, 2),  # unchanged: the same spot
    ("import os\n\n" + BEFORE, 4),  # moved down with its line
    ("def f(alpha, beta):\n    x = g(True)  # noted\n    return alpha == beta and h(True)\n", None),  # its line changed
    ("def f(alpha, beta):\n    return alpha == beta and h(True)\n", None),  # its statement removed: not line 3's True
])
def test_a_recheck_moves_a_short_change_only_with_its_lines_text(after, line):
    found = mutation._locate(after, _drawn(BEFORE, 2, "True"))
    assert (found.line if found is not None else None) == line


def test_a_recheck_moves_a_distinct_change_by_its_text_and_takes_an_old_record_s_short_one_nowhere():
    m = _drawn(BEFORE, 3, "alpha == beta")
    moved = "def f(alpha, beta):\n    x = g(True)\n    return (\n        alpha == beta and h(True))\n"
    assert mutation._locate(moved, m).line == 4  # its line's text changed, its own text names it
    old = Mutant(**{**m.__dict__, "original": "True", "mutated": "False", "kind": "constant", "line": 2,
                    "start": (2, 10), "end": (2, 14), "context": ""})  # a record from before `context`
    assert mutation._locate(BEFORE, old).line == 2  # at its own spot still
    assert mutation._locate("import os\n" + BEFORE, old) is None  # elsewhere: which True is unknown
