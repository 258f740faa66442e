"""Canonical form and key of block DAGs: invariance, exactness, real data."""

from __future__ import annotations

import random
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nas.errors import EncodingError
from nas.spaces.nader.dag import Block, parse_block_file, validate_structure
from nas.spaces.nader.dag.canon import ORDERED_OPS, block_key, canonical_form, relabel

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "nader"
SUBDIRS = ("blocks", "blocks-cifar", "darts")

UNARY = ("ReLU", "BN", "Conv2d(out_channels=C,kernel_size=3)", "Conv2d(out_channels=C,kernel_size=1)",
         "reshape(B,C,H,W)")
MULTI = ("Add", "Mul", "concat(dim=1)", "Multiply")
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _block(text: str) -> Block:
    (block,) = parse_block_file(text).sections.values()
    return block


def _make(labels: list[str], edges: list[tuple[int, int]], name: str = "B") -> Block:
    """Block from node labels (index = position) and integer edges."""
    lines = [f"##{name}##"] + [f"{i}:{label}" for i, label in enumerate(labels)]
    return _block("\n".join(lines + [f"{a}->{b}" for a, b in edges]) + "\n")


def _shuffled(block: Block, rnd: random.Random) -> Block:
    """Random renumbering, node-line and edge-line order; edges into ORDERED_OPS keep their order."""
    old = list(block.nodes)
    new = rnd.sample(range(10 * len(old) + 10), len(old))
    renamed = relabel(block, {o: str(n) for o, n in zip(old, new)})
    items = list(renamed.nodes.items())
    rnd.shuffle(items)
    edges = list(renamed.edges)
    rnd.shuffle(edges)
    ordered: dict[str, list[tuple[str, str]]] = {}
    for a, b in renamed.edges:
        if renamed.nodes[b].op in ORDERED_OPS:
            ordered.setdefault(b, []).append((a, b))
    queues = {b: iter(es) for b, es in ordered.items()}
    edges = [next(queues[b]) if b in queues else (a, b) for a, b in edges]
    return Block(block.name, dict(items), edges)


@st.composite
def dags(draw: st.DrawFn, max_ops: int = 9, unary: tuple[str, ...] = UNARY) -> tuple[list[str], list[tuple[int, int]]]:
    """Valid single-input/single-output DAG as (labels, edges), nodes in topological order."""
    labels = ["input"]
    edges: list[tuple[int, int]] = []
    for i in range(1, draw(st.integers(1, max_ops)) + 1):
        multi = i >= 2 and draw(st.booleans())
        labels.append(draw(st.sampled_from(MULTI if multi else unary)))
        arity = draw(st.integers(2, min(3, i))) if multi else 1
        preds = draw(st.lists(st.integers(0, i - 1), min_size=arity, max_size=arity, unique=True))
        edges += [(p, i) for p in preds]
    sinks = [v for v in range(len(labels)) if all(a != v for a, _ in edges)]
    if len(sinks) > 1:
        labels.append("Add")
        edges += [(s, len(labels) - 1) for s in sinks]
    labels.append("output")
    edges.append((len(labels) - 2, len(labels) - 1))
    return labels, edges


def _nx(block: Block) -> nx.DiGraph:
    g = nx.DiGraph()
    for index, node in block.nodes.items():
        g.add_node(index, label=(node.op, tuple(sorted(node.args.items()))))
    seen: dict[str, int] = {}
    for a, b in block.edges:
        ordered = block.nodes[b].op in ORDERED_OPS
        g.add_edge(a, b, pos=seen.get(b, 0) if ordered else 0)
        seen[b] = seen.get(b, 0) + 1
    return g


def _isomorphic(x: Block, y: Block) -> bool:
    return nx.is_isomorphic(
        _nx(x), _nx(y),
        node_match=lambda p, q: p["label"] == q["label"],
        edge_match=lambda p, q: p["pos"] == q["pos"],
    )


def _branches(k: int, merge: str) -> Block:
    labels = ["input", "output", merge]
    edges = [(2, 1)]
    for _ in range(k):
        c = len(labels)
        labels += ["Conv2d(out_channels=C,kernel_size=3)", "BN", "ReLU"]
        edges += [(0, c), (c, c + 1), (c + 1, c + 2), (c + 2, 2)]
    return _make(labels, edges)


# ------------------------------------------------------------ properties


@SETTINGS
@given(dags(), st.randoms(use_true_random=False))
def test_key_invariant_under_renumbering_and_shuffling(dag, rnd):
    block = _make(*dag)
    validate_structure(block)
    shuffled = _shuffled(block, rnd)
    validate_structure(shuffled)
    assert canonical_form(shuffled) == canonical_form(block)
    assert block_key(shuffled) == block_key(block)
    again = parse_block_file(shuffled.to_text()).sections["B"]
    assert block_key(again) == block_key(block)


