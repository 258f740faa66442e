"""TrialRecord: the history.jsonl line, byte for byte, and one-line errors for malformed lines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nas.core.trial import Candidate, EvalResult, Trial, TrialRecord, read_history
from nas.errors import RunDirError
from nas.evaluators.table import TableEvaluator
from nas.io import dumps_line
from nas.spaces.nb201.space import NB201Space


def test_line_format_and_round_trip():
    space = NB201Space()
    arch = space.decode("|nor_conv_3x3~0|+|skip_connect~0|none~1|+|avg_pool_3x3~0|nor_conv_1x1~1|skip_connect~2|")
    result = TableEvaluator(space).evaluate(arch)
    record = Trial.of(7, Candidate(arch, {"origin": "random"}), result, cached=True, wall_seconds=0.12345678).record
    line = dumps_line(record.to_json())
    assert line == ('{"accuracy":%s,"cached":true,"cost_seconds":%s,"encoding":"%s","error":null,"flops":%s,'
                    '"key":"%s","metrics":{"baseline_accuracy":%s},"params":%s,"strategy":{"origin":"random"},'
                    '"trial":7,"wall_seconds":0.123457}'
                    % (json.dumps(result.accuracy), json.dumps(round(result.cost_seconds, 6)), arch.encode(),
                       json.dumps(result.flops), arch.key(), json.dumps(result.accuracy), json.dumps(result.params)))
    assert TrialRecord.from_json(json.loads(line), "h:1") == record

    curved = Trial.of(0, Candidate(arch), EvalResult(accuracy=50.0, curve=[2.5, 1.25])).record
    assert curved.to_json()["curve"] == [2.5, 1.25]
    assert TrialRecord.from_json(json.loads(dumps_line(curved.to_json())), "h:1") == curved
    failed = Trial.of(1, Candidate(arch), EvalResult.failure("boom")).record
    assert not failed.ok and failed.to_json()["error"] == "boom" and "curve" not in failed.to_json()


def test_lines_of_older_versions_get_defaults():
    old = {"trial": 0, "key": "k", "encoding": "e", "accuracy": 91.5, "metrics": {}, "params": 1, "flops": 2,
           "error": None}
    record = TrialRecord.from_json(old, "h:1")
    assert (record.cost_seconds, record.wall_seconds, record.cached, record.strategy, record.curve) == \
        (0.0, 0.0, False, {}, [])


@pytest.mark.parametrize("change, message", [
    ({"accuracy": "91.5"}, "h.jsonl:3: field 'accuracy' must be null or a finite number, got '91.5'"),
    ({"strategy": []}, "h.jsonl:3: field 'strategy' must be an object, got []"),
    ({"curve": [1, "x"]}, "h.jsonl:3: field 'curve' must be a list of numbers, got [1, 'x']"),
    ({"key": ...}, "h.jsonl:3: field 'key' missing"),
])
def test_malformed_line_names_where_and_field(change, message):
    line = {"trial": 2, "key": "k", "encoding": "e", "accuracy": 91.5, "metrics": {}, "params": None,
            "flops": None, "error": None}
    for name, value in change.items():
        if value is ...:
            del line[name]
        else:
            line[name] = value
    with pytest.raises(RunDirError) as info:
        TrialRecord.from_json(line, "h.jsonl:3")
    assert str(info.value) == message


def test_read_history_checks_each_line_is_its_trial(tmp_path):
    path = tmp_path / "history.jsonl"
    line = {"trial": 0, "key": "k", "encoding": "e", "accuracy": None, "metrics": {}, "params": None,
            "flops": None, "error": "x"}
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "trial": 0}) + "\n")
    with pytest.raises(RunDirError, match=r"history.jsonl:2: field 'trial' is 0 but line 2 holds trial 1$"):
        read_history(path)
    path.write_text(json.dumps(line) + "\n")
    assert read_history(path) == [TrialRecord.from_json(line, "")]


def test_reading_a_history_loads_no_framework():
    """Report, compare and regression read histories: the record module must not pull in torch."""
    code = "import sys, nas.core.trial; print(sorted({'torch', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
