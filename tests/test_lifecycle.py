"""One `nas search` builds its space, strategy and evaluator once: the command's checks build
them, and the run dir, the runner, the Prefect flow and the loop use those same objects."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

# Counts every build of a part (and every space made by any path), then runs the real CLI.
COUNT = """
import collections, json, sys
from nas.search import spec
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
from nas.cli.main import main
try:
    main(sys.argv[1:])
finally:
    print("COUNTS " + json.dumps(counts), file=sys.stderr)
"""


@pytest.mark.parametrize("runner", ["local", "prefect"])
def test_a_search_builds_each_part_once(tmp_path, nas_env, runner):
    argv = ["search", "space=nb201", "evaluator=table", "strategy=rea", "budget.trials=4", f"runner={runner}",
            "progress=false", f"hydra.run.dir={tmp_path / 'run'}"]
    done = subprocess.run([sys.executable, "-c", COUNT, *argv], env=nas_env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stderr.rpartition("COUNTS ")[2])
    assert counts == {"build_space": 1, "build_strategy": 1, "build_evaluator": 1, "spaces created": 1}
    assert len((tmp_path / "run" / "history.jsonl").read_text().splitlines()) == 4


def test_a_handed_over_search_is_taken_once_and_only_for_its_spec():
    from nas.search.spec import Component, Search, SearchSpec

    spec = SearchSpec(Component("nb201"), Component("random"), Component("table"), seed=3)
    built = spec.build()
    built.ready()
    assert Search.of(SearchSpec(Component("nb201"), Component("random"), Component("table"), seed=4)) is not built
    assert Search.of(spec) is built
    assert Search.of(spec) is not built  # taken: the next search with this spec builds its own
    built.ready()
    Search.forget()
    assert Search.of(spec) is not built
