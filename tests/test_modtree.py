"""NADER's network modification tree: policies, limits, dedup, state round trip."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nas.agents.nader.modtree import POLICIES, ModificationTree, Node


def make(policy: str = "dfs", root_score: float | None = 0.5, **kw: Any) -> ModificationTree:
    tree = ModificationTree("root", "block: root", policy=policy, **kw)
    if root_score is not None:
        tree.record(0, root_score)
    return tree


def child(tree: ModificationTree, parent: int, name: str, score: float | None = None,
          failed: bool = False) -> int:
    """Add a child; record it when a score is given or it failed."""
    node = tree.add_child(parent, name, f"block: {name}", f"idea {name}")
    if score is not None or failed:
        tree.record(node.id, score, failed=failed)
    return node.id


def sel(tree: ModificationTree) -> int | None:
    node = tree.select()
    return None if node is None else node.id


# --------------------------------------------------------------------- basics

def test_root_must_be_evaluated_before_anything_is_selected():
    tree = make(root_score=None)
    assert len(tree) == 1 and tree.node(0).status == "pending"
    assert tree.select() is None
    with pytest.raises(ValueError, match="node 0 is pending"):
        tree.add_child(0, "a", "a", "idea")
    tree.record(0, 0.5)
    assert sel(tree) == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_failed_root_exhausts_the_tree(policy):
    tree = make(policy, root_score=None)
    tree.record(0, None, failed=True)
    assert tree.node(0).score is None and tree.node(0).status == "failed"
    assert tree.select() is None and tree.best() is None


def test_node_fields_and_queries():
    tree = make()
    a = tree.add_child(0, "a", "block: a", "add SE", info={"origin": "proposer"})
    assert isinstance(a, Node)
    assert (a.id, a.parent, a.key, a.text, a.idea, a.score, a.status, a.depth, a.children, a.info) == \
        (1, 0, "a", "block: a", "add SE", None, "pending", 1, [], {"origin": "proposer"})
    assert tree.improved(a.id) is None  # pending
    tree.record(a.id, 0.6)
    b = child(tree, a.id, "b", 0.55)
    assert tree.node(0).children == [1] and tree.node(1).children == [2]
    assert tree.path(b) == [0, 1, 2] and tree.path(0) == [0]
    assert tree.improved(0) is None
    assert tree.improved(1) is True and tree.improved(2) is False
    assert tree.best().id == 1
    assert len(tree) == 3
    assert tree.to_dict() == {
        "policy": "dfs",
        "best": 1,
        "nodes": [
            {"id": 0, "parent": None, "depth": 0, "score": 0.5, "status": "evaluated", "idea": ""},
            {"id": 1, "parent": 0, "depth": 1, "score": 0.6, "status": "evaluated", "idea": "add SE"},
            {"id": 2, "parent": 1, "depth": 2, "score": 0.55, "status": "evaluated", "idea": "idea b"},
        ],
    }
    json.dumps(tree.to_dict())
    with pytest.raises(ValueError, match="no node 7"):
        tree.path(7)


def test_best_breaks_ties_by_lowest_id_and_ignores_failed_and_pending():
    tree = make(root_score=0.5)
    child(tree, 0, "a", 0.7)
    child(tree, 0, "b", 0.7)
    child(tree, 0, "c", failed=True)
    assert tree.best().id == 1
    assert make(root_score=None).best() is None


def test_info_is_copied_and_must_be_json():
    tree = make()
    info = {"tags": ["se"]}
    node = tree.add_child(0, "a", "a", "idea", info=info)
    info["tags"].append("mutated")
    assert node.info == {"tags": ["se"]}
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        tree.add_child(0, "b", "b", "idea", info={"x": object()})
    assert len(tree) == 2 and tree.has_key("b") is None


# ------------------------------------------------------------------------ record

def test_record_validates_its_input():
    tree = make()
    a = tree.add_child(0, "a", "a", "idea").id
    with pytest.raises(ValueError, match="node 0 is already evaluated"):
        tree.record(0, 0.9)
    with pytest.raises(ValueError, match="a failed node has no score"):
        tree.record(a, 0.3, failed=True)
    with pytest.raises(ValueError, match="finite number"):
        tree.record(a, None)
    with pytest.raises(ValueError, match="finite number"):
        tree.record(a, float("nan"))
    with pytest.raises(ValueError, match="finite number"):
        tree.record(a, True)
    with pytest.raises(ValueError, match="no node 9"):
        tree.record(9, 0.1)
    assert tree.node(a).status == "pending"
    tree.record(a, 1)
    assert tree.node(a).score == 1.0 and isinstance(tree.node(a).score, float)
    with pytest.raises(ValueError, match="already evaluated"):
        tree.record(a, None, failed=True)


# ---------------------------------------------------------------- limits, dedup

def test_pending_and_failed_children_count_toward_max_children():
    tree = make(max_children=3)
    child(tree, 0, "a")  # pending
    child(tree, 0, "b", failed=True)
    child(tree, 0, "c", 0.4)
    with pytest.raises(ValueError, match=r"node 0 is full \(3 children, max_children=3\)"):
        tree.add_child(0, "d", "d", "idea")
    assert len(tree) == 4


def test_max_depth_limits_who_takes_children():
    tree = make(max_depth=2)
    a = child(tree, 0, "a", 0.6)
    b = child(tree, a, "b", 0.7)
    assert tree.node(b).depth == 2
    with pytest.raises(ValueError, match="node 2 is at depth 2, max_depth=2"):
        tree.add_child(b, "c", "c", "idea")


def test_only_evaluated_nodes_take_children():
    tree = make()
    pending = child(tree, 0, "p")
    failed = child(tree, 0, "f", failed=True)
    with pytest.raises(ValueError, match="node 1 is pending"):
        tree.add_child(pending, "x", "x", "idea")
    with pytest.raises(ValueError, match="node 2 is failed"):
        tree.add_child(failed, "x", "x", "idea")


def test_dedup_by_canonical_key():
    tree = make()
    a = child(tree, 0, "a")
    f = child(tree, 0, "f", failed=True)
    assert tree.has_key("root") == 0
    assert tree.has_key("a") == a and tree.has_key("f") == f
    assert tree.has_key("zzz") is None
    with pytest.raises(ValueError, match="key already in the tree at node 1"):
        tree.add_child(0, "a", "other text", "same arch")
    assert len(tree) == 3 and tree.node(0).children == [a, f]


@pytest.mark.parametrize("kw, match", [
    ({"policy": "mcts"}, "unknown policy 'mcts' \\(valid: dfs, bfs, best\\)"),
    ({"max_children": 0}, "max_children must be an int >= 1, got 0"),
    ({"max_depth": 0}, "max_depth must be an int >= 1, got 0"),
    ({"max_children": 2.0}, "max_children must be an int >= 1, got 2.0"),
])
def test_constructor_rejects_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        ModificationTree("root", "text", **kw)


# ------------------------------------------------------------------------- DFS

def test_dfs_descends_into_an_improving_child():
    tree = make("dfs")
    assert sel(tree) == 0
    a = child(tree, 0, "a", 0.6)  # improves on the root
    assert sel(tree) == a
    b = child(tree, a, "b", 0.7)  # improves on a
    assert sel(tree) == b


def test_dfs_stays_while_children_do_not_improve_then_backtracks():
    tree = make("dfs", max_children=3)
    a = child(tree, 0, "a", 0.6)
    assert sel(tree) == a
    child(tree, a, "a1", 0.55)
    assert sel(tree) == a  # a1 did not improve on a: keep modifying a
    child(tree, a, "a2", 0.6)  # equal is not an improvement
    assert sel(tree) == a
    child(tree, a, "a3", failed=True)
    assert sel(tree) == 0  # a is full with nothing improving: back to the root
    child(tree, 0, "b", 0.45)
    assert sel(tree) == 0
    c = child(tree, 0, "c", 0.9)
    assert sel(tree) == c


def test_dfs_backtracks_to_the_next_best_improving_sibling():
    tree = make("dfs", max_children=2)
    a = tree.add_child(0, "a", "a", "idea").id
    b = tree.add_child(0, "b", "b", "idea").id
    tree.record(a, 0.6)
    tree.record(b, 0.7)
    assert sel(tree) == b  # the best improving child first
    child(tree, b, "b1", 0.1)
    child(tree, b, "b2", 0.2)
    assert sel(tree) == a  # b exhausted: backtrack to the root, then the next improving child
    a1 = child(tree, a, "a1", 0.65)
    assert sel(tree) == a1


def test_dfs_goes_on_breadth_first_when_the_path_runs_dry_then_deep_again():
    """NADER's DFS then BFS: with the root and its improving child full and nothing improving, the
    shallowest evaluated node with room is next (the best-scoring first), and an improvement under
    it is followed depth first."""
    tree = make("dfs", max_children=2, max_depth=3)
    a = child(tree, 0, "a", 0.6)
    a1 = child(tree, a, "a1", 0.5)
    a2 = child(tree, a, "a2", 0.55)
    b = child(tree, 0, "b", 0.4)  # root full, its improving child a is full with no improvement
    assert sel(tree) == b  # depth 1 before a1/a2 at depth 2, although they score higher
    child(tree, b, "b1", 0.3)
    b2 = child(tree, b, "b2", 0.45)  # improves on b: deep from there
    assert sel(tree) == b2
    child(tree, b2, "b21", 0.1)
    child(tree, b2, "b22", 0.1)
    assert sel(tree) == a2  # b's branch dry: breadth first again, depth 2 by score
    child(tree, a2, "a21", 0.2)
    assert sel(tree) == a2
    child(tree, a2, "a22", 0.2)
    assert sel(tree) == a1


def test_dfs_exhausts_only_when_no_evaluated_node_has_room():
    tree = make("dfs", max_children=1, max_depth=2)
    a = child(tree, 0, "a", 0.4)  # no improvement
    assert sel(tree) == a  # the path ran dry at once: breadth first
    child(tree, a, "a1", failed=True)
    assert tree.select() is None  # a1 failed (no children), a at max children, root full


def test_dfs_depth_limit_is_respected():
    tree = make("dfs", max_children=2, max_depth=1)
    child(tree, 0, "a", 0.9)  # improving but at max depth: cannot be expanded
    assert sel(tree) == 0
    child(tree, 0, "b", 0.95)
    assert tree.select() is None


def test_dfs_commits_to_the_current_path():
    """A better node appearing elsewhere (batched evaluation) does not pull DFS off
    its branch; it is reached after backtracking."""
    tree = make("dfs", max_children=2)
    a = child(tree, 0, "a")
    b = child(tree, 0, "b")
    tree.record(a, 0.6)
    assert sel(tree) == a
    a1 = child(tree, a, "a1")
    tree.record(b, 0.9)  # better than a, but DFS is on a's branch
    assert sel(tree) == a
    child(tree, a, "a2", 0.55)
    tree.record(a1, 0.58)
    assert sel(tree) == b  # a exhausted: backtrack, then the better sibling


def test_dfs_reaches_improvements_recorded_after_the_cursor_moved_on():
    """A full improving child whose own child improved later (pending when the
    cursor backtracked) is still explored: liveness looks through the subtree."""
    tree = make("dfs", max_children=2)
    a = child(tree, 0, "a", 0.6)
    assert sel(tree) == a
    a1 = tree.add_child(a, "a1", "a1", "idea").id
    a2 = tree.add_child(a, "a2", "a2", "idea").id  # a is full, both children pending
    assert sel(tree) == 0  # nothing to do under a yet: backtrack
    b = child(tree, 0, "b", 0.3)
    assert sel(tree) == b  # root full; a full with no improving child yet: breadth first
    tree.record(a1, 0.7)
    tree.record(a2, 0.65)
    assert sel(tree) == b  # committed to b's branch while it has room
    child(tree, b, "b1", 0.1)
    child(tree, b, "b2", 0.1)
    assert sel(tree) == a1  # b dry: back up, and a (full) leads to an improving child with room
    assert tree.path(a1) == [0, a, a1]


# ------------------------------------------------------------------------- BFS

def test_bfs_goes_level_by_level():
    tree = make("bfs", max_children=2)
    assert sel(tree) == 0
    a = child(tree, 0, "a", 0.3)
    assert sel(tree) == 0
    b = child(tree, 0, "b", 0.7)
    assert sel(tree) == b  # depth 1, best score first (improving or not)
    b1 = child(tree, b, "b1", 0.9)
    assert sel(tree) == b  # still room at depth 1 before depth 2
    child(tree, b, "b2", 0.1)
    assert sel(tree) == a
    child(tree, a, "a1", failed=True)
    assert sel(tree) == a
    a2 = child(tree, a, "a2")  # pending: not selectable
    assert sel(tree) == b1
    tree.record(a2, 0.95)
    assert sel(tree) == a2  # same depth as b1: the higher score first


def test_bfs_ties_by_score_then_id():
    tree = make("bfs", max_children=3)
    a = child(tree, 0, "a", 0.5)
    b = child(tree, 0, "b", 0.8)
    c = child(tree, 0, "c", 0.8)
    assert sel(tree) == b  # 0.8 beats 0.5, lower id between equal scores
    child(tree, b, "b1", 0.1)
    child(tree, b, "b2", 0.1)
    b3 = child(tree, b, "b3", 0.99)
    assert sel(tree) == c  # depth 1 before b3 at depth 2
    for k in range(3):
        child(tree, c, f"c{k}", 0.1)
    assert sel(tree) == a
    for k in range(3):
        child(tree, a, f"a{k}", 0.1)
    assert sel(tree) == b3


def test_bfs_exhausts():
    tree = make("bfs", max_children=1, max_depth=2)
    a = child(tree, 0, "a", 0.1)
    assert sel(tree) == a
    child(tree, a, "b", 0.2)
    assert tree.select() is None


# -------------------------------------------------------------------- best-first

def test_best_first_picks_the_top_score_with_room():
    tree = make("best", max_children=2)
    a = child(tree, 0, "a", 0.4)
    assert sel(tree) == 0  # 0.5 > 0.4
    b = child(tree, 0, "b", 0.8)
    assert sel(tree) == b
    b1 = child(tree, b, "b1", 0.3)
    child(tree, b, "b2", failed=True)
    assert sel(tree) == a  # b and root full; a (0.4) beats b1 (0.3)
    a1 = child(tree, a, "a1", 0.3)  # ties with b1: lower id wins
    assert sel(tree) == a
    child(tree, a, "a2")  # pending
    assert sel(tree) == b1
    assert b1 < a1


def test_best_first_exhausts():
    tree = make("best", max_children=1, max_depth=1)
    child(tree, 0, "a", 0.9)
    assert tree.select() is None


# ---------------------------------------------------------------- state round trip

def restored(tree: ModificationTree) -> ModificationTree:
    state = json.loads(json.dumps(tree.state_dict()))
    clone = ModificationTree(tree.node(0).key, "ignored", policy=tree.policy,
                             max_children=tree.max_children, max_depth=tree.max_depth)
    clone.load_state_dict(state)
    return clone


def test_state_round_trip_keeps_the_dfs_cursor():
    tree = make("dfs", max_children=2)
    a = child(tree, 0, "a", 0.6)
    b = child(tree, 0, "b", 0.9)
    assert sel(tree) == b
    child(tree, b, "b1", 0.1)
    child(tree, b, "b2", 0.1)
    assert sel(tree) == a
    clone = restored(tree)
    assert clone.state_dict() == tree.state_dict()
    assert sel(clone) == sel(tree) == a
    assert clone.has_key("b1") == 3 and len(clone) == len(tree)
    assert clone.node(0).text == "block: root"


def test_state_dict_is_a_copy():
    tree = make()
    child(tree, 0, "a", 0.6)
    state = tree.state_dict()
    state["nodes"][0]["children"].append(99)
    state["nodes"][1]["info"]["x"] = 1
    assert tree.node(0).children == [1] and tree.node(1).info == {}
    clone = restored(tree)
    clone.add_child(1, "b", "b", "idea")
    assert tree.node(1).children == []


def apply(tree: ModificationTree, op: tuple[int, int, float], counter: list[int]) -> int | None:
    """One step of a random program; returns what `select()` said (or -1 when
    the step did not select)."""
    kind, pick, score = op
    pending = [n.id for n in (tree.node(i) for i in range(len(tree))) if n.status == "pending"]
    if kind == 0 or (kind == 1 and not pending):
        node = tree.select()
        check_selection(tree, None if node is None else node.id)
        if node is not None:
            counter[0] += 1
            tree.add_child(node.id, f"k{counter[0]}", "text", f"idea {counter[0]}", info={"n": counter[0]})
        return None if node is None else node.id
    if kind == 1:
        node_id = pending[pick % len(pending)]
        tree.record(node_id, None, failed=True) if score < 0.1 else tree.record(node_id, score)
        return -1
    roomy = [i for i in range(len(tree)) if tree.node(i).status == "evaluated"
             and len(tree.node(i).children) < tree.max_children and tree.node(i).depth < tree.max_depth]
    if roomy:
        counter[0] += 1
        tree.add_child(roomy[pick % len(roomy)], f"k{counter[0]}", "text", "side")
    return -1


OPS = st.tuples(st.integers(0, 2), st.integers(0, 50), st.floats(0.0, 1.0))


def check_selection(tree: ModificationTree, selected: int | None) -> None:
    roomy = [i for i in range(len(tree)) if tree.node(i).status == "evaluated"
             and len(tree.node(i).children) < tree.max_children and tree.node(i).depth < tree.max_depth]
    if selected is not None:
        assert selected in roomy
    elif tree.node(0).status == "evaluated":  # every policy ends only when no node has room
        assert roomy == []


@settings(max_examples=150, deadline=None)
@given(policy=st.sampled_from(POLICIES), max_children=st.integers(1, 3), max_depth=st.integers(1, 4),
       ops=st.lists(OPS, max_size=40), split=st.integers(0, 40), root_score=st.floats(0.0, 1.0))
def test_state_round_trip_replays_identically(policy, max_children, max_depth, ops, split, root_score):
    tree = make(policy, root_score=root_score, max_children=max_children, max_depth=max_depth)
    counter = [0]
    for op in ops[:split]:
        apply(tree, op, counter)
    clone = restored(tree)
    assert clone.state_dict() == tree.state_dict()
    clone_counter = list(counter)
    for op in ops[split:]:
        assert apply(clone, op, clone_counter) == apply(tree, op, counter)
    assert sel(clone) == sel(tree)
    assert clone.state_dict() == tree.state_dict()
    assert clone.to_dict() == tree.to_dict()


# ------------------------------------------------------------------ malformed state

def good_state() -> dict[str, Any]:
    tree = make("dfs", max_children=2)
    a = child(tree, 0, "a", 0.6)
    child(tree, a, "b")
    tree.select()
    return tree.state_dict()


def _set(path: tuple, value: Any):
    def edit(state: dict[str, Any]) -> dict[str, Any]:
        target = state
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        return state
    return edit


def _drop(path: tuple):
    def edit(state: dict[str, Any]) -> dict[str, Any]:
        target = state
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]
        return state
    return edit


BAD_STATES = [
    (lambda s: [], "expected a dict, got list"),
    (_drop(("cursor",)), r"missing keys \['cursor'\]"),
    (_set(("extra",), 1), r"unknown keys \['extra'\]"),
    (_set(("version",), 2), "version 2, expected 1"),
    (_set(("policy",), "bfs"), "policy is 'bfs' but this tree has 'dfs'"),
    (_set(("max_children",), 3), "max_children is 3 but this tree has 2"),
    (_set(("max_depth",), True), "max_depth is True but this tree has 8"),
    (_set(("nodes",), []), "'nodes' must be a non-empty list"),
    (_set(("nodes", 1), "node"), "node 1: expected a dict, got str"),
    (_drop(("nodes", 1, "info")), r"node 1: missing fields \['info'\]"),
    (_set(("nodes", 1, "colour"), "red"), r"node 1: unknown fields \['colour'\]"),
    (_set(("nodes", 1, "id"), 5), "node 1: id 5, expected 1"),
    (_set(("nodes", 1, "key"), 7), "node 1: key must be a string"),
    (_set(("nodes", 2, "key"), "a"), "node 2: duplicate key"),
    (_set(("nodes", 0, "key"), "other"), "root key differs"),
    (_set(("nodes", 1, "status"), "done"), "node 1: unknown status 'done'"),
    (_set(("nodes", 1, "score"), None), "node 1: evaluated with score None"),
    (_set(("nodes", 1, "score"), "0.6"), "node 1: evaluated with score '0.6'"),
    (_set(("nodes", 2, "score"), 0.3), "node 2: pending with score 0.3, expected null"),
    (_set(("nodes", 1, "depth"), -1), r"node 1: depth -1 must be an int >= 0"),
    (_set(("nodes", 1, "depth"), 2), "node 1: depth 2, expected 1"),
    (_set(("nodes", 0, "parent"), 1), r"node 0 must be the root"),
    (_set(("nodes", 1, "parent"), 1), "node 1: parent 1 must be the id of an earlier node"),
    (_set(("nodes", 1, "parent"), None), "node 1: parent None must be the id of an earlier node"),
    (_set(("nodes", 1, "children"), [3]), r"node 1: children \[3\], expected \[2\]"),
    (_set(("nodes", 1, "children"), "2"), "node 1: children must be a list of node ids"),
    (_set(("nodes", 1, "info"), []), "node 1: info must be a dict"),
    (_set(("cursor",), 9), "cursor 9 is not a node id"),
    (_set(("cursor",), 2), "cursor 2 points at a pending node"),
]


@pytest.mark.parametrize("edit, match", BAD_STATES)
def test_malformed_state_is_rejected_with_one_line(edit, match):
    tree = ModificationTree("root", "text", policy="dfs", max_children=2)
    before = tree.state_dict()
    with pytest.raises(ValueError, match=match) as info:
        tree.load_state_dict(edit(good_state()))
    message = str(info.value)
    assert message.startswith("modification tree state: ") and "\n" not in message
    assert tree.state_dict() == before  # unchanged on error


def test_state_rejects_children_of_unevaluated_nodes_and_over_limit_trees():
    state = good_state()
    state["nodes"][1]["status"], state["nodes"][1]["score"] = "pending", None
    state["cursor"] = 0
    tree = ModificationTree("root", "text", max_children=2)
    with pytest.raises(ValueError, match="node 2: parent 1 is pending"):
        tree.load_state_dict(state)

    small = ModificationTree("root", "text", max_children=1)
    state = good_state()
    state["max_children"] = 1
    state["nodes"][0]["children"] = [1, 2]
    state["nodes"][2]["parent"], state["nodes"][2]["depth"] = 0, 1
    state["nodes"][1]["children"] = []
    with pytest.raises(ValueError, match="node 0: 2 children exceed max_children=1"):
        small.load_state_dict(state)

    shallow = ModificationTree("root", "text", max_children=2, max_depth=1)
    state = good_state()
    state["max_depth"] = 1
    with pytest.raises(ValueError, match="node 2: depth 2 exceeds max_depth=1"):
        shallow.load_state_dict(state)


def test_good_state_loads():
    tree = ModificationTree("root", "text", policy="dfs", max_children=2)
    state = good_state()
    tree.load_state_dict(copy.deepcopy(state))
    assert tree.state_dict() == state
