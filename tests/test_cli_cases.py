"""The `nas` commands' own logic case by case (issue 52, the library mutation run), in-process: the
usage and one-line errors of each command, `nas search`'s checks, its failed-start cleanup, its
interrupt lines and summary, `nas regress`'s verdict table, `nas serve --limit`, `nas train`'s
arguments, and the warm process's messages, requests and exit statuses. No Prefect server starts."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nas.cli import arch, export, hydra_job, knowledge, regress, serve, supernet, train, ui, warm, warm_server
from nas.cli import compare as compare_cli
from nas.cli import main as M
from nas.cli import search as S
from nas.core.trial import TrialRecord
from nas.errors import ConfigError, EncodingError, InputError, NasError
from nas.search.rundir import RunDir


def exits(fn, *args, code):
    with pytest.raises(SystemExit) as stop:
        fn(*args)
    assert stop.value.code == code


# ---------------------------------------------------------------- nas (main)


def test_fail_is_one_escaped_line_and_status_2(capsys):
    exits(M.fail, "bad \x1b[31m", code=2)
    assert capsys.readouterr().err == "nas: error: bad \\x1b[31m\n"


def test_no_command_is_usage_and_status_2_help_is_0(capsys, monkeypatch):
    monkeypatch.setenv("NASFLOW_PREFECT_SERVER", "temporary")
    exits(M.main, [], code=2)
    assert capsys.readouterr().out.startswith("The `nas` command.")
    exits(M.main, ["--help"], code=0)
    exits(M.main, ["-h"], code=0)
    exits(M.main, ["nope"], code=2)
    assert capsys.readouterr().err == (
        "nas: error: unknown command 'nope' (valid: search, compare, arch, train, train-supernet, knowledge, "
        "export, serve, regress, ui)\n")


def test_exit_status_as_pythons(capsys):
    assert M.exit_status(None) == 0
    assert M.exit_status(0) == 0
    assert M.exit_status(3) == 3
    assert M.exit_status("said") == 1
    assert capsys.readouterr().err == "said\n"


def test_an_unknown_group_option_stops_in_one_line(capsys):
    exits(M.check_group_overrides, ["space=nope"], code=2)
    assert capsys.readouterr().err.startswith("nas: error: ")
    M.check_group_overrides(["space=nb201"])


# ---------------------------------------------------------------- nas search


@pytest.mark.parametrize("arg, key", [("hydra.run.dir=", "hydra.run.dir"), ("+hydra.sweep.dir= ", "hydra.sweep.dir")])
def test_an_empty_output_dir_is_refused(capsys, arg, key):
    exits(S.main, [arg], code=2)
    assert capsys.readouterr().err == (f"nas: error: {key} is empty: give a directory (an empty one would write "
                                       "into the current one)\n")


def test_an_output_dir_that_is_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    exits(S.main, [f"hydra.run.dir={tmp_path / 'f'}"], code=2)
    assert capsys.readouterr().err.startswith(f"nas: error: {tmp_path / 'f'}")


def test_a_bad_job_is_refused_before_hydra(capsys):
    exits(S.main, ["space=nb201", "budget.trials=-1"], code=2)
    assert capsys.readouterr().err.startswith("nas: error: ")


def test_given_run_dirs_already_there_are_kept_sweep_dirs_and_interpolations_not(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "sweep").mkdir()
    argv = [f"hydra.run.dir={tmp_path / 'run'}", f"+hydra.sweep.dir={tmp_path / 'sweep'}",
            f"hydra.run.dir={tmp_path / 'new'}", "hydra.run.dir=runs/${now:%H}", "seed=1"]
    assert S.output_dirs(argv) == {(tmp_path / "run").resolve()}
    assert S.output_dirs([f"+hydra.run.dir={tmp_path / 'run'}"]) == {(tmp_path / "run").resolve()}
    assert S.output_dirs([f"run.dir={tmp_path / 'run'}", "hydra.run.dir=${x}"]) == set()
    assert not (tmp_path / "new").exists()


def test_a_file_in_the_way_of_a_sweep_dir_is_refused(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    exits(S.output_dirs, [f"hydra.sweep.dir={tmp_path / 'f'}"], code=2)
    assert capsys.readouterr().err.startswith(f"nas: error: {tmp_path / 'f'}")
    exits(S.output_dirs, [f"hydra.sweep.dir={tmp_path / 'f'}/${{now:%H}}", "hydra.run.dir= "], code=2)
    assert capsys.readouterr().err == ("nas: error: hydra.run.dir is empty: give a directory (an empty one would "
                                       "write into the current one)\n")


JOB = ["space=nb201", "evaluator=simulated", "budget.trials=2", "progress=false"]


def test_one_job_is_built_once_for_its_run_a_sweep_builds_none():
    checked, built = S.check_jobs([JOB])
    assert built is not None and built.spec.seed == 0 and checked.container["seed"] == 0
    checked, built = S.check_jobs([[*JOB, "seed=3"], [*JOB, "seed=4"]])
    assert built is None and checked.container["seed"] == 3


def test_a_sweep_checks_every_job_not_only_its_first():
    for bad in (1, 2):  # the second job, and the last of three
        jobs = [[*JOB, f"seed={i}"] for i in range(3)]
        jobs[bad] = [*JOB, "budget.trials=-1"]
        with pytest.raises(ConfigError, match="budget.trials"):
            S.check_jobs(jobs)


def test_a_job_reuses_the_checks_build_only_for_its_own_spec():
    built = S.check_jobs([JOB])[1]
    assert S.reused(built, built.spec) is built
    other = S.check_jobs([[*JOB, "seed=5"]])[1].spec
    fresh = S.reused(built, other)
    assert fresh is not built and fresh.spec == other and fresh.spec.seed == 5
    assert S.reused(None, other).spec == other


def test_check_run_dir_of_a_new_dir_makes_it_and_resumes_nothing(tmp_path):
    spec = S.check_jobs([JOB])[1].spec
    assert S.check_run_dir(RunDir(tmp_path / "new"), spec) is None and (tmp_path / "new").is_dir()


def file_logger(path: Path) -> logging.FileHandler:
    handler = logging.FileHandler(path / "search.log", delay=True)
    logging.getLogger("nas-test-cli").addHandler(handler)
    return handler


def test_a_failed_start_removes_the_dir_it_made_and_its_log(tmp_path):
    made = tmp_path / "made"
    made.mkdir()
    (made / ".lock").touch()
    handler = file_logger(made)
    S.discard_failed_start(RunDir(made), set())
    assert not made.exists()
    assert handler not in logging.getLogger("nas-test-cli").handlers


def test_a_failed_start_keeps_a_dir_that_was_there_or_written_to(tmp_path):
    mine, written = tmp_path / "mine", tmp_path / "written"
    mine.mkdir()
    (mine / ".lock").touch()
    written.mkdir()
    (written / "history.jsonl").write_text("")
    handlers = [file_logger(mine), file_logger(written)]
    S.discard_failed_start(RunDir(mine), {mine})
    S.discard_failed_start(RunDir(written), set())
    assert mine.is_dir() and written.is_dir()
    kept = logging.getLogger("nas-test-cli").handlers
    assert all(h in kept for h in handlers)
    for h in handlers:
        logging.getLogger("nas-test-cli").removeHandler(h)


def test_prefects_record_of_a_nas_error_is_dropped():
    def record(exc):
        return logging.LogRecord("x", logging.ERROR, "f", 1, "m", None, (type(exc), exc, None) if exc else None)
    assert S.said_in_one_line(record(NasError("x"))) is False
    assert S.said_in_one_line(record(ValueError("x"))) is True
    assert S.said_in_one_line(record(None)) is True


def test_signals_raise_once_then_are_ignored():
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt) as stop:
            S.interrupt_once(signal.SIGINT, None)
        assert type(stop.value) is KeyboardInterrupt and signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        with pytest.raises(S.Terminated):
            S.terminate_once(signal.SIGTERM, None)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])


def test_interrupted_before_the_search_says_nothing_was_saved(capsys, tmp_path):
    exits(S.interrupted, None, code=130)
    assert capsys.readouterr().err == "nas: interrupted before the search started; nothing was saved\n"
    exits(S.interrupted, tmp_path, True, code=143)
    assert capsys.readouterr().err == "nas: terminated before the search started; nothing was saved\n"


def rec(trial, accuracy, **kw):
    return TrialRecord(trial=trial, key=f"k{trial}", encoding=f"e{trial}", accuracy=accuracy, **kw)


@pytest.mark.parametrize("records, keep, said", [
    (1, 1, "after 1 trial;"), (3, 2, "after 2 trials;"), (2, 0, "after 0 trials;"),
])
def test_interrupted_after_trials_counts_what_resumes(capsys, tmp_path, records, keep, said):
    run = RunDir(tmp_path)
    run.append([rec(i, 1.0) for i in range(records)])
    run.state_path.write_text(json.dumps({"history_lines": keep}))
    exits(S.interrupted, tmp_path, code=130)
    assert capsys.readouterr().err == (f"nas: interrupted {said} run the same command to resume "
                                       f"(run dir: {tmp_path})\n")


SUMMARY = {"trials": 3, "wall_seconds": 1.25, "cache_hits": 1, "spec": {"trials": 5}}


def test_summary_of_a_run_whose_trials_all_failed(capsys, tmp_path):
    S.print_summary(tmp_path, {**SUMMARY, "best": None})
    assert capsys.readouterr().out == f"run dir: {tmp_path}\nbest: none (3 trials, all failed)\n"


def test_summary_of_a_one_line_best_with_ui_and_exhausted(capsys, tmp_path):
    best = {"encoding": "|a~0|", "accuracy": 93.456, "key": "k1", "trial": 1}
    S.print_summary(tmp_path, {**SUMMARY, "best": best, "ui": "http://u", "exhausted": "space done"})
    assert capsys.readouterr().out == (f"run dir: {tmp_path}\nUI: http://u\nended after 3 of 5 trials: space done\n"
                                       "best: 93.46% |a~0| key=k1 (trial 1 of 3, 1.2s, 1 cached)\n")
    S.print_summary(tmp_path, {**SUMMARY, "spec": None, "exhausted": "x", "best": {**best, "encoding": [1, 2]}})
    assert capsys.readouterr().out.splitlines()[1:] == ["ended after 3 of ? trials: x",
                                                        "best: 93.46% [1, 2] key=k1 (trial 1 of 3, 1.2s, 1 cached)"]


def test_summary_of_a_design_names_its_lines_and_the_export(capsys, tmp_path):
    best = {"encoding": "a\nb\nc\n", "accuracy": 50.0, "key": "k", "trial": 0}
    S.print_summary(tmp_path, {**SUMMARY, "best": best})
    assert capsys.readouterr().out.splitlines()[1:] == [
        f"best: 50.00% (3-line design in {tmp_path / 'report.md'}) key=k (trial 0 of 3, 1.2s, 1 cached)",
        f"export it: nas export {tmp_path}"]


def test_llm_line_counts_designs_better_than_the_root(tmp_path):
    RunDir(tmp_path).append([rec(0, 50.0, strategy={"stage": "root"}), rec(1, 60.0), rec(2, 50.0), rec(3, None)])
    summary = {"design": {"proposals": 4, "valid": 3}, "llm": {"total": {"calls": 5, "tokens": 700,
                                                                          "latency_s": 12.4, "retries": 1}},
               "tree": {"nodes": [{"id": 0, "score": 50.0}, {"id": 1, "parent": 0, "score": 60.0}]}}
    assert S.llm_line(tmp_path, summary) == ("LLM: 4 designs proposed, 3 valid, 2 trained, 1 better than the root "
                                             "(50.00%), 1 better than their parent; 5 calls, 700 tokens, 12 s, "
                                             "1 retries")


def test_llm_line_says_plainly_when_nothing_beat_the_root(tmp_path):
    RunDir(tmp_path).append([rec(0, 50.0, strategy={"stage": "root"}), rec(1, 50.0)])
    line = S.llm_line(tmp_path, {"design": {}})
    assert line.splitlines() == [
        "LLM: 1 designs proposed, ? valid, 1 trained, 0 better than the root (50.00%); 0 calls, 0 tokens, 0 s, "
        "0 retries",
        "no design beat the root (50.00%): the best is the unmodified base design. A stronger model designs "
        "better: llm=openai llm.base_url=URL llm.model=NAME (any OpenAI-compatible endpoint)"]


def test_llm_line_without_a_root(tmp_path):
    RunDir(tmp_path).append([rec(0, 50.0), rec(1, 40.0)])
    assert S.llm_line(tmp_path, {"design": {"proposals": 2}}) == (
        "LLM: 2 designs proposed, ? valid, 2 trained, 0 better than the root; 0 calls, 0 tokens, 0 s, 0 retries")


@pytest.mark.parametrize("tree, beat", [
    (None, None), ({"nodes": 1}, None), ([], None),
    ({"nodes": []}, 0),
    ({"nodes": [{"id": 0, "score": 1.0}, {"id": 1, "parent": 0, "score": 1.0}]}, 0),     # equal: not above
    ({"nodes": [{"id": 0, "score": 1.0}, {"id": 1, "parent": 0, "score": 1.5}]}, 1),
    ({"nodes": [{"id": 0, "score": 1}, {"id": 1, "parent": 0, "score": 2}, {"id": 2, "parent": 1, "score": 3},
                {"id": 3, "parent": 1, "score": None}, {"id": 4, "parent": 9, "score": 5}, "x"]}, 2),
    ({"nodes": [{"id": 0, "score": None}, {"id": 1, "parent": 0, "score": 2}]}, 0),
    ({"nodes": [{"id": 0, "score": 3}, {"id": 1, "parent": None, "score": 5}]}, 0),
])
def test_beat_parent(tree, beat):
    assert S.beat_parent(tree) == beat


# ---------------------------------------------------------------- hydra_job


@pytest.mark.parametrize("mode, verbose, plain", [(None, False, True), (None, True, False), ("RUN", False, False),
                                                  ("MULTIRUN", True, False)])
def test_plain_run(mode, verbose, plain):
    assert hydra_job.plain_run(OmegaConf.create({"hydra": {"mode": mode, "verbose": verbose}})) is plain


# ---------------------------------------------------------------- nas regress


def row(metric, status, value=1.0, baseline=1.0):
    return {"metric": metric, "status": status, "value": value, "baseline": baseline}


def report(failures=(), updated=False, rows=()):
    return {"metrics": list(rows), "out": "/r", "counts": {"ok": 1, "regressed": len(failures)},
            "failures": list(failures), "baseline_updated": updated, "suite": "quick", "baseline": "/b.json"}


def test_verdict_table_and_pass():
    rows = [row("a", "regressed", 1.5, 2.0), row("b", "missing", None, 3.0), row("c", "improved"),
            row("d", "new", 1.0, None), row("e", "ok"), row("f", "info"), row("g", "skipped"), row("h", "odd")]
    out, err, code = regress.verdict_lines(report(rows=rows))
    assert out[0] == f"   {'metric':<36} {'value':>12} {'baseline':>12}  verdict"
    assert out[1] == f"!! {'a':<36} {'1.5':>12} {'2':>12}  REGRESSED"
    assert out[2] == f"!! {'b':<36} {'-':>12} {'3':>12}  MISSING"
    assert out[3] == f"++ {'c':<36} {'1':>12} {'1':>12}  improved"
    assert out[4] == f"+  {'d':<36} {'1':>12} {'-':>12}  new"
    assert [line[:3] + line.rsplit("  ", 1)[1] for line in out[5:9]] == [
        "   ok", "   info (no tolerance)", "   skipped", "   odd"]
    assert out[9] == "wrote /r/report.json, /r/report.md, /r/ratios.png"
    assert out[10] == "PASS: suite 'quick': nothing regressed (1 ok, 0 regressed)"
    assert (err, code) == ([], 0)


def test_verdict_fail_and_baseline_written():
    out, err, code = regress.verdict_lines(report(failures=["x down", "y gone"]))
    assert out[-1] == "FAIL: suite 'quick': 2 problem(s) (1 ok, 2 regressed; exit 1)"
    assert err == ["nas regress: x down", "nas regress: y gone",
                   "nas regress: suite 'quick' FAILED: 2 problem(s) (report: /r/report.md)"]
    assert code == 1
    out, err, code = regress.verdict_lines(report(failures=["x"], updated=True))
    assert out[-1] == "PASS: suite 'quick': baseline written: /b.json (1 ok, 1 regressed)"
    assert (err, code) == ([], 0)


def test_regress_refuses_a_non_override(capsys):
    exits(regress.main, ["llm=openai", "oops"], code=2)
    assert capsys.readouterr().err == "nas: error: not a config override (KEY=VALUE): oops\n"


def test_regress_unknown_suite_is_one_line(capsys):
    exits(regress.main, ["--suite", "nope", "--no-progress"], code=2)
    assert capsys.readouterr().err.startswith("nas: error: ")


# ---------------------------------------------------------------- nas serve


@pytest.mark.parametrize("text, limit", [("none", None), ("1", 1), ("2", 2), ("10", 10)])
def test_serve_limit(text, limit):
    assert serve._limit(text) == limit


@pytest.mark.parametrize("text", ["0", "-1", "x", "1.5", "None"])
def test_serve_limit_refused(text):
    import argparse
    with pytest.raises(argparse.ArgumentTypeError) as err:
        serve._limit(text)
    assert str(err.value) == f"must be an integer >= 1 or 'none', got {text!r}"


def test_serve_defaults():
    args = serve._parser().parse_args([])
    assert (args.limit, args.list, args.file, args.overrides) == (2, False, None, [])


def test_serve_list_needs_no_server(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "WARNING")
    path = tmp_path / "prefect.yaml"
    path.write_text("deployments:\n- name: b\n  entrypoint: flows/supernet.py:train_supernet_flow\n")
    serve.main(["--file", str(path), "--list", "--limit", "3"])
    assert capsys.readouterr().out.splitlines()[-1] == "limit: 3 flow runs at once"


def test_serve_bad_file_is_one_line(capsys, tmp_path):
    exits(serve.main, ["--file", str(tmp_path / "none.yaml")], code=2)
    assert capsys.readouterr().err == f"nas: error: {tmp_path / 'none.yaml'} not found\n"


# ---------------------------------------------------------------- nas train


def test_train_usage(capsys):
    exits(train.main, [], code=2)
    assert capsys.readouterr().out.endswith(train.USAGE + "\n")
    exits(train.main, ["-h"], code=0)
    exits(train.main, ["x.py", "--out"], code=2)
    assert capsys.readouterr().err == "nas: error: --out needs a path\n"


@pytest.mark.parametrize("seed, ok", [(0, True), (1, True), (-1, False)])
def test_train_seed_at_zero(seed, ok):
    if ok:
        params, got = train.compose([f"seed={seed}"])
        assert got == seed and params["name"] == "train"
    else:
        with pytest.raises(ConfigError) as err:
            train.compose([f"seed={seed}"])
        assert str(err.value) == "seed must be an integer >= 0, got -1"


def test_train_seed_must_be_an_int():
    with pytest.raises(ConfigError, match="^seed must be an integer >= 0, got 1.5$"):
        train.compose(["seed=1.5"])


HINT = "give a .txt file (space 'nader'), a .py file (space 'source') or an architecture string (space 'nb201')"


def test_load_arch_refusals(tmp_path):
    with pytest.raises(InputError) as err:
        train.load_arch(str(tmp_path))
    assert str(err.value) == f"{tmp_path}: is a directory, not a file ({HINT})"
    (tmp_path / "a.xyz").write_text("x")
    with pytest.raises(EncodingError) as err:
        train.load_arch(str(tmp_path / "a.xyz"))
    assert str(err.value) == f"{tmp_path / 'a.xyz'}: no space reads '.xyz' files ({HINT})"
    with pytest.raises(InputError) as err:
        train.load_arch(str(tmp_path / "none.txt"))
    assert str(err.value) == f"{tmp_path / 'none.txt'}: no such file ({HINT})"
    with pytest.raises(InputError) as err:
        train.load_arch("|bad~0|")
    assert str(err.value).startswith("|bad~0|: no such file, nor an architecture string (nb201: ")
    assert str(err.value).endswith(f") ({HINT})")


def test_load_arch_reads_a_cell_string():
    space, a = train.load_arch("|nor_conv_3x3~0|+|nor_conv_3x3~0|skip_connect~1|+|none~0|none~1|none~2|")
    assert (space.name, a.space) == ("nb201", "nb201")


def cell():
    return train.load_arch("|nor_conv_3x3~0|+|nor_conv_3x3~0|skip_connect~1|+|none~0|none~1|none~2|")[1]


def test_train_result_lines():
    from nas.core.trial import SELF_REPORTED, EvalResult
    a = cell()
    ok = EvalResult(90.0, {"valid_accuracy": 90.0, "test_accuracy": 89.125, "epochs": 3.0}, 100, 2000, 1.25)
    assert train.result_line(a, ok) == (f"nb201 {a.key()}: ok; valid 90.00%, test 89.12%, 100 params, 2000 FLOPs, "
                                        "3 epochs, 1.2 s")
    cut = EvalResult(None, {"valid_accuracy": 50.0, "test_accuracy": 40.0, "self_reported": True}, 1, 2, 0.0,
                     error="seed 2 \x1b")
    assert train.result_line(a, cut) == (
        f"nb201 {a.key()}: failed: seed 2 \\x1b ({SELF_REPORTED}: the model could not be exported as a graph, so it "
        "trained inside the sandbox and reported these numbers itself); valid 50.00%, test 40.00% (mean of the "
        "seeds that finished), 1 params, 2 FLOPs, 0 epochs, 0.0 s")
    assert train.result_line(a, EvalResult.failure("boom")) == (
        f"nb201 {a.key()}: failed: boom; no accuracy measured, None params, None FLOPs, 0 epochs, 0.0 s")


def manifest(**changes):
    base = {"trial": 3, "accuracy": 91.234, "params": 1234567, "out": "/o", "evaluator": "train",
            "input_shape": [2, 3, 32, 32], "metrics": {}, "weights": {"origin": "retrained"},
            "source_check": {"passed": True},
            "graph": {"format": "onnx", "file": "model.onnx", "batch": "dynamic",
                      "check": {"max_abs_diff": 1.5e-6, "method": "onnxruntime", "passed": True}}}
    return base | changes


def test_export_line_of_a_good_onnx_export():
    assert export.export_lines(manifest()) == (
        "exported trial 3 (91.23%, 1,234,567 params, weights: retrained) to /o: model.py, model.pt, model.onnx "
        "(any batch size; onnxruntime: max abs diff 1.50e-06, ok)", None)


def test_export_line_of_a_fixed_batch_torchscript_with_a_mismatch():
    graph = {"format": "torchscript", "file": "model.torchscript.pt", "batch": "fixed", "onnx_error": "bad\x1b",
             "check": {"max_abs_diff": None, "method": "torch", "passed": False}}
    line, error = export.export_lines(manifest(graph=graph, metrics={"self_reported": True},
                                               weights={"origin": "initial", "self_reported": True},
                                               evaluator="table", source_check={"passed": False}))
    from nas.core.trial import SELF_REPORTED
    assert line == (f"exported trial 3 (table accuracy 91.23% {SELF_REPORTED} (not these weights: untrained), "
                    f"1,234,567 params, weights: initial, {SELF_REPORTED}) to /o: model.py, model.pt, "
                    "model.torchscript.pt (batch fixed at 2 by the network's code; torch: not run, MISMATCH); "
                    "ONNX failed: bad\\x1b")
    assert error == "nas: error: the graph and source output check failed (files kept in /o; see export.json)"


def test_export_line_without_a_graph():
    line, error = export.export_lines(manifest(graph={"format": None, "check": None}, source_check=None,
                                               weights={"origin": "initial"}))
    assert line == ("exported trial 3 (search accuracy 91.23% (not these weights: untrained), 1,234,567 params, "
                    "weights: initial) to /o: model.py, model.pt, no graph (ONNX and TorchScript export failed; "
                    "see export.json)")
    assert error == "nas: error: no ONNX or TorchScript graph (files kept in /o; see export.json)"
    graph = {"format": "onnx", "file": "m.onnx", "check": {"max_abs_diff": 0.0, "method": "m", "passed": True}}
    line, error = export.export_lines(manifest(graph=graph, source_check={"passed": False}))
    assert line.endswith("model.py, model.pt, m.onnx (m: max abs diff 0.00e+00, ok)")
    assert error == "nas: error: the source output check failed (files kept in /o; see export.json)"


# ---------------------------------------------------------------- nas arch, knowledge, supernet, export, compare, ui


def test_arch_usage_and_unknown_command(capsys):
    exits(arch.main, [], code=2)
    assert capsys.readouterr().err == "nas: error: unknown arch command (valid: validate, show, draw)\n"
    exits(arch.main, ["nope"], code=2)
    assert capsys.readouterr().err == "nas: error: unknown arch command 'nope' (valid: validate, show, draw)\n"
    exits(arch.main, ["--help"], code=0)
    assert capsys.readouterr().out.startswith("usage: nas arch validate FILE... | {show,draw} FILE")


def test_arch_draw_refuses_model_source(capsys, tmp_path):
    exits(arch.main, ["draw", str(tmp_path / "m.py"), "-o", str(tmp_path / "o.png")], code=2)
    assert capsys.readouterr().err == f"nas: error: {tmp_path / 'm.py'}: drawing needs a block file, not model source\n"


@pytest.mark.parametrize("flag", ["--max-params", "--max-flops"])
def test_arch_budget_refuses_a_negative_one(flag):
    args = arch._parser("show").parse_args(["f.txt", flag, "-1"])
    with pytest.raises(NasError) as err:
        arch._budget(args)
    assert str(err.value) == f"{flag} must be a positive number, got -1"


def test_arch_budget_zero_is_nb201s_limit():
    args = arch._parser("show").parse_args(["f.txt", "--max-params", "0", "--max-flops", "0"])
    default = arch._budget(arch._parser("show").parse_args(["f.txt"]))
    assert arch._budget(args) == default and default.params == 1.5e6
    mine = arch._budget(arch._parser("show").parse_args(["f.txt", "--max-params", "2e6"]))
    assert (mine.params, mine.flops) == (2e6, default.flops)


def test_arch_parsers_per_command():
    v = arch._parser("validate").parse_args(["a", "b"])
    assert v.files == [Path("a"), Path("b")] and v.parent is None and (v.depth, v.input_size) == (5, 32)
    d = arch._parser("draw").parse_args(["a", "-o", "x.png"])
    assert d.out == Path("x.png") and not hasattr(d, "json")
    assert arch._parser("show").parse_args(["a", "--json"]).json is True


def test_knowledge_usage_and_bad_k(capsys):
    exits(knowledge.main, [], code=2)
    exits(knowledge.main, ["--help"], code=0)
    assert capsys.readouterr().out.startswith("`nas knowledge`")
    exits(knowledge.main, ["search", "q", "-k", "0"], code=2)
    assert capsys.readouterr().err == "nas: error: -k must be > 0, got 0\n"


def test_supernet_usage_and_bad_override(capsys):
    exits(supernet.main, ["-h"], code=0)
    assert capsys.readouterr().out.endswith(supernet.USAGE + "\n")
    exits(supernet.main, ["space=nope"], code=2)
    assert capsys.readouterr().err.startswith("nas: error: ")


def test_export_of_no_run_dir_is_one_line(capsys, tmp_path):
    exits(export.main, [str(tmp_path / "none")], code=2)
    assert capsys.readouterr().err.startswith("nas: error: ")


def test_compare_of_no_run_dir_is_one_line(capsys, tmp_path):
    exits(compare_cli.main, [str(tmp_path / "none")], code=2)
    assert capsys.readouterr().err.startswith("nas: error: ")


def test_ui_names_the_configured_server(capsys):
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings
    with temporary_settings(updates={PREFECT_API_URL: "http://h:1/api", PREFECT_UI_URL: None}):
        ui.main([])
    assert capsys.readouterr().out == "Prefect UI: http://h:1 (the server PREFECT_API_URL names)\n"


def test_ui_on_temporary_servers_and_no_local_one(capsys, monkeypatch, tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    with temporary_settings(updates={PREFECT_API_URL: None}):
        monkeypatch.setenv("NASFLOW_PREFECT_SERVER", "temporary")
        exits(ui.main, [], code=2)
        assert capsys.readouterr().err.startswith("nas: error: NASFLOW_PREFECT_SERVER=temporary: each command ")
        monkeypatch.setenv("NASFLOW_PREFECT_SERVER", "local")
        monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
        exits(ui.main, ["--no-start"], code=1)
        assert capsys.readouterr().out == "no local Prefect server runs for this NASFLOW_HOME; `nas ui` starts one\n"


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/api/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("argv, state, minutes", [([], {"idle_minutes": 5}, "5"), (["--no-start"], {}, "30")])
def test_ui_names_the_running_local_server(capsys, monkeypatch, tmp_path, argv, state, minutes):
    from prefect.settings import PREFECT_API_URL, temporary_settings
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/api"
    (tmp_path / "local-server.json").write_text(json.dumps({"url": url, **state}))
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.setenv("NASFLOW_PREFECT_SERVER", "local")
    monkeypatch.delenv("NASFLOW_SERVER_IDLE_MINUTES", raising=False)
    try:
        with temporary_settings(updates={PREFECT_API_URL: None}):
            ui.main(argv)
    finally:
        server.shutdown()
        server.server_close()
    assert capsys.readouterr().out == (f"Prefect UI: http://127.0.0.1:{server.server_port} (the local server nas "
                                       f"commands share; it stops after {minutes} idle minutes)\n")


# ---------------------------------------------------------------- the warm process


@pytest.mark.parametrize("argv, env, on", [
    (["search"], {}, True),
    (["search", "x=1"], {"NASFLOW_WARM": "1", "NASFLOW_PREFECT_SERVER": " Local "}, True),
    (["search"], {"NASFLOW_WARM": " 0 "}, False),
    (["search"], {"NASFLOW_PREFECT_SERVER": "temporary"}, False),
    (["train"], {}, False),
    ([], {}, False),
])
def test_warm_serves_only_search_in_local_mode(argv, env, on):
    assert warm.enabled(argv, env) is on


def test_warm_address_by_home_and_fingerprint():
    a = warm.address(Path("/h"), "p")
    assert a.startswith(b"\0nasflow-warm-") and len(a) == len(b"\0nasflow-warm-") + 40
    assert a == warm.address(Path("/h"), "p") != warm.address(Path("/h"), "q") != warm.address(Path("/g"), "p")


def test_fingerprint_ignores_shell_state_only(tmp_path):
    (tmp_path / "nas" / "__pycache__").mkdir(parents=True)
    (tmp_path / "nas" / "a.py").write_text("x")
    (tmp_path / "nas" / "__pycache__" / "a.pyc").write_text("x")
    stamp = [s for s in warm.code_stamp(tmp_path) if s[0].startswith(str(tmp_path))]
    assert stamp == [(str(tmp_path / "nas" / "a.py"), os.stat(tmp_path / "nas" / "a.py").st_mtime_ns, 1)]
    base = warm.fingerprint({"A": "1", "PWD": "/x"}, tmp_path)
    assert warm.fingerprint({"A": "1", "PWD": "/y", "COLUMNS": "80"}, tmp_path) == base
    assert warm.fingerprint({"A": "2", "PWD": "/x"}, tmp_path) != base
    (tmp_path / "nas" / "a.py").write_text("xy")
    assert warm.fingerprint({"A": "1", "PWD": "/x"}, tmp_path) != base


def test_messages_round_trip_with_descriptors():
    a, b = socket.socketpair()
    with a, b:
        r, w = os.pipe()
        warm.send_message(a, {"x": [1, "é"]}, fds=[r])
        got: list[int] = []
        assert warm.read_message(b, got) == {"x": [1, "é"]}
        assert len(got) == 1
        warm.close_fds([*got, r, w])
        warm.send_message(a, {"big": "y" * 70000})
        assert warm.read_message(b) == {"big": "y" * 70000}
        assert warm.peer_uid(a) == os.getuid()


def test_messages_over_the_limit_or_cut_are_refused():
    assert warm.MAX_REQUEST == 1 << 20  # 1 MiB: a request is an environment of a few kB
    a, b = socket.socketpair()
    with a, b:
        a.sendall((warm.MAX_REQUEST + 1).to_bytes(4, "big"))
        with pytest.raises(ValueError, match="^a message of 1048577 bytes, over 1048576$"):
            warm.read_message(b)
        a.sendall((warm.MAX_REQUEST).to_bytes(4, "big") + b"{}")
        a.close()
        with pytest.raises(ValueError, match="^the connection closed mid-message$"):
            warm.read_message(b)


@pytest.mark.parametrize("done, code", [({"exit": 0}, 0), ({"exit": 3}, 3), ({"exit": 255}, 255)])
def test_warm_status_is_the_childs(done, code):
    assert warm._status(done) == code


@pytest.mark.parametrize("done", [None, {"exit": 256}, {"exit": -1}, {"exit": True}, {"exit": 1, "x": 2},
                                  {"signal": 0}, {"signal": signal.NSIG}, {"signal": "9"}, [0]])
def test_warm_status_without_one_is_1_with_a_line(capsys, done):
    assert warm._status(done) == 1
    assert capsys.readouterr().err.startswith("nas: error: the warm process running this command ended without ")


def test_warm_status_of_a_signal_that_goes_on():
    saved = signal.getsignal(signal.SIGWINCH)
    try:
        assert warm._status({"signal": int(signal.SIGWINCH)}) == 128 + signal.SIGWINCH  # its default: ignored
    finally:
        signal.signal(signal.SIGWINCH, saved)


def test_warm_run_without_a_warm_process_is_none(tmp_path):
    assert warm.run(["search"], {"NASFLOW_HOME": str(tmp_path)}, tmp_path) is None


def test_forward_to_a_gone_child_is_quiet():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    warm.forward(pid, signal.SIGTERM)


def request(**changes):
    base = {"argv": ["search"], "argv0": "nas", "cwd": "/", "env": {"A": "b"}, "umask": 0o022,
            "stdio": [{"encoding": "utf-8", "errors": "strict", "line_buffering": False}] * 3}
    return base | changes


def test_a_good_request_is_taken():
    assert warm_server.parse_request(request()) == request()
    assert warm_server.parse_request(request(umask=0)) == request(umask=0)
    assert warm_server.parse_request(request(umask=0o777))["umask"] == 0o777


@pytest.mark.parametrize("message, error", [
    ([], "a request has the keys ['argv', 'argv0', 'cwd', 'env', 'stdio', 'umask']"),
    ({k: v for k, v in request().items() if k != "cwd"}, "a request has the keys"),
    (request(x=1), "a request has the keys"),
    (request(argv="search"), "request field 'argv' is not a list"),
    (request(umask=True), "request field 'umask' is not a int"),
    (request(argv=["a", 1]), "request field 'argv' holds a non-string"),
    (request(env={"A": 1}), "request field 'env' holds a non-string"),
    (request(env={1: "a"}), "request field 'env' holds a non-string"),
    (request(umask=-1), "request field 'umask' is out of 0..0o777"),
    (request(umask=0o1000), "request field 'umask' is out of 0..0o777"),
    (request(stdio=[]), "request field 'stdio' is not three stream descriptions"),
    (request(stdio=[{"encoding": "utf-8", "errors": "strict", "line_buffering": 0}] * 3), "request field 'stdio'"),
    (request(stdio=[{"encoding": 1, "errors": "strict", "line_buffering": True}] * 3), "request field 'stdio'"),
    (request(stdio=[{"encoding": "u", "errors": None, "line_buffering": True}] * 3), "request field 'stdio'"),
    (request(stdio=[{"encoding": "u", "errors": "s"}] * 3), "request field 'stdio'"),
    (request(stdio=["x"] * 3), "request field 'stdio'"),
])
def test_a_bad_request_is_refused_by_name(message, error):
    with pytest.raises(ValueError) as err:
        warm_server.parse_request(message)
    assert str(err.value).startswith(error)


@pytest.mark.parametrize("env, seconds", [({}, 1800.0), ({"NASFLOW_SERVER_IDLE_MINUTES": "2"}, 120.0),
                                          ({"NASFLOW_SERVER_IDLE_MINUTES": "0"}, 6.0),
                                          ({"NASFLOW_SERVER_IDLE_MINUTES": "0.2"}, 12.0),
                                          ({"NASFLOW_SERVER_IDLE_MINUTES": "x"}, 1800.0),
                                          ({"NASFLOW_SERVER_IDLE_MINUTES": "nan"}, 1800.0)])
def test_warm_idle_seconds(env, seconds):
    assert warm_server.idle_seconds(env) == pytest.approx(seconds, abs=1e-9)


def test_warm_log_line_is_escaped_and_scrubbed(capsys):
    warm_server._log("a\nb é")
    err = capsys.readouterr().err
    assert err.endswith(" warm: a\\nb \\xe9\n")


def test_reap_with_no_children_returns():
    warm_server._reap({}, set())


def test_reap_sends_each_childs_exit_or_signal():
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    exited = os.fork()
    if exited == 0:
        os._exit(7)
    killed = os.fork()
    if killed == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitid(os.P_PID, exited, os.WEXITED | os.WNOWAIT)
    os.waitid(os.P_PID, killed, os.WEXITED | os.WNOWAIT)
    children = {exited: a, killed: c}
    orphaned = {killed}
    warm_server._reap(children, orphaned)
    assert children == {} and orphaned == set()
    assert warm.read_message(b) == {"exit": 7}
    assert warm.read_message(d) == {"signal": signal.SIGKILL}
    b.close()
    d.close()



# ---------------------------------------------------------------- the warm process's conversation, scripted


def devnull_streams(monkeypatch):
    for name in warm.STDIO:
        monkeypatch.setattr(sys, name, open(os.devnull, "r" if name == "stdin" else "w"))  # noqa: SIM115


@pytest.mark.parametrize("replies, code", [
    ([{"pid": 1}, {"exit": 5}], 5),
    ([{"pid": "1"}], None),
    ([{"pid": 1, "x": 2}], None),
    ([[1]], None),
])
def test_warm_run_against_a_scripted_warm_process(tmp_path, monkeypatch, replies, code):
    env = {"NASFLOW_HOME": str(tmp_path)}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(warm.address(tmp_path, warm.fingerprint(env, warm.project_root())))
    listener.listen(1)
    seen: dict = {}

    def serve_one():
        conn, _ = listener.accept()
        with conn:
            fds: list[int] = []
            seen["request"] = warm_server.parse_request(warm.read_message(conn, fds))
            seen["fds"] = len(fds)
            warm.close_fds(fds)
            for reply in replies:
                warm.send_message(conn, reply)
            conn.recv(1)  # held until the caller lets go, as the warm process holds it

    thread = threading.Thread(target=serve_one)
    thread.start()
    devnull_streams(monkeypatch)
    before = signal.getsignal(signal.SIGINT)
    try:
        got = warm.run(["search", "x=1"], env, tmp_path)
    finally:
        thread.join(5)
        listener.close()
    assert got == code, seen
    assert signal.getsignal(signal.SIGINT) == before
    assert (seen["request"]["argv"], seen["request"]["env"], seen["fds"]) == (["search", "x=1"], env, 3)
    assert seen["request"]["cwd"] == os.getcwd() and seen["request"]["argv0"] == sys.argv[0]


def test_warm_run_with_a_stream_that_is_gone_is_none(tmp_path, monkeypatch):
    devnull_streams(monkeypatch)
    monkeypatch.setattr(sys, "stdout", None)
    assert warm.run(["search"], {}, tmp_path) is None


def connected(prefix: bytes, tmp_path: Path) -> tuple[socket.socket, socket.socket]:
    """A listening abstract Unix socket named for the test, and a client connected to it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(b"\0" + prefix + str(tmp_path).encode()[-40:])
    listener.listen(1)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(listener.getsockname())
    return listener, client