@SETTINGS
@given(dags())
def test_canonical_form_is_a_parseable_fixed_point(dag):
    block = _make(*dag)
    form = canonical_form(block)
    assert canonical_form(_block("##C##\n" + form)) == form


@SETTINGS
@given(dags(max_ops=6, unary=("ReLU", "BN")), st.data())
def test_equal_forms_iff_isomorphic(dag, data):
    """Exactness against networkx on small, symmetric-prone graphs and near-miss mutations."""
    labels, edges = dag
    block = _make(labels, edges)
    i = data.draw(st.integers(0, len(edges) - 1))
    a, b = edges[i]
    src = data.draw(st.integers(0, b - 1))
    mutated = list(edges)
    if (src, b) not in edges:
        mutated[i] = (src, b)
    if data.draw(st.booleans()):
        j = data.draw(st.integers(0, len(mutated) - 1))
        mutated[i], mutated[j] = mutated[j], mutated[i]
    other = _shuffled(_make(labels, mutated), data.draw(st.randoms(use_true_random=False)))
    assert (canonical_form(block) == canonical_form(other)) == _isomorphic(block, other)


# ------------------------------------------------------------ semantics


def _two_input(op: str, first: int, second: int) -> Block:
    return _make(
        ["input", "output", "Conv2d(out_channels=C,kernel_size=1)", "Conv2d(out_channels=C,kernel_size=3)", op],
        [(0, 2), (0, 3), (first, 4), (second, 4), (4, 1)],
    )


@pytest.mark.parametrize("op", ["concat(dim=1)", "Concat(dim=1)", "Multiply"])
def test_input_order_matters_for_ordered_ops(op):
    assert block_key(_two_input(op, 2, 3)) != block_key(_two_input(op, 3, 2))


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_input_order_ignored_for_commutative_ops(op):
    assert block_key(_two_input(op, 2, 3)) == block_key(_two_input(op, 3, 2))


def test_swapping_identical_inputs_of_ordered_op_is_isomorphic():
    block = _branches(2, "concat(dim=1)")
    swapped = Block(block.name, block.nodes, [e for e in block.edges if e[1] != "2"])
    swapped.edges += list(reversed([e for e in block.edges if e[1] == "2"]))
    assert block_key(swapped) == block_key(block)


def test_shared_node_differs_from_duplicated_copies():
    shared = _make(["input", "output", "Conv2d(out_channels=C,kernel_size=3)", "ReLU", "ReLU", "Add"],
                   [(0, 2), (2, 3), (2, 4), (3, 5), (4, 5), (5, 1)])
    copies = _make(["input", "output", "Conv2d(out_channels=C,kernel_size=3)", "ReLU", "ReLU", "Add",
                    "Conv2d(out_channels=C,kernel_size=3)"],
                   [(0, 2), (2, 3), (0, 6), (6, 4), (3, 5), (4, 5), (5, 1)])
    assert block_key(shared) != block_key(copies)


def _bipartite_layer(*wirings: list[int]) -> Block:
    """k identical convs feeding k Adds (Add i reads conv i and conv w[i] per wiring w), summed."""
    k = len(wirings[0])
    labels = ["input", "output", "Add"] + ["Conv2d(out_channels=C,kernel_size=3)"] * k + ["Add"] * k
    edges = [(2, 1)] + [(0, 3 + i) for i in range(k)]
    for i in range(k):
        sources = dict.fromkeys([i] + [w[i] for w in wirings])
        edges += [(3 + j, 3 + k + i) for j in sources] + [(3 + k + i, 2)]
    return _make(labels, edges)


