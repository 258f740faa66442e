"""One `nas search` builds its space, strategy and evaluator once, and takes its run dir's lock
and reads its state once: the command opens one session (nas/search/session.py), and the runner,
the Prefect flow and the loop use it. A deployment's run (flows/entry.py) does the same."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

# Counts every build of a part (and every space made by any path), each composition of the config,
# each lock a run dir takes and each read of its state, then runs the real CLI, or (argv `deployment ROOT OVERRIDES...`) the
# deployments' flow as a worker runs it.
COUNT = """
import collections, json, sys
import nas.config
from nas.search import spec
from nas.search.rundir import RunDir
from nas.spaces import SPACES
counts = collections.Counter()

def counted(owner, name, label):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        counts[label] += 1
        return original(*args, **kwargs)
    setattr(owner, name, wrapper)

for name in ("build_space", "build_strategy", "build_evaluator"):
    counted(spec.SearchSpec, name, name)
counted(SPACES, "create", "spaces created")
counted(nas.config, "_checked", "configs composed")
counted(RunDir, "_acquire", "locks taken")
counted(RunDir, "prepare", "states read")
try:
    if sys.argv[1] == "deployment":
        from tasks.env import configure_prefect_env
        configure_prefect_env()  # as a worker's run: before Prefect is imported
        from flows.entry import search_overrides_flow
        search_overrides_flow(overrides=sys.argv[3:], root=sys.argv[2])
    else:
        from nas.cli.main import main
        main(sys.argv[1:])
finally:
    print("COUNTS " + json.dumps(counts), file=sys.stderr)
"""


SEARCH = ["space=nb201", "evaluator=table", "strategy=rea", "budget.trials=4"]


@pytest.mark.parametrize("how", ["runner=local", "runner=prefect", "deployment"])
def test_a_search_builds_each_part_once_and_opens_its_run_dir_once(tmp_path, nas_env, how):
    """`nas search` on either runner, and a deployment's run (`nas-search-overrides` on the default
    runner: the search flow as its body): one build of each part, one composition of the config
    (a deployment's run names itself from it first), one lock, one read of the state."""
    run_dir = tmp_path / "runs" / "rea-nb201-s0"
    argv = (["deployment", str(tmp_path / "runs"), *SEARCH] if how == "deployment" else
            ["search", *SEARCH, how, "progress=false", f"hydra.run.dir={run_dir}"])
    done = subprocess.run([sys.executable, "-c", COUNT, *argv], env=nas_env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stderr.rpartition("COUNTS ")[2])
    assert counts == {"build_space": 1, "build_strategy": 1, "build_evaluator": 1, "spaces created": 1,
                      "configs composed": 1, "locks taken": 1, "states read": 1}
    assert len((run_dir / "history.jsonl").read_text().splitlines()) == 4