@pytest.mark.parametrize("send, refused", [
    (lambda s: warm.send_message(s, request()), "refused a request: 0 descriptors, not 3"),
    (lambda s: warm.send_message(s, request(), fds=[0, 1, 2]),
     "refused a request: stale: the code or the environment changed"),
    (lambda s: warm.send_message(s, {"x": 1}, fds=[0, 1, 2]), "refused a request: a request has the keys"),
])
def test_warm_process_refuses_a_request_without_forking(capsys, tmp_path, send, refused):
    listener, client = connected(b"nasflow-test-", tmp_path)
    with listener, client:
        send(client)
        children: dict = {}
        assert warm_server._accept(listener, children, "print", tmp_path, []) is False
        assert children == {}
        assert client.recv(1) == b""  # closed on it
    assert refused in capsys.readouterr().err


# ---------------------------------------------------------------- nas arch's pieces on a block file

BLOCKS = Path(__file__).resolve().parent / "data" / "blocks"


@pytest.mark.parametrize("argv, depths, size, classes", [
    ([], (5, 5, 5), 32, 10),
    (["--depth", "2", "--input-size", "16", "--num-classes", "120"], (2, 2, 2), 16, 120),
    (["--skeleton", "imagenet", "--input-size", "64"], (2, 3, 5, 2), 64, 10),
])
def test_arch_skeleton_per_choice(argv, depths, size, classes):
    skeleton = arch._skeleton(arch._parser("show").parse_args(["f.txt", *argv]))
    assert (skeleton.depths, skeleton.input_size, skeleton.num_classes) == (depths, size, classes)


