"""Tabular NB201 evaluator over the analog-nasbench table (installed in the venv)."""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import types

import numpy as np
import pytest

from nas.core.trial import EvalResult
from nas.errors import ConfigError, EvaluationError, MissingDependencyError
from nas.evaluators import EVALUATORS
from nas.evaluators.table import TableEvaluator
from nas.measure import count_flops, count_params
from nas.spaces import SPACES
from nas.spaces.nb201.arch import OPS, NB201Cell
from nas.spaces.nb201.cost import cost_model
from nas.spaces.nb201.space import NB201Space
from nas.spaces.nb201.table import SCALAR_METRICS, _file_sha256, default_table_path, load_table

BEST_TUPLE = (2, 2, 0, 2, 3, 2)
BEST_ACC = 94.0664


@pytest.fixture(scope="module")
def evaluator() -> TableEvaluator:
    return TableEvaluator(NB201Space())


def test_registered_for_nb201():
    assert "table" in EVALUATORS.names()
    assert EVALUATORS.get("table") is TableEvaluator
    assert TableEvaluator.spaces() == ["nb201"]


def test_default_table_path_is_the_installed_package_file():
    p = default_table_path()
    assert p.name == "data.anb"
    assert p.parent.name == "analognasbench"
    assert p.is_file()


def test_table_has_all_cells_and_known_best(evaluator):
    table = evaluator.table.scores
    assert len(table) == 15625 == len(OPS) ** 6
    assert set(table) == set(np.ndindex(*(5,) * 6))
    best_key, best_val = max(table.items(), key=lambda kv: kv[1])
    assert best_key == BEST_TUPLE
    assert best_val == pytest.approx(BEST_ACC, abs=1e-9)
    vals = np.array(list(table.values()))
    assert 0.0 <= vals.min() and vals.max() <= 100.0


def test_evaluate_best_cell(evaluator):
    cell = NB201Cell.from_anb_tuple(BEST_TUPLE)
    r = evaluator.evaluate(cell)
    assert isinstance(r, EvalResult)
    assert r.ok and r.error is None
    assert r.accuracy == pytest.approx(BEST_ACC)
    assert r.metrics == {"baseline_accuracy": r.accuracy}
    assert isinstance(r.params, int) and isinstance(r.flops, int)
    assert 1_000_000 < r.params < 1_200_000  # NB201 reports ~1.07M for this cell at C=16, N=5
    assert 100_000_000 < r.flops < 200_000_000
    assert r.cost_seconds >= 0.0


def test_a_table_holds_no_weights(evaluator):
    """Export keeps seeded initial weights when the evaluator has none (`Evaluator.weights` is None)."""
    assert evaluator.weights(NB201Cell.from_anb_tuple(BEST_TUPLE)) is None


def test_evaluate_matches_table_for_sampled_cells(evaluator):
    rng = np.random.default_rng(123)
    space = NB201Space()
    for _ in range(50):
        cell = space.sample(rng)
        assert evaluator.evaluate(cell).accuracy == evaluator.table.scores[cell.to_anb_tuple()]


def test_evaluate_is_seed_independent(evaluator):
    cell = NB201Cell.from_anb_tuple((0, 1, 2, 3, 4, 0))
    a, b = evaluator.evaluate(cell, seed=0), evaluator.evaluate(cell, seed=99)
    assert (a.accuracy, a.params, a.flops) == (b.accuracy, b.params, b.flops)


def test_evaluate_rejects_non_nb201(evaluator):
    with pytest.raises(EvaluationError, match="NB201 cells"):
        evaluator.evaluate("not a cell")  # type: ignore[arg-type]


def test_more_convs_cost_more(evaluator):
    none = evaluator.evaluate(NB201Cell(("none",) * 6))
    conv1 = evaluator.evaluate(NB201Cell(("nor_conv_1x1",) * 6))
    conv3 = evaluator.evaluate(NB201Cell(("nor_conv_3x3",) * 6))
    pool = evaluator.evaluate(NB201Cell(("avg_pool_3x3",) * 6))
    assert none.params < conv1.params < conv3.params
    assert none.flops < conv1.flops < conv3.flops
    assert pool.params == none.params  # parameter-free ops


# --- cost model vs direct measurement --------------------------------------

