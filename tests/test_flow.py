"""The Prefect search flow in-process: transient evaluator crashes are retried,
persistent ones become failure records (never cached), and the search ends."""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter

import pytest

from nas.core.trial import EvalResult
from nas.evaluators import EVALUATORS, Evaluator
from nas.search.spec import Component, SearchSpec
from nas.spaces.nb201.space import NB201Space

pytestmark = pytest.mark.slow

ATTEMPTS: Counter[str] = Counter()


class FlakyEvaluator(Evaluator):
    """Raises a non-NasError for the first `crash_times` attempts at each cell."""

    @classmethod
    def accepts(cls, space) -> bool:
        return space is NB201Space

    def __init__(self, space, crash_times: int = 1) -> None:
        super().__init__(space)
        self.crash_times = crash_times

    def fingerprint(self) -> str:
        return f"flaky-{self.crash_times}"

    def evaluate(self, arch, seed=None) -> EvalResult:
        ATTEMPTS[arch.key()] += 1
        if ATTEMPTS[arch.key()] <= self.crash_times:
            raise RuntimeError("transient failure")
        return EvalResult(accuracy=float(sum(len(op) for op in arch.ops)))


@pytest.fixture(scope="module")
def run_flow(tmp_path_factory):
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("PREFECT_")]:
        del os.environ[key]
    os.environ["NASFLOW_HOME"] = str(tmp_path_factory.mktemp("home"))
    from tasks.env import configure_prefect_env

    configure_prefect_env()
    EVALUATORS.register("flaky_test")(FlakyEvaluator)
    from flows.search import run_search_flow

    yield run_search_flow
    EVALUATORS._entries.pop("flaky_test")
    os.environ.clear()
    os.environ.update(saved)


def spec(crash_times: int, seed: int) -> SearchSpec:
    return SearchSpec(space=Component("nb201"), strategy=Component("random"),
                      evaluator=Component("flaky_test", {"crash_times": crash_times}),
                      seed=seed, trials=6, batch_size=3)


def test_transient_crash_is_retried(run_flow, tmp_path):
    ATTEMPTS.clear()
    summary = run_flow(spec(1, seed=0), tmp_path / "run", workers=3, retries=1, progress=False)
    assert summary["trials"] == 6 and summary["failed"] == 0
    assert sorted(ATTEMPTS.values()) == [2] * 6  # one crash + one successful retry each


def test_persistent_crash_is_recorded_not_cached(run_flow, tmp_path):
    ATTEMPTS.clear()
    summary = run_flow(spec(10, seed=1), tmp_path / "a", workers=3, retries=1, progress=False)
    assert summary["trials"] == 6 and summary["failed"] == 6 and summary["best"] is None
    history = [json.loads(l) for l in (tmp_path / "a" / "history.jsonl").read_text().splitlines()]
    assert all(r["error"] == "evaluator crashed: RuntimeError: transient failure" for r in history)
    assert sorted(ATTEMPTS.values()) == [2] * 6
    # A crash is not a result: the same search again evaluates again.
    summary = run_flow(spec(10, seed=1), tmp_path / "b", workers=3, retries=1, progress=False)
    assert summary["cache_hits"] == 0 and sorted(ATTEMPTS.values()) == [4] * 6


def test_llm_calls_are_cached_prefect_tasks(run_flow, tmp_path):
    """Under the flow, each LLM call is a task cached by its call key: a second
    flow answers from Prefect's store; a failed call raises and is never cached."""
    from prefect import flow

    from nas.llm import LLMClient
    from nas.llm.client import LLMError
    from support.scripted import ScriptedServer, Step
    from tasks.llm import prefect_calls

    @flow(persist_result=False)
    def ask(base_url: str, text: str) -> tuple[str, str]:
        reply_cache = tmp_path / uuid.uuid4().hex   # empty each time: only Prefect's store can answer
        client = LLMClient({"backend": "openai", "base_url": base_url, "model": "scripted",
                            "cache_dir": str(reply_cache), "api_key_env": "NASFLOW_NO_KEY", "max_retries": 0},
                           tmp_path, calls=prefect_calls)
        reply = client.complete("mutator", text)
        return reply.text, reply.source

    with ScriptedServer([Step("first reply")], default="later reply") as srv:
        assert ask(srv.base_url, "design a block") == ("first reply", "live")
        assert ask(srv.base_url, "design a block") == ("first reply", "cache")
        assert len(srv.requests) == 1
    with ScriptedServer([Step(fault="500")], default="?") as srv:
        with pytest.raises(LLMError):
            ask(srv.base_url, "a failing call")
    with ScriptedServer([Step("answered now")]) as srv:
        assert ask(srv.base_url, "a failing call") == ("answered now", "live")


