"""Text from an LLM reply never reaches a screen as control characters: the client escapes a
reply where it enters (its reply, cache, transcript and replay), and the report escapes what
older run dirs hold. A real loopback chat-completions server answers (tests/support/scripted.py)."""

from __future__ import annotations

import ast
import json
import re

from nas.core.trial import TrialRecord
from nas.design.metrics import design_metrics
from nas.llm import LLMClient
from nas.llm.cache import TRANSCRIPT
from nas.llm.parse import extract_code
from nas.report import render_markdown
from support.scripted import ScriptedServer

SCREEN = "\x1b[2J\x1b]0;title\x07\r"  # clear the screen, set the window title, back to the line's start
FAKE = "\nmodel.py: valid model (1 params, 1 FLOPs)"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # a control character other than the newline
# Code as some servers send it: CRLF line ends, tab indents, a control character in a string literal.
CODE = 'class Network:\r\n\tdef clear(self):\r\n\t\treturn "\x1b[2J\x9b"\r\n'
REPLY = f"Done.{SCREEN}model.py: valid{FAKE}\n```python\n{CODE}```\n"
SHOWN = "Done.\\x1b[2J\\x1b]0;title\\x07\\x0dmodel.py: valid\nmodel.py: valid model"


def client(tmp_path, run_dir, **settings):
    return LLMClient({"backend": "openai", "model": "m", "api_key_env": "NASFLOW_NO_KEY", "max_retries": 0,
                      "cache_dir": str(tmp_path / "cache"), "structured": "none", **settings}, run_dir=run_dir)


def transcript(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / TRANSCRIPT).read_text().splitlines()]


def test_a_reply_is_escaped_where_it_enters_and_its_code_keeps_its_meaning(tmp_path):
    with ScriptedServer([REPLY]) as srv:
        live = client(tmp_path, tmp_path / "live", base_url=srv.base_url).complete("mutator", "write a model")
        cached = client(tmp_path, tmp_path / "cached", base_url=srv.base_url).complete("mutator", "write a model")
    assert live.text.startswith(SHOWN) and not RAW.search(live.text)
    assert (cached.source, cached.text) == ("cache", live.text)
    assert [r["reply"] for r in transcript(tmp_path / "live")] == [live.text]
    # The code still parses as the same program: indents as spaces, the literal's characters as escapes.
    tree = ast.parse(extract_code(live.text))
    assert [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)] == ["\x1b[2J\x9b"]


def test_a_reply_kept_raw_by_an_older_run_is_escaped_when_replayed(tmp_path):
    with ScriptedServer(["plain"]) as srv:
        client(tmp_path, tmp_path / "old", base_url=srv.base_url, cache=False).complete("mutator", "write a model")
    path = tmp_path / "old" / TRANSCRIPT
    record = transcript(tmp_path / "old")[0]
    path.write_text(json.dumps({**record, "reply": REPLY}) + "\n")  # as a transcript of before held it
    replay = LLMClient({"backend": "replay", "replay_from": str(tmp_path / "old"), "cache": False},
                       run_dir=tmp_path / "new")
    text = replay.complete("mutator", "write a model").text
    assert text.startswith(SHOWN) and not RAW.search(text)
    assert [r["reply"] for r in transcript(tmp_path / "new")] == [text]


def test_the_report_keeps_llm_text_in_its_cell_and_its_code_block(tmp_path):
    """A history from a run before replies were escaped: ideas, errors and the best design's
    source with escapes, pipes, newlines and a fence of their own."""
    idea = f"Widen | the stage{SCREEN}{FAKE}"
    source = f"# {SCREEN}\n```\n## Injected heading\nclass Network:\n    pass\n"
    history = [TrialRecord(0, "k0", source, 90.0, strategy={"stage": "root", "valid": True, "node": 0}),
               TrialRecord(1, "k1", "x\ny\n", None, error=f"execute: crash: boom{SCREEN}{FAKE}",
                           strategy={"stage": "init", "parent": 0, "valid": False, "idea": idea}),
               TrialRecord(2, "k2", "x\nz\n", 80.0, strategy={"stage": "init", "parent": 0, "valid": True,
                                                             "idea": idea, "node": 1})]
    summary = {"strategy": "fairnad", "space": "source", "evaluator": "train", "seed": 0, "trials": 3,
               "failed": 1, "cache_hits": 0, "wall_seconds": 1.0, "design": design_metrics(history),
               "best": {"trial": 0, "accuracy": 90.0, "encoding": source, "key": "k0"}}
    report = render_markdown(history, summary)
    assert not RAW.search(report)
    rows = [line for line in report.splitlines() if re.match(r"\| [12] \| init \|", line)]
    assert len(rows) == 2 and all(row.count(" | ") == 6 for row in rows)
    assert "Widen \\| the stage\\x1b[2J\\x1b]0;title\\x07 model.py: valid" in rows[0]
    assert "boom\\x1b[2J" in rows[0] and "Widen \\| the stage" in rows[1]
    best = report.split("## Best design\n\n", 1)[1].splitlines()
    assert best[0] == "````" and best[1] == "# \\x1b[2J\\x1b]0;title\\x07\\x0d" and best[2] == "```"
    assert best[best.index("````", 1) - 1] == "    pass"  # the source's own fence stays inside the block
