"""The flows package's pure pieces case by case (issue 52, the library mutation run): run dirs a
deployment's search takes, GPU placement arithmetic on a scripted cluster, the task runners'
settings, the artifacts' cells and progress, prefect.yaml's checks and overrides, the server mode
and idle settings, the heartbeat interval, the flow's JSON parameters. No Prefect server starts."""

from __future__ import annotations

import json
import os
import socket
import threading
import types
from contextlib import nullcontext
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flows import artifacts as A
from flows import deployments as D
from flows import entry as E
from flows import heartbeat as H
from flows import placement as P
from flows import prefect_server as PS
from flows import search as S
from flows import shared_server as SS
from flows import task_runners as T
from nas.core.trial import TrialRecord
from nas.errors import ConfigError, NasError

# ---------------------------------------------------------------- entry: the run's dir


def test_a_given_dir_not_there_yet_is_made_by_this_run(tmp_path):
    path, made = E.target_dir([str(tmp_path / "a"), str(tmp_path / "b")], tmp_path / "root", "x")
    assert (path, made) == ((tmp_path / "b").resolve(), True)
    assert not (tmp_path / "root").exists()  # no new dir under ROOT when one is given


def test_a_given_dir_already_there_is_never_this_runs(tmp_path):
    (tmp_path / "mine").mkdir()
    assert E.target_dir([str(tmp_path / "mine")], tmp_path / "root", "x") == ((tmp_path / "mine").resolve(), False)


def test_no_dir_given_makes_root_name_then_name_2_then_name_3(tmp_path):
    root = tmp_path / "runs"
    assert E.target_dir([], root, "re-nb201-s0") == (root / "re-nb201-s0", True)
    assert E.new_run_dir(root, "re-nb201-s0") == root / "re-nb201-s0-2"
    assert E.new_run_dir(root, "re-nb201-s0") == root / "re-nb201-s0-3"
    assert sorted(p.name for p in root.iterdir()) == ["re-nb201-s0", "re-nb201-s0-2", "re-nb201-s0-3"]


# ---------------------------------------------------------------- placement


class _Client:
    def __init__(self, workers):
        self.workers = workers

    def scheduler_info(self, n_workers):
        assert n_workers == -1
        return {"workers": {f"w{i}": w for i, w in enumerate(self.workers)}}


class DaskTaskRunner:  # a scripted stand-in of a started cluster, named as prefect_dask's
    def __init__(self, *workers):
        self.client = _Client(list(workers))


class ThreadPoolTaskRunner:
    pass


@pytest.mark.parametrize("dir_name, dirs, new", [
    ("random-nb201-s0", [], None),  # ROOT/NAME: the flow run's name already says it
    ("random-nb201-s0-2", [], "random-nb201-s0-2"),  # NAME was taken: the run says which dir
    ("mine", ["/x/mine"], None),  # a dir the user named: the run keeps its name
    ("random-nb201-s0", ["/x/random-nb201-s0"], None),
])
def test_the_flow_run_is_renamed_only_for_a_dir_made_under_another_name(tmp_path, dir_name, dirs, new):
    from nas.search.spec import Component, SearchSpec

    spec = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"))
    assert S.run_name(spec) == "random-nb201-s0"
    assert E.renamed(tmp_path / dir_name, spec, dirs) == new


@pytest.mark.parametrize("overrides, out, rest", [
    ([], None, []),
    (["out=/a/b", "seed=1"], "/a/b", ["seed=1"]),
    (["out=/a", "space=nb201", "out=/c"], "/c", ["space=nb201"]),  # the last one given
    (["outer=1", "supernet.out=/d"], None, ["outer=1", "supernet.out=/d"]),  # only `out=` itself
    (["out="], "", []),
])
def test_train_supernet_takes_out_apart_from_the_configs_overrides(overrides, out, rest):
    from nas.config import split_override

    outs, others = split_override(overrides, "out")
    assert (outs[-1] if outs else None, others) == (out, rest)


class RayTaskRunner:  # named as prefect_ray's; its cluster is the scripted `ray` module below
    pass


def test_ray_cluster_gpus_are_its_gpu_resources(monkeypatch):
    import sys

    for resources, gpus in (({"GPU": 2.0, "CPU": 8.0}, 2.0), ({"CPU": 8.0}, 0.0), ({"GPU": 1}, 1.0)):
        monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(cluster_resources=lambda r=resources: r))
        assert P.cluster_gpus(RayTaskRunner()) == gpus
        assert type(P.cluster_gpus(RayTaskRunner())) is float


def test_dask_cluster_gpus_are_the_workers_gpu_resources_summed():
    runner = DaskTaskRunner({"resources": {"GPU": 0.5}}, {"resources": {"GPU": 1}}, {"resources": {}}, {})
    assert P.cluster_gpus(runner) == 1.5
    assert type(P.cluster_gpus(runner)) is float
    assert P.cluster_gpus(DaskTaskRunner({})) == 0.0
    assert P.cluster_gpus(ThreadPoolTaskRunner()) == 0.0


@pytest.mark.parametrize("gpus, runner, share, retries", [
    ({"GPU": 2}, {}, 1.0, 2),
    ({"GPU": 2}, {"per_gpu": 4, "max_retries": 0}, 0.25, 0),
    ({"GPU": 0.5}, {"per_gpu": 2, "max_retries": 5}, 0.5, 5),
    ({}, {"per_gpu": 4}, None, 2),  # no GPUs: ask for none
])
def test_dask_placement_asks_one_share_of_a_gpu_only_where_there_are_gpus(gpus, runner, share, retries):
    assert P.placement_for(runner, DaskTaskRunner({"resources": gpus})) == P.Placement("dask", share, retries)


