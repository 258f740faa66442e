"""Screening between strategy and evaluator (nas/search/screen.py): the records it
leaves, which candidates it keeps, resume, LLM strategies, compare, and bad config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nas.compare import compare
from nas.core.trial import best_so_far, read_history
from nas.errors import ConfigError
from nas.evaluators.table import TableEvaluator
from nas.export import ExportError
from nas.export.selection import load_trial
from nas.report import render_markdown
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.screen import ScreenSettings
from nas.search.spec import Component, SearchSpec
from nas.spaces.nb201.space import NB201Space

# A small, quick predictor: the tests are about the records, not its accuracy.
FAST = {"members": 2, "epochs": 40, "hidden": 16}


@pytest.fixture(scope="module")
def evaluator() -> TableEvaluator:
    return TableEvaluator(NB201Space())


def spec_of(strategy: str = "rea", trials: int = 16, batch_size: int = 2, factor: int = 3,
            min_history: int = 4, seed: int = 0, **params: Any) -> SearchSpec:
    return SearchSpec(space=Component("nb201"), strategy=Component(strategy, params), evaluator=Component("table"),
                      seed=seed, trials=trials, batch_size=batch_size,
                      screen=ScreenSettings(factor=factor, min_history=min_history, params=FAST))


def search(spec: SearchSpec, run_dir: Path, evaluator) -> dict[str, Any]:
    return SearchLoop(spec, run_dir, LocalExecutor(evaluator, None), progress=False).run_search()


def lines(run_dir: Path) -> list[dict[str, Any]]:
    """history.jsonl without the timings, which differ between runs."""
    out = []
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec.pop("wall_seconds"), rec.pop("cost_seconds")
        out.append(rec)
    return out


def test_screened_records_are_scored_not_trials_and_not_failures(tmp_path, evaluator):
    summary = search(spec_of(), tmp_path, evaluator)
    history = read_history(tmp_path / "history.jsonl")
    screened = [r for r in history if r.screened]
    kept = [r for r in history if not r.screened]
    # 2 unscreened batches of 2 (min_history 4), then 6 batches of 2 kept out of 6 asked
    assert len(kept) == 16 and len(screened) == 6 * 4 and len(history) == 40
    assert summary["trials"] == 16 and summary["failed"] == 0 and summary["screened"] == 24
    assert all(r.accuracy is None and r.error is None and r.score is not None and not r.metrics for r in screened)
    assert [r.score is None for r in kept] == [True] * 4 + [False] * 12  # screening starts after 4 successes
    assert len(best_so_far(history)) == 16  # the curve counts evaluated trials only
    assert len({r.key for r in history}) == len(history)  # told to REA: never asked again
    raw = (tmp_path / "history.jsonl").read_text().splitlines()
    assert '"screened": true' not in raw[0] and "score" not in json.loads(raw[0])  # unscreened lines as before
    report = render_markdown(history, summary)
    assert "| screened out | 24 (asked, scored, not evaluated) |" in report


def test_each_batch_keeps_its_top_share_by_score(tmp_path, evaluator):
    search(spec_of(), tmp_path, evaluator)
    history = read_history(tmp_path / "history.jsonl")[4:]  # after the unscreened start
    for start in range(0, len(history), 6):
        batch = history[start:start + 6]
        kept = sorted(r.score for r in batch if not r.screened)
        dropped = [r.score for r in batch if r.screened]
        assert len(kept) == 2 and len(dropped) == 4
        assert min(kept) >= max(dropped)  # type: ignore[type-var]


def test_unscreened_records_and_identity_are_unchanged_by_the_screen_key(evaluator):
    plain = SearchSpec(space=Component("nb201"), strategy=Component("rea"), evaluator=Component("table"))
    off = SearchSpec(space=Component("nb201"), strategy=Component("rea"), evaluator=Component("table"),
                     screen=ScreenSettings(factor=1, scorer="other", min_history=3))
    on = spec_of(batch_size=1)
    assert plain.identity() == off.identity() != on.identity()
    assert SearchSpec.from_dict(on.to_dict()) == on
    assert SearchSpec.from_dict({k: v for k, v in plain.to_dict().items() if k != "screen"}) == plain


def test_resume_continues_identically_after_a_stop_and_after_a_torn_batch(tmp_path, evaluator):
    full, stopped, crashed = tmp_path / "full", tmp_path / "stopped", tmp_path / "crashed"
    search(spec_of(trials=16), full, evaluator)
    search(spec_of(trials=8), stopped, evaluator)
    search(spec_of(trials=16), stopped, evaluator)  # resumed: screened records restored with the rest
    assert lines(stopped) == lines(full)

    search(spec_of(trials=8), crashed, evaluator)
    saved = (crashed / "state.json").read_bytes()
    search(spec_of(trials=10), crashed, evaluator)  # one more batch: 6 lines, more than batch_size
    (crashed / "state.json").write_bytes(saved)  # as if it crashed before saving its state
    summary = search(spec_of(trials=16), crashed, evaluator)
    assert lines(crashed) == lines(full) and summary["screened"] == 24


def test_nas_search_resumes_a_torn_screened_batch(tmp_path, evaluator):
    """`nas search` checks the run dir before its runner starts: one screened batch is
    batch_size x factor lines, not batch_size."""
    from nas.execute import execute

    full, crashed = tmp_path / "full", tmp_path / "crashed"
    search(spec_of(trials=16), full, evaluator)
    search(spec_of(trials=8), crashed, evaluator)
    saved = (crashed / "state.json").read_bytes()
    search(spec_of(trials=10), crashed, evaluator)  # one more batch: 6 lines
    (crashed / "state.json").write_bytes(saved)  # as if it crashed before saving its state
    execute(spec_of(trials=16), crashed, {"name": "local"}, progress=False)
    assert lines(crashed) == lines(full)


def test_works_with_an_llm_strategy_asking_n_times_factor(tmp_path, evaluator, monkeypatch):
    from support.scripted import ScriptedServer
    from test_collm import llm, scripted

    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test-collm")
    with ScriptedServer(scripted) as srv:
        spec = spec_of("collm", trials=10, batch_size=1, factor=2, min_history=5, llm=llm(srv, tmp_path))
        summary = search(spec, tmp_path / "run", evaluator)
    history = read_history(tmp_path / "run" / "history.jsonl")
    assert summary["trials"] == 10 and summary["screened"] == 5 and len(history) == 15
    assert summary["collm"]["accepted"] + summary["collm"]["random_fill"] >= 15  # it was asked for all of them
    assert all(r.strategy.get("origin") in ("llm", "random_fill") for r in history)


def test_a_strategy_short_of_new_candidates_is_asked_for_the_batch_unscreened():
    """Exhausted at n x factor but not at n: the batch is still evaluated (the search ends
    only when not even n can be asked)."""
    from nas.core.trial import Candidate, SearchExhausted, TrialRecord
    from nas.search.screen import Screen

    space, rng = NB201Space(), np.random.default_rng(0)

    class Scarce:
        def __init__(self) -> None:
            self.asked: list[int] = []

        def ask(self, n: int) -> list[Candidate]:
            self.asked.append(n)
            if n > 3:
                raise SearchExhausted("scarce: 3 left")
            return [Candidate(space.sample(rng)) for _ in range(n)]

    cells = [space.sample(rng) for _ in range(6)]
    history = [TrialRecord(trial=i, key=c.key(), encoding=c.encode(), accuracy=90.0 + i) for i, c in enumerate(cells)]
    screen = Screen(ScreenSettings(factor=4, min_history=4, params=FAST), space, seed=0)
    strategy = Scarce()
    picks = screen.ask(strategy, 2, history)  # type: ignore[arg-type]
    assert strategy.asked == [8, 2] and [(p.kept, p.score) for p in picks] == [(True, None)] * 2
    with pytest.raises(SearchExhausted):
        screen.ask(strategy, 5, history)  # type: ignore[arg-type]


def test_compare_puts_screened_and_unscreened_runs_side_by_side(tmp_path, evaluator):
    for seed in (0, 1):
        rea = {"population_size": 4, "sample_size": 2}  # past its random start within 12 trials
        search(spec_of(trials=12, seed=seed, **rea), tmp_path / "runs" / f"screen_s{seed}", evaluator)
        plain = SearchSpec(space=Component("nb201"), strategy=Component("rea", rea), evaluator=Component("table"),
                           seed=seed, trials=12, batch_size=2)
        search(plain, tmp_path / "runs" / f"plain_s{seed}", evaluator)
    report = compare([tmp_path / "runs"], tmp_path / "out", [6, 12], baseline="rea")
    labels = ["rea+screen(x3,predictor) @ nb201/table", "rea @ nb201/table"]
    assert sorted(report["groups"]) == sorted(labels)
    assert report["groups"][labels[0]]["screened"] == 16 and report["groups"][labels[1]]["screened"] == 0
    assert report["tests"][labels[0]]["baseline"] == "rea @ nb201/table"
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "| strategy @ space/evaluator | runs | screened / run | best @ 6 | best @ 12 |" in md
    assert f"| {labels[0]} | 2 | 16 | " in md


def test_export_refuses_a_screened_trial(tmp_path, evaluator):
    search(spec_of(trials=6), tmp_path, evaluator)
    screened = next(r.trial for r in read_history(tmp_path / "history.jsonl") if r.screened)
    with pytest.raises(ExportError, match=f"trial {screened} was screened out"):
        load_trial(tmp_path, screened)
    _, best = load_trial(tmp_path, None)
    assert not best.screened and best.accuracy is not None


@pytest.mark.parametrize("node, message", [
    ({"factor": 0}, r"^screen.factor must be an integer in \[1, 100\], got 0$"),
    ({"factor": 2.5}, r"^screen.factor must be an integer in \[1, 100\], got 2.5$"),
    ({"min_history": -1}, r"^screen.min_history must be an integer >= 0, got -1$"),
    ({"factr": 2}, r"^screen: unknown key 'factr' \(valid: factor, min_history, params, scorer\)$"),
    ({"factor": 2, "scorer": "oracle"}, r"^screen.scorer must be one of .*predictor.*, got 'oracle'$"),
    ({"scorer": "oracle"}, r"^screen.scorer must be one of .*predictor.*, got 'oracle'$"),  # off, still checked
    ("4", r"^screen must be a mapping"),
])
def test_bad_screen_config_is_one_line(node, message):
    with pytest.raises(ConfigError, match=message):
        ScreenSettings.from_config(node)


def test_bad_scorer_params_and_space_are_one_line(tmp_path, evaluator):
    bad = SearchSpec(space=Component("nb201"), strategy=Component("rea"), evaluator=Component("table"),
                     screen=ScreenSettings(factor=2, params={"membrs": 2}))
    with pytest.raises(ConfigError, match=r"^scorer 'predictor': unknown parameter 'membrs'"):
        search(bad, tmp_path / "a", evaluator)
    from nas.search.screen import PredictorScorer
    from nas.spaces import SPACES

    with pytest.raises(ConfigError, match=r"^screen.scorer=predictor needs a categorical space"):
        PredictorScorer(SPACES.create("nader", {}))
    assert not (tmp_path / "a" / "history.jsonl").exists()


def test_screen_keys_are_checked_in_the_composed_config():
    from nas.config import check_job

    assert check_job(["space=nb201", "screen.factor=4"])[0].screen == ScreenSettings(factor=4)
    with pytest.raises(ConfigError, match=r"^unknown key 'screen.factr'"):
        check_job(["space=nb201", "screen.factr=2"])