@pytest.mark.parametrize("channels, cells, n_random", [(16, 5, 1), (4, 1, 3)])
def test_cost_model_equals_direct_count(channels, cells, n_random):
    # Each direct FLOP count is a JIT trace (~0.1-0.4 s at C=16, N=5), so the
    # full-size network checks one random cell and the tiny one checks more.
    space = NB201Space(channels=channels, cells_per_stage=cells)
    ev = TableEvaluator(space)
    rng = np.random.default_rng(channels * 100 + cells)
    cells_to_check = [space.sample(rng) for _ in range(n_random)] + [NB201Cell.from_anb_tuple(BEST_TUPLE)]
    for cell in cells_to_check:
        r = ev.evaluate(cell)
        net = space.build(cell, num_classes=10)
        assert r.params == count_params(net), cell
        assert r.flops == count_flops(net, (1, 3, 32, 32)), cell


def test_cost_model_structure():
    per_op, (base_p, base_f) = cost_model(16, 5, 10, 32)
    assert set(per_op) == set(OPS)
    assert per_op["none"] == (0, 0)
    assert per_op["skip_connect"][0] == 0 and per_op["avg_pool_3x3"][0] == 0
    assert per_op["nor_conv_3x3"][0] > per_op["nor_conv_1x1"][0] > 0
    assert base_p > 0 and base_f > 0
    # 5 cells per stage at widths 16, 32, 64: a ReLU-Conv1x1-BN edge has C*C + 2C params
    assert per_op["nor_conv_1x1"][0] == 5 * sum(c * c + 2 * c for c in (16, 32, 64))


# --- configuration and file errors -------------------------------------------

def test_unknown_metric_lists_valid_ones():
    with pytest.raises(ConfigError) as info:
        TableEvaluator(NB201Space(), metric="top5")
    msg = str(info.value)
    assert "'top5'" in msg
    for m in SCALAR_METRICS:
        assert m in msg


def test_other_metrics_load_and_differ(evaluator):
    ev = TableEvaluator(NB201Space(), metric="ptq_accuracy")
    cell = NB201Cell.from_anb_tuple(BEST_TUPLE)
    r = ev.evaluate(cell)
    assert r.metrics == {"ptq_accuracy": r.accuracy}
    assert r.accuracy != evaluator.evaluate(cell).accuracy
    assert r.params == evaluator.evaluate(cell).params


def test_fingerprint_depends_on_metric_and_not_instance(evaluator):
    assert evaluator.fingerprint() == TableEvaluator(NB201Space()).fingerprint()
    other = TableEvaluator(NB201Space(), metric="qat_accuracy")
    assert other.fingerprint() != evaluator.fingerprint()
    assert "qat_accuracy" in other.fingerprint()
    assert TableEvaluator(NB201Space(), resolution=64).fingerprint() != evaluator.fingerprint()


def test_fingerprint_depends_on_file_content(tmp_path, evaluator):
    copy = tmp_path / "data.anb"
    copy.write_bytes(evaluator.table.path.read_bytes())
    same = TableEvaluator(NB201Space(), path=str(copy))
    assert same.fingerprint() == evaluator.fingerprint()
    assert same.table.path == copy.resolve()


def test_missing_table_names_the_path(tmp_path):
    missing = tmp_path / "nowhere" / "data.anb"
    with pytest.raises(MissingDependencyError) as info:
        TableEvaluator(NB201Space(), path=str(missing))
    assert str(missing) in str(info.value)
    assert "pip install analog-nasbench" in str(info.value)


def test_directory_instead_of_table_is_missing(tmp_path):
    with pytest.raises(MissingDependencyError, match="not found"):
        TableEvaluator(NB201Space(), path=str(tmp_path))