def test_threads_have_nothing_to_place():
    assert P.placement_for({"per_gpu": 0}, ThreadPoolTaskRunner()) is nullcontext  # not even checked


def test_placement_context_per_engine():
    assert isinstance(P.Placement("", 1.0, 2)(), nullcontext)
    assert isinstance(P.Placement("dask", None, 2)(), nullcontext)
    with P.Placement("dask", 0.25, 2)():
        import dask
        assert dask.get_annotations() == {"resources": {"GPU": 0.25}}
    from prefect_ray.context import RemoteOptionsContext
    with P.Placement("ray", 0.5, 3)():
        assert RemoteOptionsContext.get().current_remote_options == {"max_retries": 3, "num_gpus": 0.5}
    with P.Placement("ray", None, 0)():
        assert RemoteOptionsContext.get().current_remote_options == {"max_retries": 0}


def test_open_executor_outside_a_flow_run_says_so():
    with pytest.raises(RuntimeError, match="^open_executor: call it inside a flow run"):
        P.open_executor({}, None, None, 1)  # type: ignore[arg-type]


# ---------------------------------------------------------------- task runners' settings


@pytest.mark.parametrize("value, ok", [(1, True), (2, True), (0, False), (-1, False), (True, False),
                                       (1.0, False), ("2", False)])
def test_positive_setting_at_and_either_side_of_one(value, ok):
    if ok:
        assert T.positive_setting({"workers": value}, "workers", 4) == value
    else:
        with pytest.raises(ConfigError) as err:
            T.positive_setting({"workers": value}, "workers", 4)
        assert str(err.value) == f"runner.workers: expected a positive integer, got {value!r}"


@pytest.mark.parametrize("value, ok", [(0, True), (1, True), (-1, False), (False, False), (0.0, False)])
def test_count_setting_at_and_either_side_of_zero(value, ok):
    if ok:
        assert T.count_setting({"max_retries": value}, "max_retries", 2) == value
    else:
        with pytest.raises(ConfigError) as err:
            T.count_setting({"max_retries": value}, "max_retries", 2)
        assert str(err.value) == f"runner.max_retries: expected a non-negative integer, got {value!r}"


def test_settings_default_when_absent():
    assert T.positive_setting({}, "workers", 4) == 4
    assert T.count_setting({}, "max_retries", 2) == 2


def test_thread_and_process_pools_take_their_workers():
    threads = T.build_task_runner({})
    assert type(threads).__name__ == "ThreadPoolTaskRunner" and threads._max_workers == 4
    assert T.build_task_runner({"name": "prefect", "workers": 3})._max_workers == 3
    pool = T.build_task_runner({"name": "processes"})
    assert type(pool) is T.InterruptibleProcessPool and pool._max_workers == 2
    assert T.build_task_runner({"name": "processes", "workers": 5})._max_workers == 5


def test_unknown_runner_is_one_line():
    with pytest.raises(ConfigError) as err:
        T.build_task_runner({"name": "slurm"})
    assert str(err.value) == "unknown runner 'slurm' (valid: local, prefect, processes, dask, ray)"


def test_dask_runner_built_per_case_without_starting_a_cluster():
    local = T.build_task_runner({"name": "dask", "n_workers": 3}, gpus=[])
    assert local.cluster_class is T.local_cluster
    assert local.cluster_kwargs == {"n_workers": 3, "threads_per_worker": 1, "processes": True,
                                    "dashboard_address": None, "max_retries": 2}
    slots = T.build_task_runner({"name": "dask", "per_gpu": 2, "max_retries": 1}, gpus=["0"])
    assert slots.cluster_class is T.slot_cluster
    assert slots.cluster_kwargs == {"slots": [("0", 0.5), ("0", 0.5)], "max_retries": 1, "dashboard_address": None}
    whole = T.build_task_runner({"name": "dask"}, gpus=["0", "1"])
    assert whole.cluster_kwargs["slots"] == [("0", 1.0), ("1", 1.0)] and whole.cluster_kwargs["max_retries"] == 2
    remote = T.build_task_runner({"name": "dask", "address": "tcp://h:8786"}, gpus=["0"])
    assert remote.address == "tcp://h:8786"
    with pytest.raises(ConfigError, match=r"^runner.max_retries: "):
        T.build_task_runner({"name": "dask", "max_retries": -1}, gpus=[])


def test_ray_runner_built_per_case_without_starting_ray():
    local = T.build_task_runner({"name": "ray"}, gpus=["0", "1"])
    assert local.init_kwargs == {"include_dashboard": False, "num_gpus": 2, "object_store_memory": 128 * 2**20,
                                 "namespace": "prefect"}
    cpus = T.build_task_runner({"name": "ray", "num_cpus": 3, "object_store_mb": 64}, gpus=[])
    assert cpus.init_kwargs == {"include_dashboard": False, "num_gpus": 0, "object_store_memory": 64 * 2**20,
                                "num_cpus": 3, "namespace": "prefect"}
    assert T.build_task_runner({"name": "ray", "address": "ray://h:10001"}, gpus=[]).address == "ray://h:10001"
    for bad in ({"max_retries": -1}, {"per_gpu": 0}, {"num_cpus": 0}):
        with pytest.raises(ConfigError):
            T.build_task_runner({"name": "ray", **bad}, gpus=[])


# ---------------------------------------------------------------- artifacts


