"""What a search publishes in the Prefect UI (flows/artifacts.py), read back through the
API of a real `prefect server`: the report, the top trials, the progress, and the
flow run's name; the deployment run dirs that take that name; and table cells that the UI's
markdown shows as the text they hold."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import NAS, ROOT
from nas.core.trial import TrialRecord, read_history
from test_serve import _start_server, _stop

SEARCH = ["space=nb201", "strategy=random", "evaluator=table", "budget.trials=4", "runner=prefect"]


@pytest.fixture(scope="module")
def served_search(tmp_path_factory):
    """A real server on a free port, one 4-trial table search against it: (api url, run dir)."""
    tmp = tmp_path_factory.mktemp("artifacts")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env |= {"NASFLOW_HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1"}
    server, api = _start_server(tmp, env, PREFECT_UI_API_URL="{api}")  # the README's way
    try:
        run_dir = tmp / "run"
        out = subprocess.run([*NAS, "search", *SEARCH, f"hydra.run.dir={run_dir}", "progress=false"],
                             env={**env, "PREFECT_API_URL": api}, cwd=ROOT, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        yield api, run_dir
    finally:
        _stop(server)


def _read(api: str):
    """The search's flow runs and, by key, the artifacts of the first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["nas-search"])))
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[runs[0].id]))) if runs else []
    return runs, {a.key: a for a in artifacts}


@pytest.mark.slow
def test_search_publishes_report_top_trials_and_progress(served_search):
    api, run_dir = served_search
    summary = json.loads((run_dir / "summary.json").read_text())
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    runs, artifacts = _read(api)
    assert [r.name for r in runs] == ["random-nb201-s0"]
    assert sorted(artifacts) == ["random-nb201-s0-progress", "random-nb201-s0-report", "random-nb201-s0-top-trials"]

    report = artifacts["random-nb201-s0-report"]
    assert report.type == "markdown"
    assert f"| best accuracy | {summary['best']['accuracy']:.2f} |" in report.data
    assert str(run_dir.resolve() / "best_so_far.png") in report.data and "](best_so_far.png)" not in report.data

    table = artifacts["random-nb201-s0-top-trials"]
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    ranked = sorted(history, key=lambda r: r["accuracy"], reverse=True)
    assert [(r["key"], r["accuracy"], r["cost_seconds"]) for r in rows] == \
        [(r["key"], f"{r['accuracy']:.2f}", f"{r['cost_seconds']:.2f}") for r in ranked]
    assert all(r["params"].endswith(("K", "M")) and r["flops"].endswith(("M", "G")) and r["encoding"] for r in rows)
    assert rows[0]["key"] == summary["best"]["key"] and [r["rank"] for r in rows] == [1, 2, 3, 4]

    progress = artifacts["random-nb201-s0-progress"]
    assert progress.type == "progress" and float(progress.data) == 100.0
    assert "4/4 trials" in progress.description