def test_block_errors_of_a_valid_file_at_a_searched_or_fixed_width():
    text = (BLOCKS / "residual.txt").read_text()
    assert arch.block_errors(text, "r.txt", arch._parser("validate").parse_args(["r.txt"])) == []
    assert arch.block_errors(text, "r.txt", arch._parser("validate").parse_args(["r.txt", "--width", "8"])) == []


def test_block_errors_name_the_file_once():
    text = (BLOCKS / "residual.txt").read_text()
    tight = arch.block_errors(text, "r.txt", arch._parser("validate").parse_args(["r.txt", "--max-params", "10"]))
    assert len(tight) == 1 and tight[0].startswith("r.txt: ") and not tight[0].startswith("r.txt: r.txt")
    assert arch.block_errors("not a block file", "x.txt", arch._parser("validate").parse_args(["x.txt"]))[0] \
        .startswith("x.txt")


def test_validate_a_valid_block_file_says_so(capsys):
    exits(arch.main, ["validate", str(BLOCKS / "residual.txt")], code=0)
    assert capsys.readouterr().out == f"{BLOCKS / 'residual.txt'}: valid\n"


# ---------------------------------------------------------------- nas knowledge's tree and search checks


def knowledge_tree():
    from nas.knowledge.config import KnowledgeConfig
    return KnowledgeConfig.from_dict({}).load_tree()