@pytest.mark.parametrize("value, text", [
    (None, None), (0, "0"), (999, "999"), (999.5, "999.5"), (1000, "1.00K"), (1234567, "1.23M"),
    (999999, "1000.00K"), (1e9, "1.00G"), (2.5e12, "2.50T"), (-1500, "-1.50K"),
])
def test_si_units(value, text):
    assert A.si(value) == text


def test_cells_fixed_floats_and_code_spans():
    assert A._fixed(None) is None and A._fixed(1.005) == "1.00" and A._fixed(93.456) == "93.46"
    assert A._cell(0.123456) == "0.1235"
    assert A._cell(3) == 3 and A._cell(None) is None and A._cell(True) is True
    assert A._cell("no~good") == "`no~good`"
    assert A.artifact_key("RE-nb201_s0", "report") == "re-nb201-s0-report"


def test_encoding_text_is_one_clipped_code_span():
    assert A.encoding_text("|a~0|+|b~1|") == "`|a~0|+|b~1|`"
    assert A.encoding_text([1, {"k": 2}]) == '`[1,{"k":2}]`'
    long = "x" * 121
    assert A.encoding_text(long) == "`" + "x" * 119 + "…`"
    assert A.encoding_text("x" * 120) == "`" + "x" * 120 + "`"


def rec(trial, accuracy, **kw):
    return TrialRecord(trial=trial, key=f"k{trial}", encoding=f"e{trial}", accuracy=accuracy, **kw)


def test_top_trials_ranks_what_counts_with_the_union_of_metrics():
    history = [rec(0, 50.0, metrics={"a": 1.5}), rec(1, None, error="x"), rec(2, 70.0, metrics={"b": "w", "d": {}}),
               rec(3, 90.0, metrics={"self_reported": True}), rec(4, 60.0, params=1234.0, flops=2e6,
                                                                     cost_seconds=1.234, cached=True)]
    rows = A.top_trials(history, trust=False)
    assert [r["trial"] for r in rows] == [2, 4, 0]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert rows[1] == {"rank": 2, "trial": 4, "accuracy": "60.00", "params": "1.23K", "flops": "2.00M",
                       "encoding": "`e4`", "key": "k4", "cost_seconds": "1.23", "cached": True, "a": None, "b": None}
    assert rows[0]["b"] == "`w`" and "d" not in rows[0] and rows[2]["a"] == "1.5"
    trusted = A.top_trials(history, trust=True)
    assert [r["trial"] for r in trusted] == [3, 2, 4, 0]
    assert trusted[0]["self_reported"] is True


def test_top_trials_keeps_ten():
    rows = A.top_trials([rec(i, float(i)) for i in range(12)], trust=False)
    assert [r["trial"] for r in rows] == list(range(11, 1, -1))


class RecordedArtifacts(A.SearchArtifacts):
    """The progress updates recorded instead of sent (the API call is not what is tested)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent = []
        self.progress_id = "id"

    def _progress(self, value, description):
        self.sent.append((value, description))


def test_progress_updates_at_most_once_a_second_with_done_and_best():
    times = iter([0.0, 0.0, 0.5, 1.0, 1.0, 1.9, 2.5, 2.5])
    art = RecordedArtifacts("re-nb201-s0", trials=4, clock=lambda: next(times))
    art.on_batch([rec(0, None, screened=True)])                # 0.0: first, sent; a screened one is no trial
    art.on_batch([rec(0, None, error="x"), rec(1, 50.0)])      # 0.5: too soon
    art.on_batch([rec(0, None, error="x"), rec(1, 50.0)])      # 1.0: one second since, sent
    art.on_batch([])                                           # 1.9: too soon
    art.on_batch([rec(i, 10.0 * i) for i in range(5)] + [rec(9, 1.0, screened=True)])  # 2.5: sent, capped at 100
    assert art.sent == [(0.0, "re-nb201-s0: 0/4 trials, best none yet"),
                        (50.0, "re-nb201-s0: 2/4 trials, best 50.00%"),
                        (100.0, "re-nb201-s0: 5/4 trials, best 40.00%")]


def test_progress_before_start_is_refused():
    with pytest.raises(AssertionError, match="start"):
        A.SearchArtifacts("n", 1).on_batch([])


def test_report_markdown_names_the_run_dirs_files(tmp_path):
    summary = {"trials": 0, "best": None, "spec": {"trials": 1}, "wall_seconds": 0.0, "cache_hits": 0,
               "strategy": "re", "space": "nb201", "evaluator": "table", "seed": 0, "failed": 0}
    text = A.report_markdown(tmp_path, [], summary)
    assert A.PLOT_LINE not in text
    assert f"Run dir: `{tmp_path.resolve()}`" in text
    assert f"Files: [report.md]({(tmp_path / 'report.md').as_uri()}), [history.jsonl]" in text


# ---------------------------------------------------------------- deployments (prefect.yaml)


def write(tmp_path, text):
    path = tmp_path / "prefect.yaml"
    path.write_text(text)
    return path


OK = """deployments:
- name: a
  entrypoint: flows/entry.py:search_overrides_flow
  parameters: {root: runs}
  schedules: [{cron: '0 3 * * *', timezone: Europe/Berlin, active: false}]
  tags: [x]
  version: '1'
  concurrency_limit: 1
- name: b
  entrypoint: flows/regression.py:regression_flow
