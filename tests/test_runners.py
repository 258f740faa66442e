"""Scale-out: the `runner` config group picks the flow's task runner (threads,
processes, Dask, Ray), and a search on a local Dask cluster evaluates every
candidate in worker processes, writes the shared evaluation cache, and finds
what the other runners find."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from prefect.task_runners import ProcessPoolTaskRunner, ThreadPoolTaskRunner
from prefect_dask import DaskTaskRunner

from conftest import run_nas, seed_prefect_db
from flows.task_runners import build_task_runner, local_cluster
from nas.errors import ConfigError, MissingDependencyError

ROOT = Path(__file__).resolve().parents[1]


def runner_conf(name: str) -> dict:
    return yaml.safe_load((ROOT / "conf" / "runner" / f"{name}.yaml").read_text())


def test_each_runner_config_builds_its_task_runner():
    threads = build_task_runner(runner_conf("prefect"))
    assert isinstance(threads, ThreadPoolTaskRunner) and threads._max_workers == 4
    assert isinstance(build_task_runner(runner_conf("processes")), ProcessPoolTaskRunner)
    local = build_task_runner(runner_conf("dask"), gpus=[])
    assert isinstance(local, DaskTaskRunner) and local.address is None and local.cluster_class is local_cluster
    assert local.cluster_kwargs == {"n_workers": 2, "threads_per_worker": 1, "processes": True,
                                    "dashboard_address": None, "max_retries": 2}
    remote = build_task_runner({**runner_conf("dask"), "address": "tcp://10.0.0.5:8786"})
    assert remote.address == "tcp://10.0.0.5:8786" and remote.cluster_kwargs == {}


def test_ray_builds_or_says_how_to_install_it():
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        with pytest.raises(MissingDependencyError, match=r"pip install 'nasflow\[ray\]'$"):
            build_task_runner(runner_conf("ray"))
        return
    assert isinstance(build_task_runner({**runner_conf("ray"), "address": "ray://h:10001"}), RayTaskRunner)


@pytest.mark.parametrize("runner, message", [
    ({"name": "spark"}, "unknown runner 'spark' (valid: local, prefect, processes, dask, ray)"),
    ({"name": "dask", "n_workers": 0}, "runner.n_workers: expected a positive integer, got 0"),
    ({"name": "prefect", "workers": "4"}, "runner.workers: expected a positive integer, got '4'"),
])
def test_bad_runner_is_one_line(runner, message):
    with pytest.raises(ConfigError) as info:
        build_task_runner(runner)
    assert str(info.value) == message


def test_missing_prefect_dask_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "prefect_dask", None)  # import fails as if not installed
    with pytest.raises(MissingDependencyError, match=r"^runner=dask needs prefect-dask: pip install prefect-dask==\S+$"):
        build_task_runner({"name": "dask"})


def test_the_search_flows_pickle_as_dask_and_ray_send_them():
    """Each task a Dask or Ray runner sends carries the flow run's context, the flow included, its
    function pickled by value with the globals it names: a session's hand-off must not be one."""
    import cloudpickle

    from flows.entry import search_overrides_flow
    from flows.search import search_flow

    for flow in (search_flow, search_overrides_flow):
        assert cloudpickle.loads(cloudpickle.dumps(flow)).name == flow.name


# -- a real search on a local Dask cluster ---------------------------------------------------------

def navigator_and_generator(request: dict) -> str:
    """CoLLM's two LLMs, scripted as a pure function of the request (so every runner sees the
    same replies): a fixed strategy, and K NB201 cells picked by a hash of the conversation."""
    from nas.agents.collm.agents import values_text
    from nas.spaces.nb201.arch import OPS, NB201Cell
    from nas.spaces.nb201.space import NB201Space

    system, user = request["messages"][0]["content"], request["messages"][-1]["content"]
    if "You are the Navigator" in system:
        return "# SUMMARY\nConvolutions help.\n# KEY PATTERNS\n- 3x3 convs\n# DIRECTIONS\nprefer nor_conv_3x3\n"
    k = int(re.findall(r"(\d+)\s+(?:new\s+)?candidates", user)[-1])
    digest = int(hashlib.sha256(json.dumps(request["messages"]).encode()).hexdigest(), 16)
    cells = [NB201Cell(tuple(OPS[(digest >> (3 * (6 * i + j))) % len(OPS)] for j in range(6))) for i in range(k)]
    return "[\n" + ",\n".join(values_text(NB201Space(), c) for c in cells) + "\n]"