def test_knowledge_tree_prints_each_target_then_its_size(capsys):
    tree = knowledge_tree()
    n_main, n_sub = tree.size()
    knowledge.main(["tree"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{tree.targets[0]}:" and lines[-1] == f"{n_main} main categories, {n_sub} sub-categories"
    assert [line for line in lines if line.endswith(":") and not line.startswith(" ")] == [f"{t}:" for t in tree.targets]
    knowledge.main(["tree", "--target", "efficiency"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "efficiency:" and lines[1].startswith("  ")
    assert [line for line in lines if not line.startswith(" ")] == ["efficiency:", lines[-1]]
    knowledge.main(["tree", "--json"])
    assert json.loads(capsys.readouterr().out) == tree.to_dict()


def test_knowledge_search_refuses_an_unknown_main_category(capsys):
    exits(knowledge.main, ["search", "q", "--main-category", "nope"], code=2)
    assert capsys.readouterr().err.startswith(
        f"nas: error: unknown main category 'nope' (valid: {', '.join(knowledge_tree().mains())})")


def test_code_stamp_names_a_site_packages_folder_that_is_gone(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [str(tmp_path / "gone" / "site-packages"), str(tmp_path)])
    assert warm.code_stamp(tmp_path) == [(str(tmp_path / "gone" / "site-packages"), -1, 0)]


def test_a_warm_child_draws_its_own_random_numbers():
    import random

    import numpy
    random.seed(1)
    numpy.random.seed(1)
    before = random.getstate(), numpy.random.get_state()[1].tolist()
    warm_server._reseed()
    assert random.getstate() != before[0] and numpy.random.get_state()[1].tolist() != before[1]


def test_knowledge_search_takes_one_hit(capsys):
    exits(knowledge.main, ["search", "q", "-k", "1", "--main-category", "nope"], code=2)
    assert capsys.readouterr().err.startswith("nas: error: unknown main category 'nope' (valid: ")


def test_train_out_is_checked_before_anything_else(capsys, tmp_path):
    out = tmp_path / "no" / "dir" / "r.json"
    (tmp_path / "no").write_text("a file in the way")
    exits(train.main, ["x.txt", "--out", str(out), "seed=1"], code=2)
    err = capsys.readouterr().err
    assert err.startswith("nas: error: ") and str(tmp_path / "no") in err and "no such file" not in err
    exits(train.main, ["x.txt", "--out", str(tmp_path / "r.json"), "seed=1"], code=2)  # taken out; then ARCH
    assert capsys.readouterr().err == f"nas: error: x.txt: no such file ({HINT})\n"


def test_warm_process_forks_a_child_per_good_request_and_reports_its_exit(tmp_path):
    env = {"A": "b"}
    parent = os.getpid()
    listener, client = connected(b"nasflow-test-fork-", tmp_path)
    with listener, client:
        warm.send_message(client, request(env=env, cwd=str(tmp_path)), fds=[0, 1, 2])
        children: dict = {}
        child = warm_server._accept(listener, children, warm.fingerprint(env, tmp_path), tmp_path, [])
        if os.getpid() != parent:  # the child, now its caller's process: it ends here
            os._exit(7 if child is True and os.getcwd() == str(tmp_path) and os.environ == env else 9)
        assert child is False
        (pid,) = children
        assert warm.read_message(client) == {"pid": pid}
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        warm_server._reap(children, set())
        assert warm.read_message(client) == {"exit": 7}


@pytest.fixture
def own_logging():
    """Hydra's job logging (dictConfig) replaces handlers: put every logger's back as it was."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    saved = {lg: (list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in loggers}
    yield
    for lg in [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]:
        handlers, level, propagate, disabled = saved.get(lg, ([], logging.NOTSET, True, False))
        for h in lg.handlers:
            if h not in handlers:
                h.close()
        lg.handlers[:] = handlers
        lg.level, lg.propagate, lg.disabled = level, propagate, disabled


def test_a_composed_job_runs_as_hydras_main_with_its_logging(tmp_path, own_logging):
    from hydra.core.hydra_config import HydraConfig
    checked, _ = S.check_jobs([[*JOB, f"hydra.run.dir={tmp_path / 'run'}"]])
    assert hydra_job.plain_run(checked.config)
    seen = {}

    def task(cfg):
        seen["dir"] = HydraConfig.get().runtime.output_dir
        seen["mode"] = str(HydraConfig.get().mode)
        seen["seed"] = cfg.seed
        logging.getLogger("nas.progress").info("batch 1")

    hydra_job.run_composed(checked.config, task)
    assert seen == {"dir": str(tmp_path / "run"), "mode": "RunMode.RUN", "seed": 0}
    assert (tmp_path / "run" / "search.log").read_text().endswith("batch 1\n")
    assert "hydra.mode=RUN" in checked.config.hydra.overrides.hydra


def test_compare_says_the_files_it_wrote(capsys, tmp_path):
    from nas.io import atomic_write_json
    run = tmp_path / "runs" / "random_nb201_s0"
    run.mkdir(parents=True)
    RunDir(run).append([rec(0, 50.0), rec(1, 70.0)])
    atomic_write_json(run / "summary.json", {"strategy": "random", "space": "nb201", "evaluator": "table", "seed": 0})
    compare_cli.main([str(tmp_path / "runs"), "--at", "1", "2"])
    out = tmp_path / "runs"
    assert capsys.readouterr().out.splitlines()[-1] == (f"wrote {out / 'compare.json'}, {out / 'compare.md'}, "
                                                        f"{out / 'compare.png'}")


@pytest.mark.parametrize("flags, asked", [
    ([], {"out": None, "trial": None, "train": True, "force": False}),
    (["--no-train", "--force", "--trial", "2", "--out", "x"], {"out": Path("x"), "trial": 2, "train": False,
                                                               "force": True}),
])
def test_export_passes_its_flags_and_fails_on_a_mismatch(capsys, monkeypatch, tmp_path, flags, asked):
    (tmp_path / "summary.json").write_text("{}")
    calls = []

    def export_run(run_dir, out, trial, *, train, force, say):  # the export itself is not what is tested here
        calls.append({"out": out, "trial": trial, "train": train, "force": force})
        say("export: step \x1b")
        return manifest(source_check={"passed": not train})

    monkeypatch.setattr(export, "exporting", types.SimpleNamespace(export_run=export_run))
    if asked["train"]:
        exits(export.main, [str(tmp_path), *flags], code=1)
    else:
        export.main([str(tmp_path), *flags])
    assert calls == [asked]
    out, err = capsys.readouterr()
    assert out.startswith("exported trial 3 (91.23%")
    assert err.splitlines()[0] == "export: step \\x1b"
    assert err.splitlines()[1:] == (["nas: error: the source output check failed (files kept in /o; see export.json)"]
                                    if asked["train"] else [])


@pytest.mark.parametrize("home_there, idle, changed, reason", [
    (True, False, False, None),  # serves on
    (False, False, False, "its home is gone"), (False, True, True, "its home is gone"),  # first of all
    (True, True, True, "idle"),  # idle before the tree is hashed
    (True, False, True, "the code changed"),
])
def test_a_warm_server_with_nothing_to_do_stops_for_its_first_reason(tmp_path, home_there, idle, changed, reason):
    asked = []
    home = tmp_path / ("home" if home_there else "gone")
    (tmp_path / "home").mkdir()
    assert warm_server.stop_reason(home, idle, lambda: asked.append(1) or changed) == reason
    assert len(asked) == (1 if home_there and not idle else 0)  # the tree hashed only when it decides
