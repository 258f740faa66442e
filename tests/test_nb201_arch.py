"""NB201Cell: string form, analog-nasbench tuples, keys and the trainable network."""

from __future__ import annotations

import itertools

import pytest
import torch

from nas.errors import EncodingError
from nas.spaces.nb201.arch import ANB_CODES, ANB_EDGES, EDGES, OPS, NB201Cell
from nas.spaces.nb201.space import NB201Space

BEST_TUPLE = (2, 2, 0, 2, 3, 2)
BEST_STRING = "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_1x1~1|nor_conv_3x3~2|"

# Cells given as ops in EDGES order: (0->1, 0->2, 1->2, 0->3, 1->3, 2->3).
CELLS = [
    ("none",) * 6,
    ("skip_connect",) * 6,
    ("nor_conv_3x3", "nor_conv_3x3", "nor_conv_3x3", "skip_connect", "nor_conv_1x1", "nor_conv_3x3"),
    ("avg_pool_3x3", "none", "nor_conv_1x1", "skip_connect", "nor_conv_3x3", "avg_pool_3x3"),
]


# --- string form -------------------------------------------------------------

def test_constants_describe_the_nb201_layout():
    assert OPS == ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
    assert EDGES == ((0, 1), (0, 2), (1, 2), (0, 3), (1, 3), (2, 3))
    assert ANB_EDGES == ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
    assert ANB_CODES == ("skip_connect", "none", "nor_conv_3x3", "nor_conv_1x1", "avg_pool_3x3")


def test_to_string_uses_nb201_group_format():
    cell = NB201Cell(("nor_conv_3x3", "nor_conv_3x3", "nor_conv_3x3", "skip_connect",
                      "nor_conv_1x1", "nor_conv_3x3"))
    assert cell.to_string() == BEST_STRING
    assert cell.encode() == BEST_STRING
    assert cell.canonical() == BEST_STRING


def test_string_places_ops_on_the_right_edges():
    ops = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3", "none")
    s = NB201Cell(ops).to_string()
    assert s == "|none~0|+|skip_connect~0|nor_conv_1x1~1|+|nor_conv_3x3~0|avg_pool_3x3~1|none~2|"


@pytest.mark.parametrize("ops", CELLS, ids=lambda o: "-".join(x[:4] for x in o))
def test_string_round_trip(ops):
    cell = NB201Cell(ops)
    back = NB201Cell.from_string(cell.to_string())
    assert back.ops == ops
    assert back == cell
    assert NB201Cell.decode(cell.encode()) == cell


def test_string_round_trip_all_cells():
    for ops in itertools.product(OPS, repeat=6):
        s = NB201Cell(ops).to_string()
        assert NB201Cell.from_string(s).ops == ops


def test_from_string_tolerates_surrounding_whitespace():
    assert NB201Cell.from_string(f"  {BEST_STRING}\n").to_string() == BEST_STRING


@pytest.mark.parametrize("text, fragments", [
    ("|none~0|+|none~0|none~1|", ["expected 3 node groups", "got 2"]),
    ("|none~0|+|none~0|none~1|+|none~0|none~1|none~2|+|none~0|", ["expected 3 node groups", "got 4"]),
    ("", ["expected 3 node groups", "got 1"]),
    ("|none~0|none~1|+|none~0|none~1|+|none~0|none~1|none~2|", ["node 1 needs 1 incoming edge(s), got 2"]),
    ("|none~0|+|none~0|+|none~0|none~1|none~2|", ["node 2 needs 2 incoming edge(s), got 1"]),
    ("|none~0|+|none~0|none~1|+|none~0|none~1|", ["node 3 needs 3 incoming edge(s), got 2"]),
    ("|none~0|+|none~0|none~2|+|none~0|none~1|none~2|", ["node 2 edge 'none~2'", "'op~1'"]),
    ("|none~1|+|none~0|none~1|+|none~0|none~1|none~2|", ["node 1 edge 'none~1'", "'op~0'"]),
    ("|none|+|none~0|none~1|+|none~0|none~1|none~2|", ["node 1 edge 'none'", "'op~0'"]),
    ("|none~0|+|none~0|none~1|+|none~0|none~1|none~x|", ["node 3 edge 'none~x'", "'op~2'"]),
    ("none~0|+|none~0|none~1|+|none~0|none~1|none~2|", ["node 1 group", "wrapped in '|'"]),
    ("|none~0|+|none~0|none~1+|none~0|none~1|none~2|", ["node 2 group", "wrapped in '|'"]),
])
def test_malformed_strings_name_the_problem(text, fragments):
    with pytest.raises(EncodingError) as info:
        NB201Cell.from_string(text)
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, (frag, msg)


@pytest.mark.parametrize("position, edge", [(0, "0->1"), (1, "0->2"), (2, "1->2"),
                                            (3, "0->3"), (4, "1->3"), (5, "2->3")])
def test_unknown_op_names_the_edge(position, edge):
    ops = ["none"] * 6
    ops[position] = "conv_5x5"
    groups, i = [], 0
    for node in (1, 2, 3):
        groups.append("|" + "|".join(f"{ops[i + s]}~{s}" for s in range(node)) + "|")
        i += node
    with pytest.raises(EncodingError) as info:
        NB201Cell.from_string("+".join(groups))
    msg = str(info.value)
    assert f"edge {edge}" in msg
    assert "'conv_5x5'" in msg
    assert "valid:" in msg