@pytest.mark.slow
def test_dask_search_matches_the_other_runners_and_fills_the_cache(tmp_path, nas_env):
    from support.scripted import ScriptedServer

    def search(tag: str, home: str, *runner: str) -> tuple[dict, list[tuple[str, float]]]:
        out = run_nas(["search", *args, *runner, f"hydra.run.dir={tmp_path / tag}"],
                      {**nas_env, "NASFLOW_HOME": str(tmp_path / home)})
        assert out.returncode == 0, out.stderr[-3000:]
        history = [json.loads(line) for line in (tmp_path / tag / "history.jsonl").read_text().splitlines()]
        return json.loads((tmp_path / tag / "summary.json").read_text()), [(h["key"], h["accuracy"]) for h in history]

    nas_env["NASFLOW_NO_KEY"] = ""
    seed_prefect_db(tmp_path / "home" / "prefect")  # the Dask and Prefect searches' home
    with ScriptedServer(navigator_and_generator) as srv:
        args = ["space=nb201", "evaluator=table", "strategy=collm", "strategy.candidates_per_iteration=3",
                "llm=openai", f"llm.base_url={srv.base_url}", "llm.api_key_env=NASFLOW_NO_KEY",
                "llm.structured=none", "budget.trials=6", "budget.batch_size=2", "seed=3", "progress=false"]
        dask, dask_history = search("dask", "home", "runner=dask", "runner.n_workers=2",
                                    "runner.threads_per_worker=1")
        # Same home: the thread runner replays every evaluation the Dask workers stored.
        threads, threads_history = search("threads", "home", "runner=prefect")
        local, local_history = search("local", "home-local", "runner=local")
    assert (dask["trials"], dask["failed"], dask["cache_hits"], dask["runner"]) == (6, 0, 0, "dask")
    assert dask["llm"]  # the LLM calls ran (in the flow process) under the Dask runner
    assert threads["cache_hits"] == 6 and threads_history == dask_history
    assert local_history == dask_history and all(acc is not None for _, acc in dask_history)
    from nas.evaluators.table import TableEvaluator
    from nas.spaces.nb201.space import NB201Space

    table = TableEvaluator(NB201Space()).fingerprint()  # which table scored: recorded by every runner
    assert dask["evaluator_fingerprint"] == threads["evaluator_fingerprint"] == local["evaluator_fingerprint"] == table


# -- DDP for supernet training (no GPU here: the Trainer's settings, not a launch) ------------------

@pytest.mark.parametrize("settings, expected", [
    ({"accelerator": "gpu", "devices": 4}, ("gpu", 4, "ddp_find_unused_parameters_true")),
    ({"accelerator": "gpu", "devices": 2, "strategy": "ddp_spawn"}, ("gpu", 2, "ddp_spawn")),
    ({}, ("auto", 1, "auto")),
])
def test_supernet_training_hands_devices_and_strategy_to_lightning(settings, expected, monkeypatch, tmp_path):
    import supernets.train as st

    class Launched(Exception):
        pass

    seen = {}

    def trainer(**kwargs):
        seen.update(kwargs)
        raise Launched

    monkeypatch.setattr(st.pl, "Trainer", trainer)
    with pytest.raises(Launched):
        st.train_supernet({"name": "nb201", "channels": 4, "cells_per_stage": 1}, {},
                          {"name": "digits", "root": None, "split_file": None},
                          st.SupernetSettings(epochs=1, train_subset=64, **settings), 0, tmp_path, progress=False)
    assert (seen["accelerator"], seen["devices"], seen["strategy"]) == expected


def test_bad_supernet_device_settings_are_one_line():
    from supernets.train import SupernetSettings

    with pytest.raises(ConfigError, match=r"^supernet.devices must be an integer >= 1, got 0$"):
        SupernetSettings(devices=0)
    with pytest.raises(ConfigError, match=r"^supernet.accelerator must be one of cpu, gpu, auto, got 'tpu'$"):
        SupernetSettings(accelerator="tpu")