def test_llm_cache_false_asks_the_model_on_every_run(run_flow, tmp_path):
    """`llm.cache=false` under the flow: a repeated search asks the model again, and leaves
    nothing in Prefect's store for a cached search to find; with the cache on, a repeat asks nothing."""
    from support.scripted import ScriptedServer
    from test_fault_tolerance import script

    def search(run: str, **cache) -> int:
        llm = {"backend": "openai", "base_url": srv.base_url, "model": "scripted", "api_key_env": "NASFLOW_NO_KEY",
               "structured": "none", "max_retries": 0, **cache}
        spec = SearchSpec(space=Component("nb201"), evaluator=Component("table"), seed=0, trials=4, batch_size=2,
                          strategy=Component("collm", {"llm": llm, "candidates_per_iteration": 2}))
        before = len(srv.requests)
        assert run_flow(spec, tmp_path / run, workers=2, retries=1, progress=False)["trials"] == 4
        return len(srv.requests) - before

    with ScriptedServer(script) as srv:
        asked = search("a", cache=False)
        assert asked == 4   # 2 iterations: a Navigator and a Generator call each
        assert search("b", cache=False) == asked
        assert search("c", cache_dir=str(tmp_path / "reply-cache")) == asked
        assert search("d", cache_dir=str(tmp_path / "reply-cache")) == 0


def test_a_search_started_inside_a_flow_run_is_that_run(run_flow, tmp_path):
    """A deployment's run (`nas-search-overrides`) starts the search from inside its own flow run: the
    search runs as that run, not as a nested `nas-search` run of the same name (the runs list showed
    each search twice, the parent with no task runs). Its task runs (on the search's task runner, not
    the outer flow's), retries, cache and artifacts are those of a search run of its own."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas import filters
    from prefect.runtime import flow_run
    from prefect.task_runners import ThreadPoolTaskRunner

    class NotThisRunner(ThreadPoolTaskRunner):
        def submit(self, *args, **kwargs):
            raise AssertionError("the outer flow's task runner got the search's evaluations")

    @flow(name="outer-run", persist_result=False, task_runner=NotThisRunner())
    def outer(run: str) -> tuple[dict, str]:
        summary = run_flow(spec(1, seed=5), tmp_path / run, workers=3, retries=1, progress=False)
        return summary, str(flow_run.get_id())

    ATTEMPTS.clear()
    first, first_id = outer("a")
    assert first["trials"] == 6 and first["failed"] == 0
    assert sorted(ATTEMPTS.values()) == [2] * 6  # each crashed once and was retried
    again, again_id = outer("b")
    assert again["cache_hits"] == 6 and sorted(ATTEMPTS.values()) == [2] * 6  # from the cache: none evaluated again
    with get_client(sync_client=True) as client:
        nested = client.read_flow_runs(flow_filter=filters.FlowFilter(name=filters.FlowFilterName(any_=["nas-search"])),
                                       flow_run_filter=filters.FlowRunFilter(
                                           name=filters.FlowRunFilterName(any_=["random-nb201-s5"])))
        tasks = client.read_task_runs(flow_run_filter=filters.FlowRunFilter(id=filters.FlowRunFilterId(any_=[first_id])))
        keys = {a.key for a in client.read_artifacts(artifact_filter=filters.ArtifactFilter(
            flow_run_id=filters.ArtifactFilterFlowRunId(any_=[first_id])))}
    assert nested == []
    history = [json.loads(line) for line in (tmp_path / "a" / "history.jsonl").read_text().splitlines()]
    assert sorted(t.name for t in tasks) == sorted(f"evaluate-{r['key']}" for r in history)
    assert keys == {"random-nb201-s5-progress", "random-nb201-s5-report", "random-nb201-s5-top-trials"}