@pytest.mark.slow
def test_progress_follows_each_batch(served_search):
    """`on_batch` is what the loop calls after each saved batch: the bar shows the share of the budget done."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.artifacts import SearchArtifacts

    api, run_dir = served_search
    history = read_history(run_dir / "history.jsonl")

    @flow(name="check-batches", persist_result=False)
    def two_of_eight() -> None:
        artifacts = SearchArtifacts("check-batches", trials=8)
        artifacts.start()
        artifacts.on_batch(history[:2])

    with temporary_settings(updates={PREFECT_API_URL: api}):
        two_of_eight()
        with get_client(sync_client=True) as client:
            after_two = client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["check-batches-progress"])))
    assert len(after_two) == 1 and float(after_two[0].data) == 25.0
    best = max(r.accuracy for r in history[:2])
    assert after_two[0].description == f"check-batches: 2/8 trials, best {best:.2f}%"


@pytest.mark.slow
def test_serve_warns_when_the_ui_calls_another_api(served_search):
    from flows.prefect_server import ui_warning

    api, _ = served_search
    assert ui_warning(api) is None  # the server was started with PREFECT_UI_API_URL=api
    elsewhere = api.replace("127.0.0.1", "localhost")
    assert ui_warning(elsewhere) == (f"nas serve: warning: the server's UI calls the API at {api}, not {elsewhere}; "
                                     f"restart it with PREFECT_UI_API_URL={elsewhere} prefect server start ...")


def test_progress_is_updated_at_most_once_a_second(monkeypatch):
    """A table search saves a batch every few milliseconds: one API call per batch was ~8 s of a
    100-trial run. The first batch always shows; later ones once `PROGRESS_EVERY_S` has passed."""
    import flows.artifacts as artifacts

    sent: list[tuple[float, str]] = []
    monkeypatch.setattr(artifacts, "update_progress_artifact",
                        lambda _id, value, description: sent.append((value, description)))
    now = [100.0]
    search = artifacts.SearchArtifacts("quick", trials=4, progress_id="p", clock=lambda: now[0])
    history = [TrialRecord(trial=i, key=str(i), encoding=[i], accuracy=90.0 + i) for i in range(4)]
    search.on_batch(history[:1])
    now[0] += 0.5
    search.on_batch(history[:2])  # half a second later: not sent
    now[0] += 0.5
    search.on_batch(history[:3])  # a second after the last one sent
    assert sent == [(25.0, "quick: 1/4 trials, best 90.00%"), (75.0, "quick: 3/4 trials, best 92.00%")]


def test_deployment_run_dirs_are_named_and_never_shared(tmp_path):
    from flows.entry import new_run_dir

    first, second = new_run_dir(tmp_path / "runs", "rea-nb201-s0"), new_run_dir(tmp_path / "runs", "rea-nb201-s0")
    (first / "summary.json").write_text("{}")
    third = new_run_dir(tmp_path / "runs", "rea-nb201-s0")
    assert [p.name for p in (first, second, third)] == ["rea-nb201-s0", "rea-nb201-s0-2", "rea-nb201-s0-3"]
    assert (first / "summary.json").read_text() == "{}" and not any(second.iterdir())


def test_artifact_keys_are_valid():
    from flows.artifacts import artifact_key

    assert artifact_key("evolution-ofa_mbv3-s3", "top-trials") == "evolution-ofa-mbv3-s3-top-trials"
    assert artifact_key("REA-NB201-s0", "report") == "rea-nb201-s0-report"


DEPLOYMENT_RUN = r"""
import json, sys
from tasks.env import configure_prefect_env
configure_prefect_env()  # what an entry point does before Prefect is imported (importing flows sets nothing)
from flows.entry import search_overrides_flow
state = search_overrides_flow(overrides=json.loads(sys.argv[1]), root=sys.argv[2], return_state=True)
print(json.dumps({"flow_run_id": str(state.state_details.flow_run_id), "ok": state.is_completed()}))
"""


@pytest.mark.slow
def test_a_deployment_run_holds_its_artifacts_and_has_one_name(served_search, tmp_path):
    """A deployment's run (`nas-search-overrides`) is the search: no nested `nas-search` run of the
    same name (the runs list showed each search twice, the parent with 0 task runs). The run the user
    lands on holds the evaluations' task runs, the report, top trials and progress, and has the
    search's name from its start (the flow's `flow_run_name`), not a random one renamed later."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas import filters
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api, _ = served_search
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env |= {"NASFLOW_HOME": str(tmp_path / "home"), "PREFECT_API_URL": api}
    overrides = [*SEARCH, "seed=3"]
    out = subprocess.run([sys.executable, "-c", DEPLOYMENT_RUN, json.dumps(overrides), str(tmp_path / "runs")],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"]
    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        top = client.read_flow_run(result["flow_run_id"])
        artifacts = client.read_artifacts(
            artifact_filter=filters.ArtifactFilter(flow_run_id=filters.ArtifactFilterFlowRunId(any_=[top.id])))
        named = client.read_flow_runs(flow_run_filter=filters.FlowRunFilter(
            name=filters.FlowRunFilterName(any_=["random-nb201-s3"])))
        tasks = client.read_task_runs(flow_run_filter=filters.FlowRunFilter(id=filters.FlowRunFilterId(any_=[top.id])))
    assert top.name == "random-nb201-s3" and top.parent_task_run_id is None
    assert [r.id for r in named] == [top.id]  # one run of that name in the runs list
    assert sorted(t.name for t in tasks if t.name.startswith("evaluate-")) == \
        sorted(f"evaluate-{json.loads(line)['key']}" for line in
               (tmp_path / "runs" / "random-nb201-s3" / "history.jsonl").read_text().splitlines())
    by_key = {a.key: a for a in artifacts}
    assert sorted(by_key) == ["random-nb201-s3-progress", "random-nb201-s3-report", "random-nb201-s3-top-trials"]
    assert float(by_key["random-nb201-s3-progress"].data) == 100.0
    assert str((tmp_path / "runs" / "random-nb201-s3").resolve()) in by_key["random-nb201-s3-report"].data


def _record(trial: int, accuracy: float, params: float, flops: float) -> TrialRecord:
    return TrialRecord(trial=trial, key=f"k{trial}", encoding=[0, 1, trial], accuracy=accuracy, params=params,
                       flops=flops, cost_seconds=0.123456, metrics={"latency_ms": 1.23456})


def test_top_trials_are_formatted_as_read():
    from flows.artifacts import top_trials

    rows = top_trials([_record(1, 92.99680000000002, 1_234_567, 2_500_000_000), _record(2, 93.1, 73_306, 950),
                       TrialRecord(trial=3, key="bad", encoding=[9], accuracy=None, error="boom")], trust=False)
    assert rows == [
        {"rank": 1, "trial": 2, "accuracy": "93.10", "params": "73.31K", "flops": "950", "encoding": "`[0,1,2]`",
         "key": "k2", "cost_seconds": "0.12", "cached": False, "latency_ms": "1.235"},
        {"rank": 2, "trial": 1, "accuracy": "93.00", "params": "1.23M", "flops": "2.50G", "encoding": "`[0,1,1]`",
         "key": "k1", "cost_seconds": "0.12", "cached": False, "latency_ms": "1.235"}]


def test_counts_read_in_k_m_g_and_long_encodings_are_cut():
    from flows.artifacts import ENCODING_CHARS, encoding_text, si

    assert [si(v) for v in (None, 0, 999, 1000, 1_500_000, 7_877_248, 3.2e9, 4e12)] == \
        [None, "0", "999", "1.00K", "1.50M", "7.88M", "3.20G", "4.00T"]
    assert encoding_text("|nor_conv_3x3~0|+|none~0|") == "`|nor_conv_3x3~0|+|none~0|`"  # a code span
    cut = encoding_text(list(range(200)))
    assert len(cut) == ENCODING_CHARS + 2 and cut.endswith("…`")


# Text from a model, a file or an LLM with each kind of markdown in it: strikethrough (GFM's `~~`, and the
# single `~` of the UI's renderer that struck an NB201 cell through), emphasis, code, HTML, a link.
MARKUP = "|conv~0|+|none~0|~~gone~~ *em* _u_ `tick` ``two`` <b>x</b> [l](u)"


def _gfm(text: str) -> str:
    """HTML as a GFM renderer makes it (tables, strikethrough): as the Prefect UI's markdown and GitHub do."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text)


def test_table_artifact_cells_render_as_the_text_they_hold():
    """The UI renders each string cell of a table artifact as markdown (its ArtifactDataTable's
    markdown renderer): the encodings and a metric's text are code spans, shown as written, by a
    GFM renderer and by Python-Markdown (the docs'); a newline in them shows as `\\x0a`."""
    import markdown

    from flows.artifacts import top_trials
    from nas.terminal import printable

    texts = [MARKUP + "\nsecond line", "`tick` first and last `", " spaced "]
    rows = top_trials([TrialRecord(trial=i, key=f"k{i}", encoding=t, accuracy=90.0 - i, metrics={"note": t})
                       for i, t in enumerate(texts)], trust=False)
    renderers = {"gfm": _gfm, "python-markdown": lambda t: markdown.markdown(t, extensions=["tables"])}
    for row, text in zip(rows, texts):
        for column in ("encoding", "note"):
            for name, render in renderers.items():
                shown = printable(text).strip() if name == "python-markdown" else printable(text)  # it strips code
                assert render(row[column]).strip() == f"<p><code>{html.escape(shown, quote=False)}</code></p>", \
                    (name, column, row[column])


def test_report_table_cells_render_as_the_text_they_hold():
    """report.md (the report artifact) is a markdown table: an encoding, an LLM's idea and a model's
    error are code spans whose pipes are escaped for the table; a GFM renderer shows each as written,
    in its own cell, with no strikethrough, emphasis or markup from it."""
    from nas.design.metrics import design_metrics
    from nas.report import render_markdown

    history = [TrialRecord(0, "k0", MARKUP, 91.0, strategy={"stage": "root", "valid": True}),
               TrialRecord(1, "k1", "x", None, error=f"crash: {MARKUP}",
                           strategy={"stage": "init", "parent": 0, "valid": False, "idea": MARKUP})]
    summary = {"strategy": "nader", "space": "nader", "evaluator": "train", "seed": 0, "trials": 2, "failed": 1,
               "cache_hits": 0, "wall_seconds": 1.0, "design": design_metrics(history),
               "best": {"trial": 0, "accuracy": 91.0, "encoding": MARKUP, "key": "k0"}}
    page = _gfm(render_markdown(history, summary))
    assert not re.search(r"<(s|del|em|strong|b|a)\b", page)
    codes = [html.unescape(c) for c in re.findall(r"<td><code>(.*?)</code></td>", page)]
    assert codes == [MARKUP, MARKUP, MARKUP, f"crash: {MARKUP}"]  # best encoding, top-1 row, idea, error
    design_row = next(r for r in re.findall(r"<tr>(.*?)</tr>", page, re.S) if "crash: " in r)
    assert design_row.count("<td>") == 7  # the pipes in it split no cell


@pytest.mark.parametrize("overrides", [["budget.trialz=3"], ["nosuch=3"], ["strategy=nosuch"],
                                       ["space=nb201", "strategy=rea", "strategy.population_sizze=3"]])
def test_deployment_runs_refuse_unknown_keys_as_the_cli_does(overrides, tmp_path, capsys):
    from flows.entry import search_overrides_flow
    from nas.cli.main import main
    from nas.errors import NasError

    with pytest.raises(SystemExit) as stopped:
        main(["search", *overrides])
    assert stopped.value.code == 2
    cli = capsys.readouterr().err.strip().removeprefix("nas: error: ")
    with pytest.raises(NasError) as refused:
        search_overrides_flow.fn(overrides=overrides, root=str(tmp_path / "runs"))
    assert str(refused.value) == cli
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
