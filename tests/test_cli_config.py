"""`nas search` config handling: space-aware defaults, one-line override errors,
no run dir before the config is valid, the lock before `.hydra/`, budget bounds
and search.log progress. In-process except where a second process is the point."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

import pytest

from conftest import NAS, ROOT
from nas.cli.main import main
from nas.config import available, check_build, check_job, compose, job_overrides
from nas.errors import ConfigError
from nas.search.rundir import RunDir
from nas.search.spec import Component, SearchSpec, space_defaults

NATURAL = {"nader": ("nader", "train"), "source": ("fairnad", "train"), "nb201": ("bananas", "table"),
           **{s: ("evolution", "supernet") for s in ("ofa_mbv3", "ofa_mbv3_small", "spos", "spos_small",
                                                     "autoformer", "autoformer_small", "autoformer_t",
                                                     "autoformer_s", "autoformer_b")}}


def test_every_space_preset_has_natural_defaults():
    assert set(available("space")) == set(NATURAL) == set(available("space_defaults"))


@pytest.mark.parametrize("space", sorted(NATURAL))
def test_a_space_alone_gets_its_natural_strategy_and_evaluator(space):
    cfg = compose([f"space={space}"])
    assert (cfg.strategy.name, cfg.evaluator.name) == NATURAL[space]
    spec = SearchSpec(space=Component(cfg.space.name), strategy=Component(cfg.strategy.name),
                      evaluator=Component(cfg.evaluator.name))
    spec.check_pairing(space)  # the natural pair is a valid one


def test_the_default_job_is_still_nader_on_the_quick_evaluator():
    cfg = compose([])
    assert (cfg.space.name, cfg.strategy.name, cfg.evaluator.name, cfg.evaluator.cells_per_stage) == \
        ("nader", "nader", "train", 2)
    assert space_defaults("nader") == {"strategy": "nader", "evaluator": "quick"}


def test_explicit_choices_replace_the_natural_ones_and_sweeps_pick_per_job():
    cfg = compose(["space=nb201", "strategy=random", "evaluator=train"])
    assert (cfg.strategy.name, cfg.evaluator.name) == ("random", "train")
    jobs = job_overrides(["space=nb201,spos_small", "seed=0,1"], multirun=True)
    assert len(jobs) == 4
    assert [compose(job).strategy.name for job in jobs] == ["bananas", "bananas", "evolution", "evolution"]
    # the ablation preset sweeps strategy x seed from its config; a command-line value replaces a swept one
    jobs = job_overrides(["+experiment=ablation", "seed=3"], multirun=True)
    assert sorted(sorted(job) for job in jobs) == sorted(
        sorted(["+experiment=ablation", f"strategy={s}", "seed=3"]) for s in ("random", "rea", "reinforce", "evolution"))


@pytest.mark.parametrize("args, message", [
    (["space=nb201", "strategy=nader"], "strategy=nader searches space=nader, not the categorical space=nb201: "
                                        "use space=nader, or for space=nb201 use strategy=bananas|"),
    (["strategy=rea"], "or for space=nader use strategy=nader"),
    (["space=source", "strategy=nader"], "use space=nader, or for space=source use strategy=fairnad"),
    (["space=spos_small", "evaluator=table"], "evaluator=table scores space=nb201, not space=spos_small: use "
                                              "space=nb201, or for space=spos_small use evaluator=supernet"),
    (["space=nader", "evaluator=supernet"], "or for space=nader use evaluator=quick|train"),
])
def test_incompatible_pairs_name_the_right_fix(args, message):
    with pytest.raises(ConfigError) as info:
        check_job(args)
    assert message in str(info.value)


@pytest.mark.parametrize("args, message", [
    (["budget.trial=5"], "unknown key 'budget.trial' (valid keys of budget: trials, batch_size, in_flight)"),
    (["+budget.trial=5"], "unknown key 'budget.trial' (valid keys of budget: trials, batch_size, in_flight)"),
    (["++budget.trial=5"], "unknown key 'budget.trial' (valid keys of budget: trials, batch_size, in_flight)"),
    (["+foo=1"], "unknown key 'foo' (valid keys at the top level: "),
    (["space=nb201", "strategy=rea", "strategy.populaton_size=3"], "unknown key 'strategy.populaton_size' (valid keys of "
                                                   "strategy: name, population_size, sample_size, unique"),
    (["+seed=1"], "'seed' is already in the config: write seed=1 (+ adds only keys the config does not have)"),
    (["+runner=local"], "runner already has a choice: write runner=local"),
    (["budget.trials"], "override 'budget.trials' has no value: write budget.trials=VALUE"),
    (["budget=5"], "'budget' is a section, not a value: set its keys (trials, batch_size, in_flight), e.g. budget.trials=5"),
    (["seed.x=1"], "unknown key 'seed.x': 'seed' is a value, not a section"),
    (["strategy.max_params=1e5"], "; size limits live in the evaluator now: evaluator.budget.params=VALUE"),
    (["space=nb201", "seed=abc"], "seed must be an integer, got 'abc'"),
    (["space=nb201", "hydra/launcher=nope"], "Could not find 'hydra/launcher/nope'; "
                                             "Available options in 'hydra/launcher': basic"),
    (["space=nb201", "strategy=rea", "+strategy.bogus=1"], "strategy 'rea': unknown parameter 'bogus' (accepted: max_attempts, "),
    (["space=nb201", "budget.trials=2000000"], "budget.trials=2000000 is above the sanity bound of 1,000,000"),
    (["space=nb201", "budget.batch_size=20000"], "budget.batch_size=20000 is above the sanity bound of 10,000"),
    (["recipe.epochs=100000"], "recipe.epochs=100000 is above the sanity bound of 10,000"),
    (["space=nb201", "strategy=rea", "budget.trials=20000"], "budget.trials=20000 is more than space nb201 has members (15,625) "
                                             "and strategy rea never repeats one: use budget.trials<=15625"),
])
def test_bad_overrides_stop_in_one_line_before_any_file(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["search", *args, "runner=local"])
    assert info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("nas: error: ") and message in err[0], err
    assert list(tmp_path.iterdir()) == []  # no runs/<time>.../.hydra, no search.log


def test_a_failed_start_removes_only_a_run_dir_it_made(tmp_path, monkeypatch, capsys):
    """A runner setting that fails at the start removed the user's own empty `hydra.run.dir` too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    for run_dir in ("mine", "made"):
        with pytest.raises(SystemExit) as info:
            main(["search", "space=nb201", "runner=local", "runner.workers=0", "progress=false",
                  f"hydra.run.dir={run_dir}"])
        assert info.value.code == 2
        assert "runner.workers: expected a positive integer, got 0" in capsys.readouterr().err
    assert (tmp_path / "mine").is_dir() and not (tmp_path / "made").exists()
    logging.getLogger("nas").warning("after a failed start")  # no log file left in the removed dir
    assert not (tmp_path / "made").exists()