def test_one_cycle_differs_from_two_cycles_that_1wl_confuses():
    one = _bipartite_layer([(i + 1) % 8 for i in range(8)])
    two = _bipartite_layer([4 * (i // 4) + (i + 1) % 4 for i in range(8)])
    assert block_key(one) != block_key(two)
    assert block_key(_shuffled(one, random.Random(1))) == block_key(one)
    assert block_key(_shuffled(two, random.Random(2))) == block_key(two)


def test_argument_change_changes_key_and_kwarg_order_does_not():
    base = _block("##B##\n0:input\n1:output\n2:Conv2d(out_channels=C,kernel_size=3)\n0->2\n2->1\n")
    k5 = _block("##B##\n0:input\n1:output\n2:Conv2d(out_channels=C,kernel_size=5)\n0->2\n2->1\n")
    reordered = _block("##B##\n0:input\n1:output\n2:Conv2d(kernel_size=3,out_channels=C)\n0->2\n2->1\n")
    assert block_key(base) != block_key(k5)
    assert block_key(base) == block_key(reordered)


def test_section_name_is_not_part_of_key():
    block = _branches(2, "Add")
    assert block_key(Block("Other", block.nodes, block.edges)) == block_key(block)


def test_input1_input2_swap_matters_unless_symmetric():
    cell = _make(["input1", "input2", "output", "ReLU", "MaxPool2d(kernel_size=3)", "Add"],
                 [(0, 3), (1, 4), (3, 5), (4, 5), (5, 2)])
    swapped = _make(["input2", "input1", "output", "ReLU", "MaxPool2d(kernel_size=3)", "Add"],
                    [(0, 3), (1, 4), (3, 5), (4, 5), (5, 2)])
    assert block_key(cell) != block_key(swapped)
    symmetric = _make(["input1", "input2", "output", "ReLU", "ReLU", "Add"],
                      [(0, 3), (1, 4), (3, 5), (4, 5), (5, 2)])
    flipped = _make(["input2", "input1", "output", "ReLU", "ReLU", "Add"],
                    [(0, 3), (1, 4), (3, 5), (4, 5), (5, 2)])
    assert block_key(symmetric) == block_key(flipped)


def test_normaliser_is_applied_to_argument_values():
    a = _block("##B##\n0:input\n1:output\n2:Conv2d(out_channels=C*4)\n0->2\n2->1\n")
    b = _block("##B##\n0:input\n1:output\n2:Conv2d(out_channels=4*C)\n0->2\n2->1\n")
    assert block_key(a) != block_key(b)
    swap = {"4*C": "C*4"}.get
    assert block_key(a, normalise=lambda v: swap(v, v)) == block_key(b, normalise=lambda v: swap(v, v))


def test_canonical_form_text():
    block = _block("##B##\n7:output\n3:Add\n9:input\n5:ReLU\n9->5\n5->3\n9->3\n3->7\n")
    assert canonical_form(block) == "0:Add\n1:ReLU\n2:input\n3:output\n1->0\n2->0\n2->1\n0->3"


def test_undefined_edge_end_raises_one_line_error():
    block = _block("##B##\n0:input\n1:output\n0->1\n")
    block.edges.append(("1", "9"))
    with pytest.raises(EncodingError, match=r"^<string>:\d+: block 'B': edge 1->9: node 9 is not defined$"):
        canonical_form(block)


def test_relabel_renames_and_rejects_collisions():
    block = _branches(1, "Add")
    moved = relabel(block, {"0": "in", "1": "out"})
    assert set(moved.nodes) == {"in", "out", "2", "3", "4", "5"}
    assert ("in", "3") in moved.edges and ("2", "out") in moved.edges
    assert block_key(moved) == block_key(block)
    with pytest.raises(EncodingError, match="same index"):
        relabel(block, {"0": "1"})


@pytest.mark.parametrize("merge", ["Add", "concat(dim=1)"])
def test_identical_branches_explore_few_leaves(merge):
    stats: dict[str, int] = {}
    block = _branches(8, merge)
    form = canonical_form(block, stats=stats)
    assert stats["leaves"] < 100
    assert canonical_form(_shuffled(block, random.Random(0))) == form


# ------------------------------------------------------------ real data


@pytest.fixture(scope="module")
def data_sections() -> dict[str, dict[str, Block]]:
    files = [f for d in SUBDIRS for f in sorted((DATA / d).glob("*.txt"))]
    if not files:
        pytest.skip(f"NADER data not found under {DATA}")
    return {f.name: parse_block_file(f.read_text(), f.name).sections for f in files}


def test_data_keys_stable_under_shuffling(data_sections):
    rnd = random.Random(0)
    for sections in data_sections.values():
        for block in sections.values():
            key = block_key(block)
            for _ in range(3):
                assert block_key(_shuffled(block, rnd)) == key, block.name
            assert block_key(parse_block_file(block.to_text()).sections[block.name]) == key


def test_data_known_equalities_and_differences(data_sections):
    optimal = data_sections["nasbench201_cifar100_optimal.txt"]["NASBench201Seed777"]
    res50 = data_sections["nasbench201_cifar100_optimal_forRes50.txt"]["NASBench201Seed777"]
    assert block_key(optimal) == block_key(res50)
    basic = data_sections["resnet_basic.txt"]["ResNetBasicBlock_stem"]
    base = data_sections["resnet_base.txt"]["ResNetBasicBlock_stem"]
    assert block_key(basic) != block_key(base)


def _wirings(k: int, n: int) -> st.SearchStrategy[list[list[int]]]:
    return st.lists(st.permutations(range(k)), min_size=n, max_size=n)


@SETTINGS
@given(st.tuples(st.integers(3, 7), st.integers(1, 2)).flatmap(lambda kn: st.tuples(_wirings(*kn), _wirings(*kn))))
def test_regular_layers_equal_iff_isomorphic(pair):
    """Layers that refinement can barely split: the search must decide, and prune correctly.

    k stays small because networkx's VF2, the reference, is exponential on such graphs.
    """
    first, second = (_bipartite_layer(*wirings) for wirings in pair)
    assert (block_key(first) == block_key(second)) == _isomorphic(first, second)