"""


def test_a_good_file_reads_every_field(tmp_path):
    a, b = D.load(write(tmp_path, OK))
    assert a == D.Entry("a", "flows/entry.py:search_overrides_flow", {"root": "runs"},
                        (D.Schedule("0 3 * * *", "Europe/Berlin", False),), None, 1, ("x",), "1")
    assert (a.module, a.function) == ("flows.entry", "search_overrides_flow")
    assert b == D.Entry("b", "flows/regression.py:regression_flow")
    assert str(a.schedules[0]) == "0 3 * * * (Europe/Berlin, inactive)"
    assert str(D.Schedule("0 * * * *")) == "0 * * * * (UTC)"


def test_overrides_reach_one_deployment(tmp_path):
    path = write(tmp_path, OK)
    a, b = D.load(path, ["a.cron=0 4 * * *", "b.parameters.suite=quick", "a.tags=[y,z]"])
    assert a.schedules == (D.Schedule("0 4 * * *", "UTC", True),) and a.tags == ("y", "z")
    assert b.parameters == {"suite": "quick"}
    (a,) = D.load(path, ["b=null", "a.cron=null"])
    assert a.name == "a" and a.schedules == ()
    assert D._apply({"a": {}}, []) == {"a": {}}


@pytest.mark.parametrize("override, message", [
    ("a.cron", "override 'a.cron': expected NAME.KEY=VALUE or NAME=null"),
    ("=1", "override '=1': expected NAME.KEY=VALUE or NAME=null"),
    ("c.cron=1", "override 'c.cron=1': no deployment 'c' (valid: a, b)"),
])
def test_bad_overrides_are_one_line(tmp_path, override, message):
    with pytest.raises(ConfigError) as err:
        D.load(write(tmp_path, OK), [override])
    assert str(err.value) == message


def test_dropping_every_deployment_leaves_none(tmp_path):
    path = write(tmp_path, OK)
    with pytest.raises(ConfigError) as err:
        D.load(path, ["a=null", "b=null"])
    assert str(err.value) == f"{path}: no deployments"


@pytest.mark.parametrize("text, message", [
    ("[1]", "{p}: must be a mapping with a 'deployments' list"),
    ("deployments: 1", "{p}: 'deployments' must be a list of deployments"),
    ("deployments: [{entrypoint: x}]", "{p}: deployments[0] needs a name"),
    ("deployments: [{name: ''}]", "{p}: deployments[0] needs a name"),
    ("deployments: [{name: a}, {name: a}]", "{p}: deployment 'a' is declared twice"),
    ("deployments: []", "{p}: no deployments"),
    ("deployments: [a: 1", "{p}: not valid YAML (expected ',' or ']', but got '<stream end>' on line 1)"),
])
def test_bad_files_are_one_line(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        D.load(path)
    assert str(err.value) == message.format(p=path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        D.load(tmp_path / "none.yaml")
    assert str(err.value) == f"{tmp_path / 'none.yaml'} not found"


@pytest.mark.parametrize("body, message", [
    ([], "must be a mapping"),
    ({"entrypoint": "x.py"}, "entrypoint must be 'path/to/file.py:flow_function', got 'x.py'"),
    ({"entrypoint": 1}, "entrypoint must be 'path/to/file.py:flow_function', got 1"),
    ({"entrypoint": "a/b.py:f", "parameters": [1]}, "parameters must be a mapping"),
    ({"entrypoint": "a/b.py:f", "description": 1}, "description must be a string"),
    ({"entrypoint": "a/b.py:f", "concurrency_limit": 0},
     "concurrency_limit must be an integer >= 1 or null, got 0"),
    ({"entrypoint": "a/b.py:f", "concurrency_limit": True},
     "concurrency_limit must be an integer >= 1 or null, got True"),
    ({"entrypoint": "a/b.py:f", "concurrency_limit": "2"},
     "concurrency_limit must be an integer >= 1 or null, got '2'"),
    ({"entrypoint": "a/b.py:f", "tags": "x"}, "tags must be a list of strings"),
    ({"entrypoint": "a/b.py:f", "tags": [1]}, "tags must be a list of strings"),
    ({"entrypoint": "a/b.py:f", "version": 1}, "version must be a string"),
    ({"entrypoint": "a/b.py:f", "work_pool": "p"}, "work_pool must be a mapping (name: POOL)"),
    ({"entrypoint": "a/b.py:f", "schedules": "x"}, "schedules must be a list of {cron: ..., timezone: UTC}"),
    ({"entrypoint": "a/b.py:f", "schedules": [{"cron": 1}]}, "each schedule needs cron: '<expression>', got {'cron': 1}"),
    ({"entrypoint": "a/b.py:f", "schedules": ["x"]}, "each schedule needs cron: '<expression>', got 'x'"),
    ({"entrypoint": "a/b.py:f", "schedules": [{"cron": "* * * * *", "active": "no"}]},
     "schedule: timezone must be a string and active true or false"),
    ({"entrypoint": "a/b.py:f", "schedules": [{"cron": "* * * * *", "timezone": 1}]},
     "schedule: timezone must be a string and active true or false"),
])
def test_bad_entries_are_one_line(body, message):
    with pytest.raises(ConfigError) as err:
        D._entry("a", body)
    assert str(err.value) == f"deployment 'a': {message}"


def test_good_entry_bounds():
    e = D._entry("a", {"entrypoint": "f.py:g", "concurrency_limit": 1, "work_pool": {"name": "p"},
                       "schedules": [{"cron": "* * * * *", "timezone": None}]})
    assert (e.concurrency_limit, e.schedules) == (1, (D.Schedule("* * * * *", "UTC", True),))
    assert D._entry("a", {"entrypoint": "f.py:g", "concurrency_limit": None}).concurrency_limit is None


def test_yaml_problem_in_a_few_words():
    class Err(Exception):
        problem, problem_mark = "bad", type("M", (), {"line": 4})()
    assert D._problem(Err(), lines=True) == "bad on line 5"
    assert D._problem(Err()) == "bad"
    assert D._problem(ValueError("a\n  b")) == "a b"


def test_describe_names_flow_schedule_and_limit():
    entries = [D.Entry("b", "flows/regression.py:regression_flow", {"suite": "quick"}),
               D.Entry("c", "flows/nothing.py:f"),
               D.Entry("d", "flows/entry.py:RUN_DIR", schedules=(D.Schedule("0 1 * * *"),))]
    lines = D.describe(entries, 2)
    assert lines[0] == ("nas-regression/b\n  entrypoint: flows/regression.py:regression_flow\n"
                        "  schedule: none (runs on demand)\n  parameters: {'suite': 'quick'}")
    assert lines[1].startswith("?/c (not servable: deployment 'c': cannot import flows/nothing.py:f (")
    assert lines[2].startswith("?/d (not servable: deployment 'd': flows/entry.py:RUN_DIR is not a Prefect flow)\n"
                               "  entrypoint: flows/entry.py:RUN_DIR\n  schedule: 0 1 * * * (UTC)")
    assert lines[3] == "limit: 2 flow runs at once"
    assert D.describe([], None) == ["limit: none flow runs at once"]


@pytest.mark.parametrize("entry, message", [
    (D.Entry("b", "flows/regression.py:regression_flow", {"nope": 1}), "deployment 'b': parameters: "),
    (D.Entry("b", "flows/regression.py:regression_flow", schedules=(D.Schedule("61 * * * *"),)),
     "deployment 'b': invalid cron '61 * * * *'"),
    (D.Entry("b", "flows/regression.py:regression_flow", schedules=(D.Schedule("0 * * * *", "Mars/Base"),)),
     "deployment 'b': invalid timezone 'Mars/Base'"),
])
def test_build_checks_parameters_cron_and_timezone(entry, message):
    with pytest.raises(ConfigError) as err:
        D.build(entry)
    assert str(err.value).startswith(message)


# ---------------------------------------------------------------- the Prefect server's settings


@pytest.mark.parametrize("raw, mode", [(None, "temporary"), ("local", "local"), (" Local ", "local"),
                                       ("TEMPORARY", "temporary")])
def test_server_mode(monkeypatch, raw, mode):
    if raw is None:
        monkeypatch.delenv(PS.SERVER_MODE, raising=False)
    else:
        monkeypatch.setenv(PS.SERVER_MODE, raw)
    assert PS.server_mode() == mode


def test_unknown_server_mode_is_one_line(monkeypatch):
    monkeypatch.setenv(PS.SERVER_MODE, "remote")
    with pytest.raises(ConfigError) as err:
        PS.server_mode()
    assert str(err.value) == "NASFLOW_PREFECT_SERVER='remote': expected 'local' or 'temporary'"


@pytest.mark.parametrize("raw, value", [(None, 30.0), ("0.01", 0.01), ("5", 5.0)])
def test_idle_minutes(monkeypatch, raw, value):
    if raw is None:
        monkeypatch.delenv(PS.IDLE_MINUTES, raising=False)
    else:
        monkeypatch.setenv(PS.IDLE_MINUTES, raw)
    assert PS.idle_minutes() == value


@pytest.mark.parametrize("raw", ["0", "-1", "x", "nan"])
def test_idle_minutes_must_be_positive(monkeypatch, raw):
    monkeypatch.setenv(PS.IDLE_MINUTES, raw)
    with pytest.raises(ConfigError) as err:
        PS.idle_minutes()
    assert str(err.value) == f"NASFLOW_SERVER_IDLE_MINUTES={raw!r}: expected a positive number of minutes"


def test_ui_address_and_running_state(tmp_path):
    assert PS.ui_address("http://127.0.0.1:4300/api/") == "http://127.0.0.1:4300"
    assert PS.ui_address("http://h/api") == "http://h"
    assert PS._running_state(tmp_path) is None  # no STATE
    (tmp_path / SS.STATE).write_text("{")
    assert PS._running_state(tmp_path) is None
    (tmp_path / SS.STATE).write_text(json.dumps({"port": 1}))
    assert PS._running_state(tmp_path) is None
    (tmp_path / SS.STATE).write_text(json.dumps({"url": "http://127.0.0.1:9/api"}))  # nothing answers there
    assert PS._running_url(tmp_path) is None


def test_free_port_is_bindable():
    port = PS._free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_server_dir_is_prefect_home(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "a" / "ph"))
    assert PS._server_dir() == (tmp_path / "a" / "ph").resolve() and (tmp_path / "a" / "ph").is_dir()


def test_check_server_without_a_url(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    with temporary_settings(updates={PREFECT_API_URL: None}):
        with pytest.raises(NasError) as err:
            PS.check_server()
        assert str(err.value) == f"PREFECT_API_URL is not set; {PS.START_SERVER}"
        assert PS.configured_ui() is None
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with pytest.raises(NasError) as err:
            PS.check_server()
        assert str(err.value).startswith("no Prefect server answers at http://127.0.0.1:9/api (")
        assert PS.ui_warning("http://127.0.0.1:9/api") is None
        assert PS.configured_ui() == "http://127.0.0.1:9"


# ---------------------------------------------------------------- the shared server's watchdog pieces


def test_shared_server_pieces(tmp_path):
    assert SS.healthy("http://127.0.0.1:9/api", timeout=0.5) is False
    assert SS.healthy("not a url") is False
    users = tmp_path / "users"
    users.touch()
    os.utime(users, (0, 0))
    assert SS.idle_seconds(users) > 1e9
    import fcntl
    with users.open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        assert SS.idle_seconds(users) is None
    command = SS.server_command(4321)
    assert command[command.index("--port") + 1] == "4321" and command[1] == "-I"
    assert command[-4:] == ["--log-level", "error", "--lifespan", "on"]
    state = tmp_path / "state.json"
    assert SS._owns(state) is False
    state.write_text(json.dumps({"pid": os.getpid()}))
    assert SS._owns(state) is True
    state.write_text(json.dumps({"pid": os.getpid() + 1}))
    assert SS._owns(state) is False


def test_shared_server_stops_a_finished_server_at_once():
    import subprocess
    import sys
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    SS._stop(done)  # already ended: nothing to do
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    SS._stop(running)
    assert running.returncode == -15


# ---------------------------------------------------------------- heartbeats


def test_quick_heartbeats_turn_the_engines_off_with_prefects_floor():
    from prefect.settings import get_current_settings
    with H._heartbeat_frequency(None), H.quick_heartbeats():
        assert H._INTERVAL.get() is None  # off already: nothing to send
    for seconds, interval in ((10, 30), (30, 30), (31, 31)):
        with H._heartbeat_frequency(seconds):
            with H.quick_heartbeats():
                assert H._INTERVAL.get() == interval
                assert get_current_settings().flows.heartbeat_frequency is None
                with H.heartbeats():  # outside a flow run: nothing sent
                    pass
            assert H._INTERVAL.get() is None
            assert get_current_settings().flows.heartbeat_frequency == seconds


# ---------------------------------------------------------------- the search flow's parameters


@pytest.mark.parametrize("value, data", [
    (None, None), ("s", "s"), (1, 1), (1.5, 1.5), (True, True), ([1, (2, 3)], [1, [2, 3]]),
    ({"a": (1,)}, {"a": [1]}),
])
def test_json_data(value, data):
    assert S.json_data(value) == data


@pytest.mark.parametrize("value", [{1: 2}, Path("x"), {1, 2}, b"x"])
def test_not_json_data(value):
    with pytest.raises(TypeError, match="^not JSON data: "):
        S.json_data(value)


def test_plain_parameters_flow_sends_json_data_as_is():
    payload = {"spec": {"a": (1, 2)}, "run_dir": "r", "runner_settings": None}
    assert S.search_flow.serialize_parameters(payload) == {"spec": {"a": [1, 2]}, "run_dir": "r",
                                                            "runner_settings": None}
    assert S.search_flow.serialize_parameters({"p": Path("x")}) == {"p": "x"}  # Prefect's own
    assert type(S.search_flow.with_options(name="x")) is S.PlainParametersFlow


# ---------------------------------------------------------------- more of prefect.yaml, the API a command reports to


def test_a_dropped_deployments_cron_is_dropped_with_it(tmp_path):
    (b,) = D.load(write(tmp_path, OK), ["a=null", "a.cron=0 4 * * *"])
    assert b.name == "b"


def test_an_override_that_does_not_parse_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        D.load(write(tmp_path, OK), ["a.tags=[x"])
    assert str(err.value).startswith("override 'a.tags=[x': ")
    assert "\n" not in str(err.value)


def test_a_file_that_is_not_text_cannot_be_read(tmp_path):
    path = tmp_path / "prefect.yaml"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError) as err:
        D.load(path)
    assert str(err.value).startswith(f"{path}: cannot read (")


def test_the_checkouts_file_is_the_default_else_the_current_directorys(monkeypatch, tmp_path):
    monkeypatch.setattr(D, "PROJECT_FILE", tmp_path / "checkout" / "prefect.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        D.default_file()
    assert str(err.value) == (f"no prefect.yaml at {tmp_path / 'checkout' / 'prefect.yaml'} or in the current "
                              "directory; pass --file PATH")
    write(tmp_path, OK)
    assert D.default_file() == Path("prefect.yaml")
    (tmp_path / "checkout").mkdir()
    write(tmp_path / "checkout", OK.replace("name: a", "name: c"))
    assert D.default_file() == tmp_path / "checkout" / "prefect.yaml"
    assert [e.name for e in D.load()] == ["c", "b"]


def test_build_gives_the_deployment_as_checked():
    entry = D.Entry("b", "flows/regression.py:regression_flow", {"suite": "quick"},
                    (D.Schedule("0 3 * * *", "Europe/Berlin", False),), None, 2, ("t",), "v1")
    deployment = D.build(entry)
    assert (deployment.name, deployment.flow_name, deployment.parameters) == ("b", "nas-regression",
                                                                               {"suite": "quick"})
    assert (deployment.tags, deployment.version) == (["t"], "v1")
    assert deployment.description == D.load_flow(entry).description
    (schedule,) = deployment.schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone, schedule.active) == ("0 3 * * *", "Europe/Berlin",
                                                                                     False)


def test_a_configured_api_is_used_as_is():
    from prefect.settings import PREFECT_API_URL, temporary_settings
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert PS.start_temporary_server(show=False) is None
        with PS.prefect_api(show=False) as url:
            assert url is None
        for name in ("prefect", "dask"):
            with T.shared_api({"name": name}):
                assert PREFECT_API_URL.value() == "http://127.0.0.1:9/api"


def test_serve_without_a_configured_api_in_temporary_mode_starts_none(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    monkeypatch.setenv(PS.SERVER_MODE, "temporary")
    with temporary_settings(updates={PREFECT_API_URL: None}), PS.prefect_api(show=False, temporary=False) as url:
        assert url is None


# ---------------------------------------------------------------- entry: a deployment run's name and composed job

JOB = ["space=nb201", "evaluator=simulated", "budget.trials=2", "progress=false"]


def run_parameters(monkeypatch, parameters):
    """The flow run's parameters as Prefect's runtime gives them inside the run (a stand-in outside one)."""
    monkeypatch.setattr(E, "flow_run", types.SimpleNamespace(parameters=parameters))
    E._COMPOSED.set(None)  # none left by an earlier test


def test_the_run_is_named_from_its_overrides_and_its_body_takes_that_compose(monkeypatch, tmp_path):
    run_parameters(monkeypatch, {"overrides": [*JOB, f"hydra.run.dir={tmp_path}", "seed=4"]})
    assert E.overrides_run_name() == "bananas-nb201-s4"
    job, composed = E._COMPOSED.get()
    assert job == [*JOB, "seed=4"]
    assert E._composed(job) is composed  # taken: composed once
    assert E._COMPOSED.get() is None
    again = E._composed(job)  # nothing handed: composed here
    assert again is not composed and again[0].seed == 4


def test_a_compose_for_another_job_is_not_taken(monkeypatch):
    run_parameters(monkeypatch, {"overrides": JOB})
    assert E.overrides_run_name() == "bananas-nb201-s0"
    spec, progress, _ = E._composed([*JOB, "seed=2"])
    assert (spec.seed, progress) == (2, False) and E._COMPOSED.get() is None


def test_overrides_that_do_not_compose_keep_the_flows_name(monkeypatch):
    run_parameters(monkeypatch, {"overrides": ["space=nope"]})
    assert E.overrides_run_name() == "nas-search"
    assert E._COMPOSED.get() is None


def test_an_ingest_run_checks_its_overrides_before_reading():
    with pytest.raises(ConfigError, match="^unknown key 'llm.nope' "):
        E.ingest_overrides_flow.fn(paths=None, overrides=["llm.nope=1"])


def test_heartbeat_resources_name_the_run_its_flow_deployment_and_tags():
    import uuid

    from prefect import __version__
    from prefect.client.schemas.objects import FlowRun
    run = FlowRun(id=uuid.UUID(int=1), name="re-nb201-s0", flow_id=uuid.UUID(int=2),
                  deployment_id=uuid.UUID(int=3), tags=["b", "a"])
    resource, related = H.heartbeat_resources(run, "nas-search")
    assert resource == {"prefect.resource.id": f"prefect.flow-run.{uuid.UUID(int=1)}",
                        "prefect.resource.name": "re-nb201-s0", "prefect.version": __version__}
    assert related[:2] == [{"prefect.resource.id": f"prefect.flow.{uuid.UUID(int=2)}", "prefect.resource.role": "flow",
                            "prefect.resource.name": "nas-search"},
                           {"prefect.resource.id": f"prefect.deployment.{uuid.UUID(int=3)}",
                            "prefect.resource.role": "deployment"}]
    assert sorted(r["prefect.resource.id"] for r in related[2:]) == ["prefect.tag.a", "prefect.tag.b"]
    bare = types.SimpleNamespace(id=1, name=None, flow_id=None, deployment_id=None, tags=None)  # as a run's may be
    resource, related = H.heartbeat_resources(bare, "")
    assert resource["prefect.resource.name"] == "" and related == []


def test_a_read_and_a_probe_are_retried_once():
    from flows import knowledge as K
    from flows import regression as R
    assert (K.read_task.retries, K.read_task.retry_delay_seconds) == (1, 1)
    assert (R.probe_task.retries, R.probe_task.retry_delay_seconds) == (1, 5)


def test_flow_parameters_go_unvalidated_as_given():
    """Pydantic's validation of each call's parameters would coerce a spec's values and cost a compose."""
    from flows import knowledge as K
    from flows import regression as R
    for flow_ in (S.search_flow, R.regression_flow, K.ingest_flow):
        assert flow_.should_validate_parameters is False
    assert S.search_flow.name == "nas-search" and S.search_flow.persist_result is False