CELL = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"
TRAIN = ["data=digits", "recipe=cpu_proxy", "evaluator.channels=8", "evaluator.cells_per_stage=1"]


@pytest.mark.parametrize("args, message", [
    (["search", "space=nb201", "seed=-1"], "seed must be >= 0, got -1"),
    (["search", "space=nb201", "space.channels=0"], "space.channels must be an integer >= 1, got 0"),
    (["search", "space=nb201", "space.channels=-4"], "space.channels must be an integer >= 1, got -4"),
    (["search", "space=nb201", "space.cells_per_stage=0"], "space.cells_per_stage must be an integer >= 1, got 0"),
    (["search", "space=nb201", "space.cells_per_stage=-1"], "space.cells_per_stage must be an integer >= 1, got -1"),
    (["search", "space=nb201", "screen.scorer=foo"], "screen.scorer must be one of predictor, proxy, got 'foo'"),
    (["search", "space=nb201", "progress=maybe"], "progress must be true or false, got 'maybe'"),
    (["search", "space=nb201", "evaluator.simulated_cost_seconds=-1"],
     "evaluator.simulated_cost_seconds must be >= 0, got -1"),
    (["search", "space=nb201", "evaluator=train", *TRAIN, "recipe.train_subset=0"],
     "recipe.train_subset must be an integer >= 1 or null (all images), got 0"),
    (["search", "space=nb201", "evaluator=train", *TRAIN, "recipe.valid_subset=-5"],
     "recipe.valid_subset must be an integer >= 1 or null (all images), got -5"),
    (["train", CELL, *TRAIN, "recipe.train_subset=0"], "recipe.train_subset must be an integer >= 1 or null"),
    (["train", CELL, *TRAIN, "recipe.train_subset=-5"], "recipe.train_subset must be an integer >= 1 or null"),
    (["train", CELL, *TRAIN, "seed=-1"], "seed must be an integer >= 0, got -1"),
    (["train", CELL, *TRAIN, "evaluator.seeds=[1,-2]"], "evaluator.seeds must be a non-empty list of integers >= 0"),
    # checked before "loading torch and Lightning ...", which came first
    (["train-supernet", "space=nb201", "supernet.epochs=0", "out=sn"], "supernet.epochs must be an integer >= 1, got 0"),
])
def test_out_of_range_values_stop_in_one_line_before_any_file(args, message, tmp_path, monkeypatch, capsys):
    """Values of the right type but out of range fail where their settings are checked, not in torch or numpy."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main([*args, *(["runner=local"] if args[0] == "search" else [])])
    assert info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"nas: error: {message}"), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["train", str(ROOT / "tests/data/blocks/residual.txt"), "recipe.epoch=1", "--out", "r.json"],
     "unknown key 'recipe.epoch' (valid keys of recipe: epochs, batch_size, "),
    (["train-supernet", "space=nb201", "supernet.bogus=1", "out=sn"],
     "unknown key 'supernet.bogus' (valid keys of supernet: epochs, batch_size, "),
    (["knowledge", "stats", "knowledge.bogus=1"], "unknown key 'knowledge.bogus' (valid keys of knowledge: "),
])
def test_other_commands_name_an_unknown_key_and_its_valid_ones(args, message, tmp_path, monkeypatch, capsys):
    """Every command's overrides are checked as `nas search`'s are, not left to Hydra's "Could not override"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("nas: error: ") and message in err[0], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["train", "nonexist.txt"], "nonexist.txt: no such file (give a .txt file (space 'nader'), "),
    (["train", "bad/dir.txt"], "bad/dir.txt: is a directory, not a file (give a .txt file"),
    (["train", "bin.txt"], "bin.txt: cannot read (UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff"),
    (["arch", "validate", "bin.txt"], "bin.txt: cannot read (UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff"),
    (["train", CELL, "data=cifar10", "data.root=nodata"], "cifar10 not found at nodata/cifar-10-batches-py/"),
    (["train", CELL, "data=fashion_mnist", "data.root=fakefm"],
     "fakefm/train-images-idx3-ubyte.gz is not a valid gzip file: BadGzipFile: "),
    (["knowledge", "ingest", "/nonexistent"], "/nonexistent: no such file or directory"),
])
def test_missing_or_unreadable_inputs_are_usage_errors(args, message, tmp_path, monkeypatch, capsys):
    """A file named on the command line that is not there, not a file or not text: exit 2, as `nas arch` says it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad" / "dir.txt").mkdir(parents=True)
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00binary")
    (tmp_path / "fakefm").mkdir()
    (tmp_path / "fakefm" / "train-images-idx3-ubyte.gz").write_text("x\n")
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"nas: error: {message}"), err


def test_a_bad_job_stops_a_sweep_before_its_first_job():
    jobs = job_overrides(["space=nb201", "strategy=random,nader"], multirun=True)
    check_job(jobs[0])
    with pytest.raises(ConfigError, match="strategy=nader searches space=nader"):
        check_job(jobs[1])


def test_a_space_with_repeats_allowed_may_exceed_its_size():
    spec, _ = check_job(["space=nb201", "strategy=random", "strategy.unique=false", "budget.trials=16000"])
    check_build(spec)
    with pytest.raises(ConfigError, match="use budget.trials<=15625"):
        check_build(check_job(["space=nb201", "strategy=random", "budget.trials=16000"])[0])


def _env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env["NASFLOW_HOME"] = str(tmp_path / "home")
    return env


@pytest.mark.slow
def test_a_run_dir_in_use_gets_no_hydra_files_and_a_free_one_gets_progress_in_search_log(tmp_path):
    """The second process stops at the lock before Hydra's files; then, free, the run writes
    `.hydra/` and one search.log line per batch (table evaluator, no console output in it)."""
    run_dir = tmp_path / "run"
    args = [*NAS, "search", "space=nb201", "strategy=random", "budget.trials=4", "budget.batch_size=2",
            "runner=local", "progress=false", f"hydra.run.dir={run_dir}"]
    with RunDir(run_dir).lock():
        out = subprocess.run(args, env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 2 and f"{run_dir} is in use by another search (pid {os.getpid()})" in out.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]

    out = subprocess.run(args, env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= {p.name for p in (run_dir / ".hydra").iterdir()}
    assert "budget.trials=4" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    log = [line for line in (run_dir / "search.log").read_text().splitlines() if "[nas.progress]" in line]
    assert [line.split(" - ", 1)[1].split(", best")[0] for line in log] == [
        "random on nb201: 4 trials", "trial 2/4", "trial 4/4"]
    assert "elapsed" in log[-1] and "best -" not in log[-1]
    assert "[nas.progress]" not in out.stderr and ROOT.exists()


def test_ctrl_c_stops_a_search_in_one_line_and_the_same_command_resumes(tmp_path):
    """SIGINT mid-search (runner=local): exit 130, one line with the trials saved and the run dir, no traceback."""
    run_dir = tmp_path / "run"
    args = [*NAS, "search", "space=nb201", "strategy=rea", "evaluator=table", "budget.trials=200",
            "evaluator.simulated_cost_seconds=0.05", "runner=local", "progress=false", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(args, env=_env(tmp_path), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and RunDir(run_dir).saved_trials() < 3:  # saved: not just appended
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    trials = RunDir(run_dir).saved_trials()
    assert 3 <= trials < 200
    assert err.strip().splitlines() == [  # the run dir said first, then the one line
        f"run dir: {run_dir}",
        f"nas: interrupted after {trials} trials; run the same command to resume (run dir: {run_dir})"]
    assert "Traceback" not in out + err
    resumed = subprocess.run(args, env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             check=False)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert len((run_dir / "history.jsonl").read_text().splitlines()) == 200