GARBAGE = {
    "text": b"this is definitely not a pickle",
    "empty": b"",
    "random": np.random.default_rng(0).bytes(4096),
    "proto-then-junk": b"\x80\x04garbage",
    "list": pickle.dumps([1, 2, 3]),
    "dict-bad-key": pickle.dumps({1: 2}),
    "dict-no-metric": pickle.dumps({(0,) * 6: 1.0}),
    "empty-dict": pickle.dumps({}),
    # huge length prefixes: the unpickler raises OverflowError / MemoryError
    "binbytes8-overflow": b"\x80\x04\x8e" + b"\xff" * 7 + b"\x7f",
    "bytearray8-huge": b"\x80\x05\x96" + (2 ** 56).to_bytes(8, "little"),
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_corrupt_table_is_missing_dependency(tmp_path, name):
    path = tmp_path / f"{name}.anb"
    path.write_bytes(GARBAGE[name])
    with pytest.raises(MissingDependencyError) as info:
        TableEvaluator(NB201Space(), path=str(path))
    assert str(path) in str(info.value)


def test_truncated_real_table_is_missing_dependency(tmp_path, evaluator):
    path = tmp_path / "truncated.anb"
    path.write_bytes(evaluator.table.path.read_bytes()[:100_000])
    with pytest.raises(MissingDependencyError, match="unreadable"):
        load_table(str(path), "baseline_accuracy")


def test_a_table_replaced_in_place_is_read_again(tmp_path, evaluator):
    """The caches are keyed by the file's mtime and size, not its path alone: a long-lived
    process (a `nas serve` worker) never scores from, or fingerprints, a table that is gone."""
    path = tmp_path / "table.anb"
    real = evaluator.table.path.read_bytes()
    path.write_bytes(real)
    before = TableEvaluator(NB201Space(), path=str(path)).fingerprint()
    assert before.startswith(hashlib.sha256(real).hexdigest()[:16])
    path.write_bytes(real[:100_000])
    with pytest.raises(MissingDependencyError, match="unreadable"):
        load_table(str(path), "baseline_accuracy")
    assert _file_sha256(str(path)) == hashlib.sha256(real[:100_000]).hexdigest()


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_with_disallowed_global_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.anb"
    path.write_bytes(pickle.dumps({(0,) * 6: _Evil(str(marker))}))
    assert b"system" in path.read_bytes()
    with pytest.raises(MissingDependencyError) as info:
        TableEvaluator(NB201Space(), path=str(path))
    assert "refusing to load global" in str(info.value)
    assert "system" in str(info.value)
    assert not marker.exists()


def test_pickle_with_builtin_eval_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Eval:
        def __reduce__(self):
            return (eval, (f"open({str(marker)!r}, 'w')",))

    path = tmp_path / "evil.anb"
    path.write_bytes(pickle.dumps(Eval()))
    with pytest.raises(MissingDependencyError, match="refusing to load global builtins.eval"):
        load_table(str(path), "baseline_accuracy")
    assert not marker.exists()


@pytest.fixture
def fake_anb_module(monkeypatch):
    """A stand-in `analognasbench.data` so tests can pickle small valid-looking tables."""
    pkg = types.ModuleType("analognasbench")
    mod = types.ModuleType("analognasbench.data")

    class Architecture:
        pass

    Architecture.__module__ = "analognasbench.data"
    Architecture.__qualname__ = "Architecture"
    mod.Architecture = Architecture
    pkg.data = mod
    monkeypatch.setitem(sys.modules, "analognasbench", pkg)
    monkeypatch.setitem(sys.modules, "analognasbench.data", mod)
    return Architecture


def _record(cls, **attrs):
    obj = cls()
    obj.__dict__.update(attrs)
    return obj


def test_small_table_with_allowed_classes_reports_cell_count(tmp_path, fake_anb_module):
    table = {(0, 0, 0, 0, 0, i): _record(fake_anb_module, baseline_accuracy=50.0 + i) for i in range(5)}
    path = tmp_path / "small.anb"
    path.write_bytes(pickle.dumps(table))
    with pytest.raises(MissingDependencyError, match="has 5 cells, expected 15625"):
        load_table(str(path), "baseline_accuracy")


def test_full_synthetic_table_is_used(tmp_path, evaluator, fake_anb_module):
    table = {
        codes: _record(fake_anb_module, baseline_accuracy=float(sum(codes)), ptq_accuracy=1.0)
        for codes in np.ndindex(*(5,) * 6)
    }
    path = tmp_path / "synthetic.anb"
    path.write_bytes(pickle.dumps({tuple(int(c) for c in k): v for k, v in table.items()}))
    ev = TableEvaluator(NB201Space(), path=str(path))
    assert ev.evaluate(NB201Cell.from_anb_tuple((4, 4, 4, 4, 4, 4))).accuracy == 24.0
    assert ev.evaluate(NB201Cell.from_anb_tuple((1, 0, 2, 0, 0, 3))).accuracy == 6.0
    assert ev.fingerprint() != evaluator.fingerprint()


def test_create_through_registry_checks_params():
    space = SPACES.create("nb201", {})
    ev = EVALUATORS.create("table", {"metric": "noisy_accuracy"}, space=space)
    assert isinstance(ev, TableEvaluator) and ev.metric == "noisy_accuracy"
    with pytest.raises(ConfigError, match="unknown parameter 'metrik'"):
        EVALUATORS.create("table", {"metrik": "x"}, space=space)
    with pytest.raises(ConfigError, match="parameter 'num_classes' must be int"):
        EVALUATORS.create("table", {"num_classes": "10"}, space=space)


def test_a_space_without_a_benchmark_table_is_refused_in_one_line():
    spos = SPACES.create("spos", {})
    assert not TableEvaluator.accepts(type(spos)) and TableEvaluator.accepts(NB201Space)
    with pytest.raises(ConfigError, match=r"^space 'spos' has no benchmark table \(evaluator=table needs one\)$"):
        TableEvaluator(spos)