def test_a_supernet_run_refuses_ddp_before_the_data_loads():
    from flows import supernet as SN
    with pytest.raises(ConfigError) as err:
        SN.train_supernet_flow.fn(["supernet.devices=2", "out=/nonexistent/sn"])
    assert str(err.value) == ("supernet.devices > 1 needs `nas train-supernet`: Lightning's DDP relaunches the "
                              "command per rank, which in a flow run would start the run again")


# ---------------------------------------------------------------- against a scripted API (a stand-in HTTP server)


class _Api(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/api/health":
            code, body = 200, b"true"
        elif self.path == "/ui-settings" and self.server.ui_api is not False:
            code, body = 200, json.dumps({"api_url": self.server.ui_api}).encode()
        else:
            code, body = 404, b""
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.ui_api = None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_port}/api"
    server.shutdown()
    server.server_close()


def test_a_server_that_answers_is_checked_and_its_ui_compared(api):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    server, url = api
    assert SS.healthy(url) is True and SS.healthy(url + "/") is True
    with temporary_settings(updates={PREFECT_API_URL: url}):
        assert PS.check_server() == url
    assert PS.ui_warning(url) is None            # no api_url: nothing to compare
    server.ui_api = url + "/"
    assert PS.ui_warning(url) is None            # the same address
    server.ui_api = "http://127.0.0.1:4200/api"
    assert PS.ui_warning(url) == (f"nas serve: warning: the server's UI calls the API at http://127.0.0.1:4200/api, "
                                  f"not {url}; restart it with PREFECT_UI_API_URL={url} prefect server start ...")
    server.ui_api = False
    assert PS.ui_warning(url) is None            # no UI


