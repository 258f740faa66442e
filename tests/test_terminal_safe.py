"""Text from a child, a model file or an LLM is terminal-safe everywhere it is shown: `printable`
escapes every character of the categories Cc, Cf, Cs, Co, Zl and Zp (checked over every code
point, against the categories written out here) and nothing else; what it gives is stable and
encodes; the CLI's streams never raise on a terminal that lacks a letter; log records, the report,
Prefect's artifact tables and LLM replies all pass through it; and the real CLI, run on hostile
model files whose messages carry lone surrogates, bidi overrides and zero-width characters, prints
one plain line per file on an ASCII and on a latin-1 terminal."""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nas.core.trial import TrialRecord
from nas.design.metrics import design_metrics
from nas.llm.client import reply_text
from nas.report import render_markdown
from nas.terminal import clipped, printable

ROOT = Path(__file__).resolve().parents[1]
ESCAPED = {"Cc", "Cf", "Cs", "Co", "Zl", "Zp"}  # controls, format (bidi, zero-width), surrogates, private use, separators
HOSTILE = [  # a character of each kind an attacker spoofs with, and how it is shown (pairs: ruff reads two
    # lone surrogates as one dict key)
    ("\x1b", "\\x1b"), ("\x85", "\\x85"), ("\x7f", "\\x7f"), ("\t", "\\x09"), ("\r", "\\x0d"),
    ("\u202e", "\\u202e"), ("\u202d", "\\u202d"), ("\u2066", "\\u2066"), ("\u2069", "\\u2069"),
    ("\u061c", "\\u061c"), ("\u200b", "\\u200b"), ("\u200d", "\\u200d"), ("\u2060", "\\u2060"),
    ("\ufeff", "\\ufeff"), ("\u00ad", "\\xad"), ("\U000e0041", "\\U000e0041"), ("\ud800", "\\ud800"),
    ("\udfff", "\\udfff"), ("\ue000", "\\ue000"), ("\U000f0000", "\\U000f0000"), ("\U0010fffd", "\\U0010fffd"),
    ("\u2028", "\\u2028"), ("\u2029", "\\u2029"),
]
LETTERS = "plain: ü ∑ 漢 😀 é…"  # shown as they are (a terminal lacking them gets escapes from `safe_streams`)


def _unsafe(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in ESCAPED and c != "\n"]


def test_every_code_point_of_the_escaped_categories_is_escaped_and_no_other() -> None:
    every = "".join(map(chr, range(0x110000)))
    shown = printable(every)
    expected = "".join((f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" if ord(c) < 0x10000
                        else f"\\U{ord(c):08x}") if unicodedata.category(c) in ESCAPED else c for c in every)
    assert shown == expected


@pytest.mark.parametrize("char, shown", HOSTILE, ids=[f"U+{ord(c):04X}" for c, _ in HOSTILE])
def test_each_spoofing_character_is_shown_as_its_escape(char: str, shown: str) -> None:
    assert printable(f"a{char}b") == f"a{shown}b"
    assert printable(f"a{char}b", lines=True) == f"a{shown}b"
    assert printable(LETTERS) == LETTERS


def test_a_multi_line_field_keeps_its_newlines_only() -> None:
    assert printable("a\nb\r\nc\u2028d\x85e", lines=True) == "a\nb\\x0d\nc\\u2028d\\x85e"
    assert printable("a\nb") == "a\\x0ab"


@settings(max_examples=300, deadline=None)
@given(st.text(), st.booleans())
def test_what_printable_gives_is_stable_safe_and_encodes(text: str, lines: bool) -> None:
    shown = printable(text, lines)
    assert printable(shown, lines) == shown and not _unsafe(shown)
    assert lines or "\n" not in shown
    shown.encode("utf-8")  # no lone surrogate left: any UTF-8 terminal, file or API takes it


def test_clipped_keeps_the_head_or_the_tail() -> None:
    assert clipped("abcdef", 4) == "abc…" and clipped("abcdef", 4, tail=True) == "…def"
    assert clipped("abc", 3) == clipped("abc", 3, tail=True) == "abc"


SHOW = "import sys\nfrom nas.terminal import safe_streams\n{setup}print({text!r}); print({text!r}, file=sys.stderr)\n"


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_the_cli_streams_never_raise_on_a_terminal_that_lacks_a_letter(encoding: str) -> None:
    env = {**os.environ, "PYTHONIOENCODING": encoding, "PYTHONPATH": str(ROOT)}
    text = printable(f"{LETTERS} \u202e\ud800")
    safe = subprocess.run([sys.executable, "-c", SHOW.format(setup="safe_streams()\n", text=text)], env=env,
                          capture_output=True)
    assert safe.returncode == 0, safe.stderr
    assert safe.stdout.decode(encoding).rstrip("\n") == text.encode(encoding, "backslashreplace").decode(encoding)
    raw = subprocess.run([sys.executable, "-c", SHOW.format(setup="", text=text)], env=env, capture_output=True)
    assert raw.returncode == 1 and b"UnicodeEncodeError" in raw.stderr  # what `safe_streams` prevents


def test_log_records_are_escaped_for_bidi_zero_width_and_surrogates() -> None:
    from nas.secrets import install_log_scrubbing

    install_log_scrubbing()
    record = logging.getLogger("nas.test_terminal_safe").makeRecord(
        "nas.test_terminal_safe", logging.WARNING, __file__, 1, "collm: failed: %s", ("\u202eboom\u200b\ud800",), None)
    assert record.getMessage() == "collm: failed: \\u202eboom\\u200b\\ud800"