def test_first_unknown_op_is_reported():
    with pytest.raises(EncodingError, match=r"edge 0->1: unknown op 'X'"):
        NB201Cell.from_string("|X~0|+|X~0|X~1|+|X~0|X~1|X~2|")


@pytest.mark.parametrize("bad", [None, 3, ["none~0"], b"|none~0|"])
def test_non_string_encoding_is_rejected(bad):
    with pytest.raises(EncodingError, match="must be a string"):
        NB201Cell.decode(bad)


def test_wrong_number_of_ops_is_rejected():
    with pytest.raises(EncodingError, match="needs 6 edge ops, got 5"):
        NB201Cell(("none",) * 5)


# --- analog-nasbench tuples -------------------------------------------------

def test_best_cifar10_tuple_maps_to_known_string():
    cell = NB201Cell.from_anb_tuple(BEST_TUPLE)
    assert cell.to_string() == BEST_STRING
    assert NB201Cell.from_string(BEST_STRING).to_anb_tuple() == BEST_TUPLE


def test_anb_tuple_order_is_edges_01_02_03_12_13_23():
    # One non-skip code per position reveals which edge each position is.
    expected_edge = ["0->1", "0->2", "0->3", "1->2", "1->3", "2->3"]
    for pos, edge in enumerate(expected_edge):
        codes = [0] * 6
        codes[pos] = 3  # nor_conv_1x1
        cell = NB201Cell.from_anb_tuple(tuple(codes))
        src, dst = (int(x) for x in edge.split("->"))
        assert cell.ops[EDGES.index((src, dst))] == "nor_conv_1x1"
        assert cell.ops.count("nor_conv_1x1") == 1
        assert cell.ops.count("skip_connect") == 5


@pytest.mark.parametrize("code, op", list(enumerate(
    ["skip_connect", "none", "nor_conv_3x3", "nor_conv_1x1", "avg_pool_3x3"])))
def test_anb_codes(code, op):
    assert NB201Cell.from_anb_tuple((code,) * 6).ops == (op,) * 6


def test_all_15625_anb_tuples_round_trip():
    seen = set()
    for codes in itertools.product(range(5), repeat=6):
        cell = NB201Cell.from_anb_tuple(codes)
        assert cell.to_anb_tuple() == codes
        seen.add(cell.to_string())
    assert len(seen) == 15625


@pytest.mark.parametrize("codes", [(0, 0, 0, 0, 0), (0,) * 7, (0, 0, 0, 0, 0, 5), (0, 0, 0, 0, 0, -1),
                                   (0, 0, 0, 0, 0, 1.0), (0, 0, 0, 0, 0, "1")])
def test_bad_anb_tuples_are_rejected(codes):
    with pytest.raises(EncodingError, match="analog-nasbench tuple"):
        NB201Cell.from_anb_tuple(codes)


# --- keys -----------------------------------------------------------------------

def test_key_is_stable_and_short_hex():
    a = NB201Cell.from_anb_tuple(BEST_TUPLE)
    b = NB201Cell.from_string(BEST_STRING)
    assert a is not b
    assert a.key() == b.key()
    assert len(a.key()) == 16
    int(a.key(), 16)  # hex
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1


def test_key_is_fixed_across_processes():
    # stable_hash is a SHA-256 over canonical JSON; pin one value so a change of
    # the hashing scheme (which would orphan caches and run dirs) is noticed.
    import hashlib
    import json

    blob = json.dumps(["nb201", BEST_STRING], sort_keys=True, separators=(",", ":"))
    assert NB201Cell.from_string(BEST_STRING).key() == hashlib.sha256(blob.encode()).hexdigest()[:16]


def test_keys_differ_for_different_cells():
    keys = {NB201Cell(ops).key() for ops in itertools.product(OPS, repeat=6)}
    assert len(keys) == 15625


def test_cells_differing_in_one_edge_are_not_equal():
    a = NB201Cell(("none",) * 6)
    b = NB201Cell(("none",) * 5 + ("skip_connect",))
    assert a != b
    assert a.key() != b.key()


# --- trainable network ------------------------------------------------------------

@pytest.mark.parametrize("ops", [CELLS[0], CELLS[2], CELLS[3]], ids=["all-none", "best", "mixed"])
def test_built_network_is_trainable_end_to_end(ops):
    torch.manual_seed(0)
    net = NB201Space(channels=4, cells_per_stage=1).build(NB201Cell(ops), num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    out = net(x)
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()
    out.sum().backward()  # trainable end to end
    assert any(p.grad is not None for p in net.parameters())


def test_build_respects_num_classes_and_cells_per_stage():
    net = NB201Space(channels=4, cells_per_stage=2).build(NB201Cell.from_anb_tuple(BEST_TUPLE), num_classes=7)
    assert net(torch.randn(1, 3, 32, 32)).shape == (1, 7)
    from nas.spaces.nb201.network import CellModule

    assert sum(isinstance(m, CellModule) for m in net.modules()) == 6
    assert net.classifier.in_features == 16  # 4 -> 8 -> 16


def test_all_none_cell_output_ignores_input():
    # With every edge 'none' the cells zero the signal, so logits are input-independent.
    net = NB201Space(channels=4, cells_per_stage=1).build(NB201Cell(("none",) * 6), num_classes=10).eval()
    with torch.no_grad():
        a = net(torch.randn(2, 3, 32, 32))
        b = net(torch.randn(2, 3, 32, 32))
    assert torch.allclose(a, b)
