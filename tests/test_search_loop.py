"""SearchLoop with the in-process executor: run files, resume and spec validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nas.core.trial import TrialRecord, best_so_far, read_history
from nas.errors import ConfigError, EvaluationError, RunDirError
from nas.evaluators.table import TableEvaluator
from nas.report import write_run_report
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.rundir import RunDir
from nas.search.spec import Component, SearchSpec
from nas.spaces import SPACES
from nas.spaces.nb201.arch import NB201Cell
from nas.spaces.nb201.space import NB201Space
from nas.strategies import STRATEGIES
from nas.strategies.random_search import RandomSearch

# Strategies that run on the NB201 table; LLM design strategies have their own e2e tests.
RANDOM_MOVES = [n for n in STRATEGIES.names() if STRATEGIES.get(n).random_moves]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RECORD_FIELDS = {"trial", "key", "encoding", "accuracy", "metrics", "params", "flops",
                 "wall_seconds", "cached", "strategy"}


@pytest.fixture(scope="module")
def evaluator() -> TableEvaluator:
    return TableEvaluator(NB201Space())


def make_spec(strategy: str = "rea", seed: int = 0, trials: int = 30, batch_size: int = 1,
              **strategy_params: Any) -> SearchSpec:
    return SearchSpec(space=Component("nb201"), strategy=Component(strategy, strategy_params),
                      evaluator=Component("table"), seed=seed, trials=trials, batch_size=batch_size)


def search(spec: SearchSpec, run_dir: Path, evaluator, executor=None) -> dict[str, Any]:
    executor = executor or LocalExecutor(evaluator, None)
    return SearchLoop(spec, run_dir, executor, progress=False).run_search()


def history(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "history.jsonl"
    if not path.exists():
        return []
    text = path.read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def keys(run_dir: Path) -> list[str]:
    return [r["key"] for r in history(run_dir)]


# --- outputs ------------------------------------------------------------------

@pytest.mark.parametrize("strategy", RANDOM_MOVES)
def test_run_writes_history_summary_and_report(tmp_path, evaluator, strategy):
    summary = search(make_spec(strategy, seed=3, trials=30), tmp_path, evaluator)
    hist = history(tmp_path)
    assert len(hist) == 30
    assert [r["trial"] for r in hist] == list(range(30))
    for r in hist:
        assert RECORD_FIELDS <= set(r)
        cell = NB201Cell.decode(r["encoding"])
        assert r["key"] == cell.key()
        expected = evaluator.evaluate(cell)
        assert r["accuracy"] == expected.accuracy
        assert r["metrics"] == {"baseline_accuracy": expected.accuracy}
        assert (r["params"], r["flops"]) == (expected.params, expected.flops)
        assert r["cached"] is False
        assert r["wall_seconds"] >= 0
        assert r["error"] is None
        assert isinstance(r["strategy"], dict) and "origin" in r["strategy"]
    assert len({r["key"] for r in hist}) == 30  # unique by default

    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    best = max(hist, key=lambda r: r["accuracy"])
    assert summary["best"]["accuracy"] == best["accuracy"]
    assert summary["best"]["key"] == best["key"]
    assert summary["best"]["encoding"] == best["encoding"]
    assert summary["best"]["trial"] == best["trial"]
    assert (summary["trials"], summary["failed"], summary["cache_hits"]) == (30, 0, 0)
    assert (summary["strategy"], summary["space"], summary["evaluator"]) == (strategy, "nb201", "table")
    assert summary["seed"] == 3
    assert summary["wall_seconds"] >= 0
    assert summary["exhausted"] is None
    assert summary["resumed_trials"] == 0
    curve = best_so_far(read_history(tmp_path / "history.jsonl"))
    assert summary["best_at"] == {"10": curve[9], "25": curve[24]}
    assert SearchSpec.from_dict(summary["spec"]) == make_spec(strategy, seed=3, trials=30)

    assert not (tmp_path / "best_so_far.png").exists() and not (tmp_path / "report.md").exists()  # the caller's
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["history_lines"] == 30
    assert not list(tmp_path.glob(".*.tmp"))


def test_caller_writes_the_report(tmp_path, evaluator):
    summary = search(make_spec("random", seed=3, trials=12), tmp_path, evaluator)
    write_run_report(tmp_path, summary)
    best = max(history(tmp_path), key=lambda r: r["accuracy"])
    assert (tmp_path / "best_so_far.png").read_bytes()[:8] == PNG_MAGIC
    report = (tmp_path / "report.md").read_text()
    assert best["encoding"].replace("|", "\\|") in report  # pipes escaped inside the table
    assert f"{best['accuracy']:.2f}" in report


def test_best_so_far_is_running_max():
    recs = [TrialRecord(i, "k", "e", acc) for i, acc in enumerate([None, 50.0, 40.0, None, 70.0, 60.0])]
    assert best_so_far(recs) == [None, 50.0, 50.0, 50.0, 70.0, 70.0]


@pytest.mark.parametrize("trials, batch_size", [(30, 4), (7, 10), (12, 3)])
def test_batches_give_exactly_trials_lines(tmp_path, evaluator, trials, batch_size):
    summary = search(make_spec("random", trials=trials, batch_size=batch_size), tmp_path, evaluator)
    hist = history(tmp_path)
    assert len(hist) == trials == summary["trials"]
    assert [r["trial"] for r in hist] == list(range(trials))
    assert len(set(r["key"] for r in hist)) == trials


def test_rea_with_batches(tmp_path, evaluator):
    search(make_spec("rea", trials=30, batch_size=4, population_size=8), tmp_path, evaluator)
    hist = history(tmp_path)
    assert len(hist) == 30
    assert [r["strategy"]["origin"] for r in hist[:8]] == ["init"] * 8
    assert {r["strategy"]["origin"] for r in hist[8:]} <= {"mutation", "random"}


def test_same_seed_same_trajectory_and_seeds_differ(tmp_path, evaluator):
    search(make_spec(seed=1), tmp_path / "a", evaluator)
    search(make_spec(seed=1), tmp_path / "b", evaluator)
    search(make_spec(seed=2), tmp_path / "c", evaluator)
    assert keys(tmp_path / "a") == keys(tmp_path / "b")
    assert keys(tmp_path / "a") != keys(tmp_path / "c")


# --- failures during evaluation ------------------------------------------------------

class FlakyEvaluator:
    """Raises a NasError for some cells and a crash for others."""

    def __init__(self, inner: TableEvaluator) -> None:
        self.inner = inner

    def evaluate(self, arch, seed=None):
        if arch.ops[0] == "none":
            raise EvaluationError(f"cannot evaluate {arch.to_string()}")
        if arch.ops[0] == "skip_connect":
            raise ZeroDivisionError("boom")
        return self.inner.evaluate(arch, seed)


def test_failed_evaluations_are_recorded_not_fatal(tmp_path, evaluator):
    summary = search(make_spec("random", trials=40), tmp_path, evaluator,
                     executor=LocalExecutor(FlakyEvaluator(evaluator), None))
    hist = history(tmp_path)
    assert len(hist) == 40
    failed = [r for r in hist if r["accuracy"] is None]
    ok = [r for r in hist if r["accuracy"] is not None]
    assert failed and ok
    for r in failed:
        first = NB201Cell.decode(r["encoding"]).ops[0]
        assert first in ("none", "skip_connect")
        if first == "none":
            assert r["error"].startswith("cannot evaluate")
        else:
            assert r["error"] == "evaluator crashed: ZeroDivisionError: boom"
    assert summary["failed"] == len(failed)
    assert summary["best"]["accuracy"] == max(r["accuracy"] for r in ok)


class AlwaysFails:
    def evaluate(self, arch, seed=None):
        raise EvaluationError("nope")


def test_all_failures_give_summary_without_best(tmp_path, evaluator):
    summary = search(make_spec("rea", trials=12, population_size=4), tmp_path, evaluator,
                     executor=LocalExecutor(AlwaysFails(), None))
    assert summary["best"] is None
    assert summary["failed"] == 12 == len(history(tmp_path))
    assert summary["best_at"] == {"10": None}
    write_run_report(tmp_path, summary)
    assert (tmp_path / "best_so_far.png").read_bytes()[:8] == PNG_MAGIC
    assert "| best accuracy | - |" in (tmp_path / "report.md").read_text()


@pytest.fixture
def tiny_space():
    from nas.core.space import SearchSpace

    class TinySpace(SearchSpace):
        name = "nb201"  # its cells are NB201 cells, so the table evaluator accepts them
        CELLS = [NB201Cell((op,) * 6) for op in ("nor_conv_3x3", "skip_connect", "nor_conv_1x1")]

        def sample(self, rng):
            return self.CELLS[int(rng.integers(len(self.CELLS)))]

        def mutate(self, arch, rng):
            return self.sample(rng)

        def decode(self, encoding):
            return NB201Cell.decode(encoding)

    return TinySpace()


def test_exhausted_strategy_stops_the_loop_and_says_why(tmp_path, evaluator, tiny_space, caplog, capsys):
    from nas.cli.search import print_summary

    loop = SearchLoop(make_spec("random", trials=10), tmp_path, LocalExecutor(evaluator, None),
                      progress=False)
    loop.strategy = RandomSearch(tiny_space, seed=0)
    with caplog.at_level("INFO", logger="nas.progress"):
        summary = loop.run_search()
    assert summary["trials"] == 3 == len(history(tmp_path))
    assert "no unvisited architecture" in summary["exhausted"]
    assert summary["best"]["encoding"] == NB201Cell(("nor_conv_3x3",) * 6).to_string()
    ended = f"ended after 3 of 10 trials: {summary['exhausted']}"
    assert f"search {ended}" in caplog.messages  # search.log says it
    print_summary(tmp_path, summary)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == ended  # and so does `nas search`
    assert out[2].startswith(f"best: {summary['best']['accuracy']:.2f}% {summary['best']['encoding']} key=")


def test_a_multi_line_best_design_is_named_not_printed(tmp_path, capsys):
    """A block file or model source (NADER, FairNAD) is dozens of lines: the summary line points
    to the report that shows it and says how to export it."""
    from nas.cli.search import print_summary

    block = "##Residual##\n0:input\n1:output\n2:Conv2d(out_channels=C,kernel_size=3)\n0->2\n2->1\n"
    summary = {"trials": 4, "wall_seconds": 12.5, "cache_hits": 0,
               "best": {"accuracy": 97.49, "encoding": block, "key": "94d0445e8764f180", "trial": 0}}
    print_summary(tmp_path, summary)
    assert capsys.readouterr().out.splitlines() == [
        f"run dir: {tmp_path}",
        f"best: 97.49% (6-line design in {tmp_path / 'report.md'}) key=94d0445e8764f180 (trial 0 of 4, 12.5s, 0 cached)",
        f"export it: nas export {tmp_path}"]
    summary["best"]["encoding"] = [0, 3, 1, 2]  # SPOS and OFA encode as lists of choices: printed as they are
    print_summary(tmp_path, summary)
    assert capsys.readouterr().out.splitlines()[1] == "best: 97.49% [0, 3, 1, 2] key=94d0445e8764f180 (trial 0 of 4, 12.5s, 0 cached)"



@pytest.mark.parametrize("scores, better, beat, plain", [
    ([90.0, 80.0, 85.0, 70.0], 0, 1, True),   # 85 beats its parent 80, none the root
    ([90.0, 91.0, 92.0, 80.0], 2, 2, False),  # 91 > 90 and 92 > 91: the root was beaten
    ([90.0, 90.0, 90.0, 90.0], 0, 0, True),   # equal is not better
])
def test_the_design_line_counts_designs_that_beat_their_parent_and_says_when_none_beat_the_root(
        tmp_path, capsys, scores, better, beat, plain):
    """NADER's tree: node 1 under the root, nodes 2 and 3 under node 1. The end line counts designs
    better than the root and than their own parent, and says plainly when none beat the root."""
    from nas.cli.search import print_summary
    from nas.core.trial import TrialRecord
    from nas.io import append_jsonl

    parents = [None, 0, 1, 1]
    append_jsonl(tmp_path / "history.jsonl", [
        TrialRecord(i, f"k{i}", f"block {i}", acc, strategy={"stage": "root"} if i == 0 else {"node": i}).to_json()
        for i, acc in enumerate(scores)])
    tree = {"nodes": [{"id": i, "parent": p, "score": acc} for i, (p, acc) in enumerate(zip(parents, scores))]}
    summary = {"trials": 4, "wall_seconds": 1.0, "cache_hits": 0, "tree": tree, "design": {"proposals": 3, "valid": 3},
               "best": {"accuracy": max(scores), "encoding": "x", "key": "k", "trial": 0}}
    print_summary(tmp_path, summary)
    out = capsys.readouterr().out.splitlines()
    line = next(o for o in out if o.startswith("LLM: "))
    assert f"3 trained, {better} better than the root (90.00%), {beat} better than their parent;" in line
    assert any(o.startswith("no design beat the root (90.00%)") and "llm=openai" in o for o in out) == plain


# --- resume ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference(tmp_path_factory, evaluator):
    """Uninterrupted REA runs, seed 4: 30 and 50 trials."""
    root = tmp_path_factory.mktemp("reference")
    search(make_spec(seed=4, trials=50), root / "r50", evaluator)
    search(make_spec(seed=4, trials=30), root / "r30", evaluator)
    return {30: keys(root / "r30"), 50: keys(root / "r50"),
            "hist50": history(root / "r50")}


def test_reference_runs_are_prefixes(reference):
    assert reference[50][:30] == reference[30]


def test_extend_finished_run(tmp_path, evaluator, reference):
    search(make_spec(seed=4, trials=30), tmp_path, evaluator)
    first = (tmp_path / "history.jsonl").read_text().splitlines()
    summary = search(make_spec(seed=4, trials=50), tmp_path, evaluator)
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert len(lines) == 50
    assert lines[:30] == first  # byte-identical: resumed lines are never rewritten
    assert keys(tmp_path) == reference[50]
    assert summary["trials"] == 50
    assert summary["resumed_trials"] == 30
    assert json.loads((tmp_path / "state.json").read_text())["history_lines"] == 50


def test_rerun_of_finished_run_changes_nothing(tmp_path, evaluator, reference):
    search(make_spec(seed=4, trials=30), tmp_path, evaluator)
    before = (tmp_path / "history.jsonl").read_bytes()
    summary = search(make_spec(seed=4, trials=30), tmp_path, evaluator)
    assert (tmp_path / "history.jsonl").read_bytes() == before
    assert summary["resumed_trials"] == 30 and summary["trials"] == 30



def test_a_lower_budget_than_the_trials_run_is_refused_and_changes_nothing(tmp_path, evaluator):
    search(make_spec(seed=4, trials=30), tmp_path, evaluator)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    with pytest.raises(RunDirError, match=r"already holds 30 trials, more than budget.trials=10: raise"):
        search(make_spec(seed=4, trials=10), tmp_path, evaluator)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


class CrashingExecutor:
    """Delegates to a LocalExecutor and raises once `limit` candidates were evaluated."""

    def __init__(self, evaluator, limit: int) -> None:
        self.inner = LocalExecutor(evaluator, None)
        self.limit = limit
        self.done = 0

    def evaluate(self, candidates):
        if self.done + len(candidates) > self.limit:
            raise KeyboardInterrupt("simulated kill")
        self.done += len(candidates)
        return self.inner.evaluate(candidates)


@pytest.mark.parametrize("crash_at", [0, 1, 17, 49])
def test_resume_after_crash_in_evaluation(tmp_path, evaluator, reference, crash_at):
    with pytest.raises(KeyboardInterrupt):
        search(make_spec(seed=4, trials=50), tmp_path, evaluator,
               executor=CrashingExecutor(evaluator, crash_at))
    assert len(history(tmp_path)) == crash_at
    assert not (tmp_path / "summary.json").exists()
    summary = search(make_spec(seed=4, trials=50), tmp_path, evaluator)
    assert keys(tmp_path) == reference[50]
    assert summary["resumed_trials"] == crash_at


@pytest.mark.parametrize("strategy", RANDOM_MOVES)
def test_resume_after_crash_with_batches(tmp_path, evaluator, strategy):
    spec = make_spec(strategy, seed=6, trials=30, batch_size=4)
    search(spec, tmp_path / "ref", evaluator)
    run_dir = tmp_path / "crashed"
    with pytest.raises(KeyboardInterrupt):
        search(spec, run_dir, evaluator, executor=CrashingExecutor(evaluator, 17))
    assert len(history(run_dir)) == 16  # whole batches only
    search(spec, run_dir, evaluator)
    assert keys(run_dir) == keys(tmp_path / "ref")


def test_resume_after_crash_between_append_and_state_save(tmp_path, evaluator, reference,
                                                         monkeypatch):
    calls = {"n": 0}
    real = RunDir.save_state

    def flaky_save(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 22:  # the initial state, then one per batch: the 21st batch's
            raise KeyboardInterrupt("killed before state.json was replaced")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RunDir, "save_state", flaky_save)
    with pytest.raises(KeyboardInterrupt):
        search(make_spec(seed=4, trials=50), tmp_path, evaluator)
    monkeypatch.setattr(RunDir, "save_state", real)
    assert len(history(tmp_path)) == 21  # one line more than state.json knows about
    assert json.loads((tmp_path / "state.json").read_text())["history_lines"] == 20
    search(make_spec(seed=4, trials=50), tmp_path, evaluator)
    assert keys(tmp_path) == reference[50]


def test_torn_and_extra_lines_are_cut_on_resume(tmp_path, evaluator, reference):
    search(make_spec(seed=4, trials=20), tmp_path, evaluator)
    path = tmp_path / "history.jsonl"
    bogus = dict(reference["hist50"][20], key="0000000000000000", trial=20)
    with open(path, "a") as fh:
        fh.write(json.dumps(bogus) + "\n")  # the one batch (of 1) after the saved state
        fh.write('{"trial": 21, "key": "abc')  # torn: no newline
    summary = search(make_spec(seed=4, trials=50), tmp_path, evaluator)
    text = path.read_text()
    assert text.endswith("\n")
    assert "0000000000000000" not in text and '"abc' not in text
    assert keys(tmp_path) == reference[50]
    assert [r["trial"] for r in history(tmp_path)] == list(range(50))
    assert summary["resumed_trials"] == 20


def test_torn_line_on_finished_run_is_repaired(tmp_path, evaluator, reference):
    search(make_spec(seed=4, trials=30), tmp_path, evaluator)
    path = tmp_path / "history.jsonl"
    with open(path, "a") as fh:
        fh.write('{"trial": 30, "ke')
    search(make_spec(seed=4, trials=30), tmp_path, evaluator)
    assert path.read_text().endswith("}\n")
    assert keys(tmp_path) == reference[30]


def test_history_without_state_is_rundir_error(tmp_path, evaluator):
    """A search writes state.json before its first history line, so no crash leaves this."""
    (tmp_path / "history.jsonl").write_text('{"trial": 0, "key": "x"}\n{"trial": 1')
    with pytest.raises(RunDirError, match="state.json is missing"):
        search(make_spec(seed=4, trials=30), tmp_path, evaluator)
    assert (tmp_path / "history.jsonl").read_text() == '{"trial": 0, "key": "x"}\n{"trial": 1'


@pytest.fixture
def finished(tmp_path, evaluator) -> Path:
    search(make_spec(seed=4, trials=10), tmp_path, evaluator)
    return tmp_path


@pytest.mark.parametrize("other, named", [
    (make_spec(seed=5, trials=10), "seed: 4 -> 5"),
    (make_spec("random", seed=4, trials=10), 'strategy.name: "rea" -> "random"'),
    (make_spec(seed=4, trials=10, batch_size=2), "batch_size: 1 -> 2"),
    (make_spec(seed=4, trials=10, population_size=7), "strategy.population_size: unset -> 7"),
    (SearchSpec(Component("nb201", {"channels": 8}), Component("rea"), Component("table"), seed=4, trials=10),
     "space.channels: unset -> 8"),
    (SearchSpec(Component("nb201"), Component("rea"), Component("table", {"metric": "ptq_accuracy"}),
                seed=4, trials=10), 'evaluator.metric: unset -> "ptq_accuracy"'),
], ids=["seed", "strategy", "batch_size", "strategy-param", "space-param", "evaluator-param"])
def test_different_search_in_same_dir_is_refused(finished, evaluator, other, named):
    """The refusal names what differs (the run's identity fields are in its state.json)."""
    before = (finished / "history.jsonl").read_bytes()
    ev = other.build_evaluator(other.build_space())
    with pytest.raises(RunDirError) as info:
        search(other, finished, ev)
    assert str(finished) in str(info.value)
    assert "holds a different search (config differs in " in str(info.value) and named in str(info.value)
    assert (finished / "history.jsonl").read_bytes() == before


def _table_spec(trials: int, seed: int = 4, **params: Any) -> SearchSpec:
    return SearchSpec(Component("nb201"), Component("rea"), Component("table", params), seed=seed, trials=trials)


def test_resume_across_a_setting_that_changes_no_result(tmp_path, caplog):
    """A moved dataset, a raised limit or a slower endpoint does not block resuming: the run goes
    on, says what changed, and records the new settings (so the next resume matches them)."""
    first = _table_spec(10)
    search(first, tmp_path, first.build_evaluator(first.build_space()))
    before = (tmp_path / "history.jsonl").read_text().splitlines()
    more = _table_spec(14, simulated_cost_seconds=0.001)
    with caplog.at_level("INFO", logger="nas.progress"):
        search(more, tmp_path, more.build_evaluator(more.build_space()))
    assert "changed settings that change no result: evaluator.simulated_cost_seconds: unset -> 0.001" \
        in caplog.text
    after = (tmp_path / "history.jsonl").read_text().splitlines()
    assert after[:len(before)] == before and len(after) == 14
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["identity"] == more.identity()


def test_a_result_changing_setting_is_refused_even_beside_a_neutral_one(finished):
    other = _table_spec(10, seed=5, simulated_cost_seconds=0.001)
    with pytest.raises(RunDirError) as info:
        search(other, finished, other.build_evaluator(other.build_space()))
    assert "config differs in seed: 4 -> 5);" in str(info.value)


def test_identity_ignores_trials_only():
    assert make_spec(trials=10).identity() == make_spec(trials=500).identity()
    assert make_spec(seed=1).identity() != make_spec(seed=2).identity()
    assert len(make_spec().identity()) == 16


def test_sandbox_tmp_mb_at_its_default_leaves_identities_made_before_it(monkeypatch):
    """The default lives in `Limits.tmp_mb` alone: the identity leaves out whatever it is."""
    from nas.sandbox.limits import Limits

    limits = {"wall_s": 600, "memory_mb": 8192}

    def spec(sandbox):
        return SearchSpec(Component("nb201"), Component("rea"), Component("table", {"sandbox": sandbox}))
    assert spec({**limits, "tmp_mb": 1024}).identity() == spec(limits).identity() == "56df082be12b036d"  # as before
    assert spec({**limits, "tmp_mb": 2048}).identity() != spec(limits).identity()
    monkeypatch.setattr(Limits, "tmp_mb", 2048)  # no second copy of the default to forget
    assert spec({**limits, "tmp_mb": 2048}).identity() == spec(limits).identity()


@pytest.mark.parametrize("content", ["{not json", "", "\x00\x01"])
def test_corrupt_state_json_names_the_path(finished, evaluator, content):
    state = finished / "state.json"
    state.write_text(content)
    with pytest.raises(RunDirError) as info:
        search(make_spec(seed=4, trials=10), finished, evaluator)
    assert str(state) in str(info.value)
    assert "corrupt JSON" in str(info.value)


@pytest.mark.parametrize("content", ["[]", '{"version": 99}', "null", '"x"'])
def test_unknown_state_format_names_the_path(finished, evaluator, content):
    state = finished / "state.json"
    state.write_text(content)
    with pytest.raises(RunDirError, match="unknown state format") as info:
        search(make_spec(seed=4, trials=10), finished, evaluator)
    assert str(state) in str(info.value)


def test_garbage_strategy_state_is_rundir_error(finished, evaluator):
    path = finished / "state.json"
    state = json.loads(path.read_text())
    state["strategy"] = {"rng": "garbage"}
    path.write_text(json.dumps(state))
    with pytest.raises(RunDirError, match="strategy 'rea' state"):
        search(make_spec(seed=4, trials=10), finished, evaluator)


def test_state_without_strategy_is_rundir_error(finished, evaluator):
    path = finished / "state.json"
    state = json.loads(path.read_text())
    del state["strategy"]
    path.write_text(json.dumps(state))
    with pytest.raises(RunDirError):
        search(make_spec(seed=4, trials=10), finished, evaluator)


def test_history_shorter_than_state_is_rundir_error(finished, evaluator):
    path = finished / "history.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:5]))
    with pytest.raises(RunDirError, match="has 5 lines but state.json records 10") as info:
        search(make_spec(seed=4, trials=20), finished, evaluator)
    assert str(path) in str(info.value)


def test_corrupt_history_middle_line_is_rundir_error(finished, evaluator):
    path = finished / "history.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = "{broken\n"
    path.write_text("".join(lines))
    with pytest.raises(RunDirError) as info:
        search(make_spec(seed=4, trials=20), finished, evaluator)
    assert f"{path}:4:" in str(info.value)


# --- SearchSpec validation -----------------------------------------------------------

@pytest.mark.parametrize("field, value, message", [
    ("trials", 0, "budget.trials must be > 0, got 0"),
    ("trials", -5, "budget.trials must be > 0, got -5"),
    ("batch_size", 0, "budget.batch_size must be > 0, got 0"),
    ("batch_size", -1, "budget.batch_size must be > 0, got -1"),
    ("trials", "10", "budget.trials must be an integer, got '10'"),
    ("trials", 2.5, "budget.trials must be an integer, got 2.5"),
    ("trials", True, "budget.trials must be an integer, got True"),
    ("batch_size", None, "budget.batch_size must be an integer, got None"),
    ("seed", "0", "seed must be an integer, got '0'"),
    ("seed", 1.0, "seed must be an integer, got 1.0"),
])
def test_spec_rejects_bad_budget(field, value, message):
    kwargs = {"seed": 0, "trials": 10, "batch_size": 1, field: value}
    with pytest.raises(ConfigError) as info:
        SearchSpec(Component("nb201"), Component("rea"), Component("table"), **kwargs)
    assert str(info.value) == message


def test_spec_from_config_and_dict_round_trip():
    cfg = {"space": {"name": "nb201", "channels": 16}, "strategy": "random",
           "evaluator": {"name": "table", "metric": "baseline_accuracy"}, "seed": 3,
           "budget": {"trials": 12, "batch_size": 2}}
    spec = SearchSpec.from_config(cfg)
    assert spec.space == Component("nb201", {"channels": 16})
    assert spec.strategy == Component("random")
    assert (spec.seed, spec.trials, spec.batch_size) == (3, 12, 2)
    assert SearchSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    defaults = SearchSpec.from_config({"space": "nb201", "strategy": "rea", "evaluator": "table"})
    assert (defaults.seed, defaults.trials, defaults.batch_size) == (0, 100, 1)


@pytest.mark.parametrize("cfg", [
    {"space": None, "strategy": "rea", "evaluator": "table"},
    {"space": {"channels": 8}, "strategy": "rea", "evaluator": "table"},
    {"space": "nb201", "strategy": 5, "evaluator": "table"},
])
def test_spec_from_config_needs_names(cfg):
    with pytest.raises(ConfigError, match="needs a 'name' entry"):
        SearchSpec.from_config(cfg)


def test_spec_from_config_validates_budget():
    with pytest.raises(ConfigError, match="budget.trials must be > 0"):
        SearchSpec.from_config({"space": "nb201", "strategy": "rea", "evaluator": "table",
                                "budget": {"trials": 0}})


@pytest.mark.parametrize("group, registry", [("space", SPACES), ("strategy", STRATEGIES)])
def test_unknown_component_names_list_valid(tmp_path, evaluator, group, registry):
    parts = {"space": Component("nb201"), "strategy": Component("rea"), "evaluator": Component("table")}
    parts[group] = Component("nope")
    spec = SearchSpec(**parts, trials=5)
    with pytest.raises(ConfigError) as info:
        SearchLoop(spec, tmp_path, LocalExecutor(evaluator, None), progress=False)
    msg = str(info.value)
    assert f"unknown {group} 'nope'" in msg
    assert "valid: " + ", ".join(registry.names()) in msg


def test_unknown_evaluator_lists_valid():
    from nas.evaluators import EVALUATORS

    spec = SearchSpec(Component("nb201"), Component("rea"), Component("oracle"), trials=5)
    with pytest.raises(ConfigError) as info:
        spec.build_evaluator(spec.build_space())
    assert "unknown evaluator 'oracle'" in str(info.value)
    assert "valid: " + ", ".join(EVALUATORS.names()) in str(info.value)


def test_unknown_component_params_are_config_errors():
    spec = make_spec(populaton_size=5)
    with pytest.raises(ConfigError, match="strategy 'rea': unknown parameter 'populaton_size'"):
        spec.build_strategy(spec.build_space())
    spec = SearchSpec(Component("nb201", {"channels": "16"}), Component("rea"), Component("table"))
    with pytest.raises(ConfigError, match="space 'nb201': parameter 'channels' must be int"):
        spec.build_space()


def test_evaluator_space_mismatch(tiny_space):
    class OtherSpace(type(tiny_space)):
        name = "darts"

    spec = make_spec()
    with pytest.raises(ConfigError) as info:
        spec.build_evaluator(OtherSpace())
    assert str(info.value) == "evaluator 'table' does not support space 'darts' (supports: nb201)"