@pytest.mark.parametrize("saved", [None, "http://saved/api"])
def test_the_shared_local_server_found_running_is_used_and_held(api, monkeypatch, tmp_path, saved):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    _, url = api
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.setenv(PS.SERVER_MODE, "local")
    if saved is None:
        monkeypatch.delenv("PREFECT_API_URL", raising=False)
    else:
        monkeypatch.setenv("PREFECT_API_URL", saved)
    state = {"url": url, "port": 1, "pid": 1, "idle_minutes": 5}
    (tmp_path / SS.STATE).write_text(json.dumps(state))
    (tmp_path / SS.USERS).touch()
    os.utime(tmp_path / SS.USERS, (0, 0))
    assert PS.running_local_server() == state
    assert PS._start_local_server(tmp_path, False, tmp_path / SS.LOG) == url  # one runs: none started
    with temporary_settings(updates={PREFECT_API_URL: None}):
        with PS.prefect_api(show=False) as got:
            assert got == url and os.environ["PREFECT_API_URL"] == url and PREFECT_API_URL.value() == url
            assert os.stat(tmp_path / SS.USERS).st_mtime == 0  # held: the idle clock starts as it lets go
        assert os.environ.get("PREFECT_API_URL") == saved and PREFECT_API_URL.value() is None
    assert os.stat(tmp_path / SS.USERS).st_mtime > 0
    assert not (tmp_path / SS.LOG).exists()