def test_the_report_shows_an_llms_idea_and_error_escaped() -> None:
    idea = "Widen\u202e the stage\u200b\ud800\U000e0041"
    history = [TrialRecord(0, "k0", "x\n", 90.0, strategy={"stage": "root", "valid": True, "node": 0}),
               TrialRecord(1, "k1", "x\ny\n", None, error="execute: crash: boom\u2066\udfff",
                           strategy={"stage": "init", "parent": 0, "valid": False, "idea": idea})]
    summary = {"strategy": "fairnad", "space": "source", "evaluator": "train", "seed": 0, "trials": 2, "failed": 1,
               "cache_hits": 0, "wall_seconds": 1.0, "design": design_metrics(history),
               "best": {"trial": 0, "accuracy": 90.0, "encoding": "class Network:\u202e\n    pass\n", "key": "k0"}}
    report = render_markdown(history, summary)
    assert not _unsafe(report) and "Widen\\u202e the stage\\u200b\\ud800\\U000e0041" in report
    assert "boom\\u2066\\udfff" in report and "class Network:\\u202e" in report
    report.encode("utf-8")  # report.md is written as UTF-8: a lone surrogate would fail the write


def test_an_llm_reply_is_escaped_and_its_code_keeps_its_meaning() -> None:
    reply = 'Done\u202e.\u200b\n```python\nclass Network:\n    name = "\u202e\ud800\U000e0041"\n```\n'
    text = reply_text(reply)
    assert not _unsafe(text) and text.startswith("Done\\u202e.\\u200b\n")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert [n.value for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Constant)] == ["\u202e\ud800\U000e0041"]


def test_prefect_artifact_tables_escape_encodings_and_metric_text() -> None:
    from flows.artifacts import encoding_text, top_trials

    record = TrialRecord(0, "k0", "conv\u202e3x3", 90.0, metrics={"proxy_note": "no scores: \u2066x\ud800"})
    row = top_trials([record], trust=False)[0]
    assert row["encoding"] == encoding_text("conv\u202e3x3") == "`conv\\u202e3x3`"  # code spans: no markdown
    assert row["proxy_note"] == "`no scores: \\u2066x\\ud800`"


def test_nas_export_escapes_its_progress_lines_and_the_graph_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`nas export` says lines that quote the model's own errors (its progress, ONNX's failure)."""
    import nas.export.run
    from nas.cli.export import main

    def export_run(run_dir: Path, out: Path | None, trial: int | None, *, train: bool, force: bool, say) -> dict:
        say("export: retraining failed: boom\u202e\x1b[2J\ud800")
        return {"trial": 0, "accuracy": 90.0, "params": 10, "evaluator": "train", "out": str(tmp_path),
                "input_shape": [1, 1, 28, 28], "weights": {"origin": "retrained"}, "metrics": {}, "source_check": None,
                "graph": {"format": "torchscript", "file": "model.torchscript.pt", "onnx_error": "bad op\u2066\r\x1b]0;x",
                          "check": {"max_abs_diff": 0.0, "method": "allclose", "passed": True}}}

    (tmp_path / "summary.json").write_text("{}")
    monkeypatch.setattr(nas.export.run, "export_run", export_run)
    main([str(tmp_path)])
    out, err = capsys.readouterr()
    assert not _unsafe(out + err), (out, err)
    assert "boom\\u202e\\x1b[2J\\ud800" in err and "bad op\\u2066\\x0d\\x1b]0;x" in out


# --- the real CLI on a non-UTF-8 terminal ------------------------------------------------

CASES = ["proto_surrogate_exception.py", "proto_surrogate_export_error.py", "spoof_bidi_exception.py",
         "spoof_zero_width_verdict.py"]


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"},
                                 {"PYTHONIOENCODING": "latin-1", "LANG": "C", "LC_ALL": "C"}],
                         ids=["ascii", "latin-1"])
def test_the_cli_prints_one_plain_line_per_hostile_file_on_any_terminal(env: dict[str, str], tmp_path: Path) -> None:
    """Lone surrogates (which no encoder takes), bidi overrides, isolates, zero-width, tag and
    private-use characters in the models' messages: each file's line is one line, escaped, and
    printing it raises nothing on an ASCII or a latin-1 terminal."""
    models = []
    for name in CASES:
        models.append(tmp_path / name)
        models[-1].write_text((ROOT / "tests" / "hostile" / name).read_text(encoding="utf-8"), encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "nas.cli.main", "arch", "validate", *map(str, models)],
                         cwd=tmp_path, capture_output=True, timeout=len(CASES) * 100,
                         env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
                              "NASFLOW_HOME": os.environ["NASFLOW_HOME"], "OMP_NUM_THREADS": "1", **env})
    out, err = (stream.decode(env["PYTHONIOENCODING"]) for stream in (run.stdout, run.stderr))
    assert run.returncode == 1 and "Traceback" not in err, err[-2000:]
    lines = out.splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == list(map(str, models)), out
    assert not _unsafe(out + err) and all(c.isprintable() for c in out.replace("\n", "")), out
    assert "\\ud800" in lines[0] and "\\u202e" in lines[2] and "\\u200b" in lines[3], out
    assert ": valid model (" in lines[1] and "\\udcff\\ud800" in lines[1], out
