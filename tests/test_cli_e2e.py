"""End-to-end: the real `nas` CLI (Hydra + Prefect ephemeral server) on tiny settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import NAS, ROOT, run_nas

pytestmark = pytest.mark.slow


def history(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


TABLE = ["space=nb201", "evaluator=table"]  # the default job designs blocks with the local LLM


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_search_then_identical_rerun_replays_from_cache(tmp_path, nas_env):
    first, second = tmp_path / "first", tmp_path / "second"
    args = ["search", "space=nb201", "evaluator=table", "strategy=rea", "budget.trials=15", "seed=3"]
    out = run_nas([*args, f"hydra.run.dir={first}"], nas_env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"run dir: {first}" in out.stdout and "best: " in out.stdout
    for name in ("history.jsonl", "summary.json", "report.md", "best_so_far.png", "state.json"):
        assert (first / name).is_file(), name
    s1 = summary(first)
    assert s1["trials"] == 15 and s1["cache_hits"] == 0 and s1["runner"] == "prefect"
    assert s1["best"]["accuracy"] == max(r["accuracy"] for r in history(first))

    out = run_nas([*args, f"hydra.run.dir={second}"], nas_env)
    assert out.returncode == 0, out.stderr[-2000:]
    s2 = summary(second)
    assert s2["cache_hits"] == 15, "identical re-run must be served entirely from the task cache"
    strip = lambda h: [(r["key"], r["accuracy"], r["params"], r["flops"]) for r in h]  # noqa: E731
    assert strip(history(first)) == strip(history(second))


def test_corrupt_cache_entry_is_reported_and_reevaluated(tmp_path, nas_env):
    args = ["search", *TABLE, "strategy=random", "budget.trials=5", "seed=4"]
    assert run_nas([*args, f"hydra.run.dir={tmp_path / 'a'}"], nas_env).returncode == 0
    cache = Path(nas_env["NASFLOW_HOME"]) / "cache"
    victim = sorted(cache.iterdir())[0]
    victim.write_text("{not json")
    out = run_nas([*args, f"hydra.run.dir={tmp_path / 'b'}"], nas_env)
    assert out.returncode == 0, out.stderr[-2000:]
    warnings = [l for l in out.stderr.splitlines() if "corrupt cache entry" in l]
    assert len(warnings) == 1 and str(victim) in warnings[0]
    assert summary(tmp_path / "b")["cache_hits"] == 4
    assert summary(tmp_path / "a")["best"] == summary(tmp_path / "b")["best"]


def test_kill_9_then_restart_continues_without_reevaluation(tmp_path, nas_env):
    run_dir = tmp_path / "run"
    args = ["search", *TABLE, "strategy=rea", "budget.trials=40", "seed=5",
            "evaluator.simulated_cost_seconds=0.15", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([*NAS, *args], env=nas_env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    hist = run_dir / "history.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline:
        if hist.exists() and hist.read_text().count("\n") >= 12:
            break
        assert proc.poll() is None, "search ended before it could be killed"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the process and its Prefect server
    proc.wait()
    before = hist.read_text().splitlines()
    assert 12 <= len(before) < 40

    out = run_nas(args, nas_env)
    assert out.returncode == 0, out.stderr[-2000:]
    s = summary(run_dir)
    after = (run_dir / "history.jsonl").read_text().splitlines()
    assert s["trials"] == 40 and len(after) == 40
    assert s["resumed_trials"] >= len(before) - 1  # at most the one batch in flight is redone
    assert after[: s["resumed_trials"]] == before[: s["resumed_trials"]]
    assert [json.loads(l)["trial"] for l in after] == list(range(40))

    # The interrupted search ends exactly where an uninterrupted one does.
    ref = tmp_path / "ref"
    out = run_nas(["search", *TABLE, "runner=local", "strategy=rea", "budget.trials=40", "seed=5",
                   f"hydra.run.dir={ref}"], nas_env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [json.loads(l)["key"] for l in after] == [r["key"] for r in history(ref)]


def test_multirun_and_compare(tmp_path, nas_env):
    sweep = tmp_path / "sweep"
    out = run_nas(["search", "-m", *TABLE, "runner=local", "strategy=random,rea", "seed=0,1,2",
                   "budget.trials=12", f"hydra.sweep.dir={sweep}"], nas_env)
    assert out.returncode == 0, out.stderr[-2000:]
    runs = sorted(p.parent for p in sweep.rglob("summary.json"))
    assert len(runs) == 6
    assert {(summary(r)["strategy"], summary(r)["seed"]) for r in runs} == {
        (s, seed) for s in ("random", "rea") for seed in (0, 1, 2)}

    out = subprocess.run([*NAS, "compare", str(sweep), "--at", "5", "12", "--out", str(tmp_path / "cmp")],
                         env=nas_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    table = json.loads((tmp_path / "cmp" / "compare.json").read_text())["groups"]
    assert set(table) == {"random @ nb201/table", "rea @ nb201/table"}
    for row in table.values():
        assert row["runs"] == 3 and row["at"]["12"]["n"] == 3
        assert row["at"]["12"]["mean"] >= row["at"]["5"]["mean"]
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "random @ nb201/table" in out.stdout


@pytest.mark.parametrize("override, message", [
    ("strategy=foo", "unknown strategy 'foo' (valid: bananas, collm, evolution, fairnad, nader, optuna, random, rea, "
                     "reinforce)"),
    ("space=nb999", "unknown space 'nb999' (valid: autoformer, autoformer_b, autoformer_s, autoformer_small, "
                    "autoformer_t, nader, nb201, ofa_mbv3, ofa_mbv3_small, source, spos, spos_small)"),
    ("evaluator=oracle", "unknown evaluator 'oracle' (valid: proxy, quick, simulated, supernet, table, train)"),
    ("budget.trials=0", "budget.trials must be > 0, got 0"),
    ("budget.trials=-3", "budget.trials must be > 0, got -3"),
    ("+strategy.bogus=1", "strategy 'rea': unknown parameter 'bogus'"),
    ("evaluator.path=/no/such/data.anb", "NB201 table not found at /no/such/data.anb"),
])
def test_bad_input_gives_one_line_error(tmp_path, nas_env, override, message):
    run_dir = tmp_path / "run"
    picks = override.split("=")[0]  # a group choice (strategy=foo), or a key inside one (evaluator.path=...)
    table = [a for a in [*TABLE, "strategy=rea"] if a.split("=")[0] != picks]  # the NB201 table search
    out = run_nas(["search", *table, "runner=local", override, f"hydra.run.dir={run_dir}"], nas_env)
    assert out.returncode == 2
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("nas: error: ") and message in lines[0], out.stderr
    assert not (run_dir / "history.jsonl").exists() and not (run_dir / "summary.json").exists()