# ---------------------------------------------------------------- the shared server's watchdog, around a stand-in server

STUB_SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture
def own_signals():
    """The watchdog installs its SIGTERM and SIGINT handlers: put pytest's back."""
    import signal
    saved = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGTERM, saved[0])
    signal.signal(signal.SIGINT, saved[1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_watchdog_serves_then_stops_once_idle(monkeypatch, tmp_path, capsys, own_signals):
    import sys
    monkeypatch.setattr(SS, "server_command", lambda port: [sys.executable, "-c", STUB_SERVER, str(port)])
    monkeypatch.setattr(SS, "POLL_S", 0.05)
    (tmp_path / SS.USERS).touch()
    os.utime(tmp_path / SS.USERS, (0, 0))  # last let go long ago
    port = free_port()
    assert SS.main(["--dir", str(tmp_path), "--port", str(port), "--idle-minutes", "0.5"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"serving http://127.0.0.1:{port}/api (UI at http://127.0.0.1:{port}); stops after 0.5 idle minutes",
                   "idle for 0.5 minutes: stopping"]
    assert not (tmp_path / SS.STATE).exists() and not SS.healthy(f"http://127.0.0.1:{port}/api", timeout=0.5)


def test_the_watchdog_of_a_server_that_does_not_start_says_so(monkeypatch, tmp_path, capsys, own_signals):
    import sys
    monkeypatch.setattr(SS, "server_command", lambda port: [sys.executable, "-c", "raise SystemExit(3)"])
    assert SS.main(["--dir", str(tmp_path), "--port", "9", "--startup-timeout", "60"]) == 1
    assert capsys.readouterr().err == "local Prefect server on port 9 did not start (exit 3)\n"
    assert not (tmp_path / SS.STATE).exists()


# ---------------------------------------------------------------- the process pool's exit, a local cluster's retries


def test_the_process_pool_exits_plainly_and_on_an_interrupt():
    with T.InterruptibleProcessPool(max_workers=1) as pool:  # no task: no worker started
        assert pool._executor is not None
    with pytest.raises(KeyboardInterrupt), T.InterruptibleProcessPool(max_workers=1):
        raise KeyboardInterrupt
    with pytest.raises(ValueError), T.InterruptibleProcessPool(max_workers=1):
        raise ValueError("an evaluation's error: the workers are left to finish")


def test_a_local_clusters_scheduler_reruns_a_lost_task_max_retries_times():
    cluster = T.local_cluster(max_retries=3, n_workers=0, processes=False, dashboard_address=None)
    try:
        assert cluster.scheduler.allowed_failures == 3
    finally:
        cluster.close()


def test_the_regression_comparison_task_is_the_judges_finish(tmp_path):
    from flows import regression as R
    from nas.regression.judge import failed_probe, plan
    from nas.regression.probes import get_suite
    p = plan(get_suite("smoke"), None, tmp_path / "out")
    results = [failed_probe(probe.name, RuntimeError("gone")) for probe in p.suite.probes]
    report = R.compare_task.fn("smoke", p, results, 1.5)
    assert (report["suite"], report["wall_s"], report["out"]) == ("smoke", 1.5, str((tmp_path / "out").resolve()))
    assert report["failures"] and json.loads((tmp_path / "out" / "report.json").read_text())["wall_s"] == 1.5


@pytest.mark.parametrize("settings, retries", [({"name": "prefect"}, 1), ({"name": "prefect", "retries": 0}, 0),
                                               ({"name": "dask", "retries": 3}, 3)])
def test_a_flow_runner_hands_the_flow_its_settings_retries_and_one_without_them(monkeypatch, settings, retries):
    handed = []
    monkeypatch.setattr(S, "run_search_flow", lambda spec, run_dir, **kw: handed.append(kw) or {})
    session = types.SimpleNamespace(search=types.SimpleNamespace(spec="spec"), run=types.SimpleNamespace(path="dir"))
    S.FlowRunner(settings).run(session, progress=False)
    assert handed == [{"runner": settings, "retries": retries, "progress": False, "session": session}]
