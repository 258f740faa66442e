"""NADER's network modification tree (Yang et al., 2025) as a plain data structure.

The root is the base block (e.g. a ResNet basic block); every other node is a
block designed by modifying its parent with one idea. A node is *pending* until
its block has been trained, then *evaluated* (with a score, higher is better)
or *failed* (no score). Each iteration the Proposer asks `select()` for the
node to modify next, adds the modification with `add_child()` and, once it is
trained, reports it with `record()`.

Only evaluated nodes can take children, and a node has *room* when it is
evaluated, has fewer than `max_children` children (pending and failed children
count: each was a try) and is shallower than `max_depth` (the root has depth 0).

Policies for `select()`:

* ``"dfs"`` (NADER: depth first along improving nodes, breadth first when that
  path runs dry). The tree keeps a cursor on the current path. A node is *live*
  when it has room or one of its improving children (evaluated, score strictly
  above its parent's) is live. From the cursor: descend into the best live
  improving child (highest score, then lowest id) and repeat; if there is none,
  select the cursor's node when it has room; otherwise backtrack to its parent
  and repeat. At a root that is not live the depth-first path has run dry: the
  shallowest evaluated node with room is selected (as ``"bfs"``) and the cursor
  moves there, so an improving child of it is followed depth first again. The
  tree is exhausted (`None`) only when no evaluated node has room: a search
  gets as many designs as it asks for unless `max_children`/`max_depth` (or
  failures everywhere) end it.
* ``"bfs"``: the shallowest node with room; ties by higher score, then lower id.
* ``"best"``: best first, the highest-scoring node with room; ties by lower id.

`select()` returns `None` until the root is evaluated: the caller trains the
base block first and reports it with `record(0, score)`. So `None` means
"exhausted" only once the root is evaluated (a failed root exhausts the tree)
and, while children are still pending, only until they are recorded (an
improving child can reopen the search).

The state is JSON-serialisable (`state_dict()`); restoring it with
`load_state_dict()` makes the next `select()` identical.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeGuard

POLICIES = ("dfs", "bfs", "best")
STATUSES = ("pending", "evaluated", "failed")
STATE_VERSION = 1


@dataclass
class Node:
    id: int
    parent: int | None
    key: str  # canonical architecture key, unique in the tree
    text: str  # the block file / encoding
    idea: str = ""  # the modification that made this node from its parent
    score: float | None = None  # None until evaluated; failures keep None
    status: str = "pending"  # "pending" | "evaluated" | "failed"
    depth: int = 0
    children: list[int] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # JSON-serialisable extras


_NODE_FIELDS = tuple(f.name for f in fields(Node))


class ModificationTree:
    """The modification tree and its selection policy (see the module docstring)."""

    def __init__(self, root_key: str, root_text: str, *, policy: str = "dfs",
                 max_children: int = 3, max_depth: int = 8) -> None:
        if policy not in POLICIES:
            raise ValueError(f"modification tree: unknown policy {policy!r} (valid: {', '.join(POLICIES)})")
        for name, value in (("max_children", max_children), ("max_depth", max_depth)):
            if not _is_int(value) or value < 1:
                raise ValueError(f"modification tree: {name} must be an int >= 1, got {value!r}")
        self.policy = policy
        self.max_children = max_children
        self.max_depth = max_depth
        self._nodes: list[Node] = [Node(0, None, root_key, root_text)]
        self._by_key: dict[str, int] = {root_key: 0}
        self._cursor = 0  # dfs only: the deepest node of the current path

    def __len__(self) -> int:
        return len(self._nodes)

    def node(self, node_id: int) -> Node:
        """The node with this id (treat it as read-only)."""
        if not _is_int(node_id) or not 0 <= node_id < len(self._nodes):
            raise ValueError(f"modification tree: no node {node_id!r}")
        return self._nodes[node_id]

    # ----------------------------------------------------------------- growth

    def add_child(self, parent_id: int, key: str, text: str, idea: str,
                  info: dict[str, Any] | None = None) -> Node:
        """Add a pending modification of `parent_id`; raises ValueError when the
        parent has no room or `key` is already in the tree (see `has_key`)."""
        parent = self.node(parent_id)
        if parent.status != "evaluated":
            raise ValueError(f"modification tree: node {parent_id} is {parent.status}; "
                             f"only evaluated nodes take children")
        if len(parent.children) >= self.max_children:
            raise ValueError(f"modification tree: node {parent_id} is full "
                             f"({len(parent.children)} children, max_children={self.max_children})")
        if parent.depth >= self.max_depth:
            raise ValueError(f"modification tree: node {parent_id} is at depth {parent.depth}, "
                             f"max_depth={self.max_depth}")
        if key in self._by_key:
            raise ValueError(f"modification tree: key already in the tree at node {self._by_key[key]}")
        info = {} if info is None else info
        try:
            info = json.loads(json.dumps(info))
        except (TypeError, ValueError) as err:
            raise ValueError(f"modification tree: info is not JSON-serialisable ({err})") from None
        child = Node(len(self._nodes), parent_id, key, text, idea, depth=parent.depth + 1, info=info)
        self._nodes.append(child)
        self._by_key[key] = child.id
        parent.children.append(child.id)
        return child

    def record(self, node_id: int, score: float | None, failed: bool = False) -> None:
        """Report a pending node's result: a finite score, or `None` with `failed=True`."""
        node = self.node(node_id)
        if node.status != "pending":
            raise ValueError(f"modification tree: node {node_id} is already {node.status}")
        if failed:
            if score is not None:
                raise ValueError(f"modification tree: node {node_id}: a failed node has no score, got {score!r}")
            node.status = "failed"
            return
        if not _is_finite(score):
            raise ValueError(f"modification tree: node {node_id}: score must be a finite number, got {score!r} "
                             f"(record failures with failed=True)")
        node.score = float(score)
        node.status = "evaluated"

    # ---------------------------------------------------------------- queries

    def has_key(self, key: str) -> int | None:
        """Id of the node (of any status) holding this canonical key, else None."""
        return self._by_key.get(key)

    def best(self) -> Node | None:
        """The highest-scoring evaluated node (lowest id on ties); None if none."""
        done = [n for n in self._nodes if n.status == "evaluated"]
        return min(done, key=lambda n: (-_scored(n), n.id)) if done else None

    def path(self, node_id: int) -> list[int]:
        """Node ids from the root down to `node_id`."""
        node = self.node(node_id)
        out = [node.id]
        while node.parent is not None:
            node = self._nodes[node.parent]
            out.append(node.id)
        return out[::-1]

    def improved(self, node_id: int) -> bool | None:
        """Whether the node scored strictly above its parent; None for the root
        or while either is not evaluated."""
        node = self.node(node_id)
        if node.parent is None or node.status != "evaluated":
            return None
        parent = self._nodes[node.parent]
        return _scored(node) > _scored(parent) if parent.status == "evaluated" else None

    # -------------------------------------------------------------- selection

    def select(self) -> Node | None:
        """The node to modify next under the policy; None before the root is
        evaluated and once the tree is exhausted."""
        if self._nodes[0].status != "evaluated":
            return None
        if self.policy == "dfs":
            node = self._select_dfs()
            if node is None and (node := self._select_bfs()) is not None:
                self._cursor = node.id  # the path runs dry: go on breadth first, then deep again from there
            return node
        if self.policy == "bfs":
            return self._select_bfs()
        open_ = [n for n in self._nodes if self._has_room(n)]
        return min(open_, key=lambda n: (-_scored(n), n.id)) if open_ else None

    def _select_bfs(self) -> Node | None:
        open_ = [n for n in self._nodes if self._has_room(n)]
        return min(open_, key=lambda n: (n.depth, -_scored(n), n.id)) if open_ else None

    def _has_room(self, node: Node) -> bool:
        return (node.status == "evaluated" and len(node.children) < self.max_children
                and node.depth < self.max_depth)

    def _improving_children(self, node: Node) -> list[Node]:
        kids = (self._nodes[c] for c in node.children)
        return [k for k in kids if k.status == "evaluated" and _scored(k) > _scored(node)]

    def _select_dfs(self) -> Node | None:
        live = [False] * len(self._nodes)
        for node in reversed(self._nodes):  # children have larger ids than their parent
            live[node.id] = self._has_room(node) or any(live[k.id] for k in self._improving_children(node))
        node = self._nodes[self._cursor]
        while True:
            ahead = [k for k in self._improving_children(node) if live[k.id]]
            if ahead:
                node = min(ahead, key=lambda k: (-_scored(k), k.id))
            elif live[node.id]:  # live without a live improving child: it has room
                self._cursor = node.id
                return node
            elif node.parent is None:
                self._cursor = 0
                return None
            else:
                node = self._nodes[node.parent]

    # ------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        """A summary for reports: the policy, the best node id and every node's
        id, parent, depth, score, status and idea."""
        best = self.best()
        return {
            "policy": self.policy,
            "best": None if best is None else best.id,
            "nodes": [{"id": n.id, "parent": n.parent, "depth": n.depth, "score": n.score,
                       "status": n.status, "idea": n.idea} for n in self._nodes],
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (a copy)."""
        return {
            "version": STATE_VERSION,
            "policy": self.policy,
            "max_children": self.max_children,
            "max_depth": self.max_depth,
            "cursor": self._cursor,
            "nodes": [asdict(n) for n in self._nodes],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output from a tree built with the same root key,
        policy and limits; raises ValueError naming the first problem and leaves
        the tree unchanged then."""
        nodes, cursor = self._check_state(state)
        self._nodes = nodes
        self._by_key = {n.key: n.id for n in nodes}
        self._cursor = cursor

    def _check_state(self, state: Any) -> tuple[list[Node], int]:
        def bad(msg: str) -> ValueError:
            return ValueError(f"modification tree state: {msg}")

        if not isinstance(state, dict):
            raise bad(f"expected a dict, got {type(state).__name__}")
        expected = {"version", "policy", "max_children", "max_depth", "cursor", "nodes"}
        if set(state) != expected:
            missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
            raise bad(f"missing keys {missing}" if missing else f"unknown keys {extra}")
        if state["version"] != STATE_VERSION:
            raise bad(f"version {state['version']!r}, expected {STATE_VERSION}")
        for name in ("policy", "max_children", "max_depth"):
            if state[name] != getattr(self, name) or type(state[name]) is not type(getattr(self, name)):
                raise bad(f"{name} is {state[name]!r} but this tree has {getattr(self, name)!r}")
        raw = state["nodes"]
        if not isinstance(raw, list) or not raw:
            raise bad("'nodes' must be a non-empty list")
        nodes: list[Node] = []
        keys: set[str] = set()
        for i, item in enumerate(raw):
            node = _check_node(i, item, bad)
            if node.key in keys:
                raise bad(f"node {i}: duplicate key")
            keys.add(node.key)
            if i == 0:
                if node.parent is not None or node.depth != 0:
                    raise bad("node 0 must be the root (parent null, depth 0)")
                if node.key != self._nodes[0].key:
                    raise bad("root key differs from this tree's root key")
            else:
                if not _is_int(node.parent) or not 0 <= node.parent < i:
                    raise bad(f"node {i}: parent {node.parent!r} must be the id of an earlier node")
                parent = nodes[node.parent]
                if parent.status != "evaluated":
                    raise bad(f"node {i}: parent {parent.id} is {parent.status}")
                if node.depth != parent.depth + 1:
                    raise bad(f"node {i}: depth {node.depth}, expected {parent.depth + 1}")
                if node.depth > self.max_depth:
                    raise bad(f"node {i}: depth {node.depth} exceeds max_depth={self.max_depth}")
            nodes.append(node)
        for node in nodes:
            expected_kids = [n.id for n in nodes if n.parent == node.id]
            if node.children != expected_kids:
                raise bad(f"node {node.id}: children {node.children!r}, expected {expected_kids!r}")
            if len(node.children) > self.max_children:
                raise bad(f"node {node.id}: {len(node.children)} children exceed max_children={self.max_children}")
        cursor = state["cursor"]
        if not _is_int(cursor) or not 0 <= cursor < len(nodes):
            raise bad(f"cursor {cursor!r} is not a node id")
        if cursor != 0 and nodes[cursor].status != "evaluated":
            raise bad(f"cursor {cursor} points at a {nodes[cursor].status} node")
        return nodes, cursor


def _check_node(i: int, item: Any, bad: Callable[[str], ValueError]) -> Node:
    if not isinstance(item, dict):
        raise bad(f"node {i}: expected a dict, got {type(item).__name__}")
    if set(item) != set(_NODE_FIELDS):
        missing, extra = sorted(set(_NODE_FIELDS) - set(item)), sorted(set(item) - set(_NODE_FIELDS))
        raise bad(f"node {i}: missing fields {missing}" if missing else f"node {i}: unknown fields {extra}")
    if item["id"] != i or not _is_int(item["id"]):
        raise bad(f"node {i}: id {item['id']!r}, expected {i}")
    for name in ("key", "text", "idea"):
        if not isinstance(item[name], str):
            raise bad(f"node {i}: {name} must be a string")
    if item["status"] not in STATUSES:
        raise bad(f"node {i}: unknown status {item['status']!r}")
    score = item["score"]
    if item["status"] == "evaluated" and not _is_finite(score):
        raise bad(f"node {i}: evaluated with score {score!r}, expected a finite number")
    if item["status"] != "evaluated" and score is not None:
        raise bad(f"node {i}: {item['status']} with score {score!r}, expected null")
    if not _is_int(item["depth"]) or item["depth"] < 0:
        raise bad(f"node {i}: depth {item['depth']!r} must be an int >= 0")
    if not isinstance(item["children"], list) or not all(_is_int(c) for c in item["children"]):
        raise bad(f"node {i}: children must be a list of node ids")
    if not isinstance(item["info"], dict):
        raise bad(f"node {i}: info must be a dict")
    return Node(id=i, parent=item["parent"], key=item["key"], text=item["text"], idea=item["idea"],
                score=None if score is None else float(score), status=item["status"],
                depth=item["depth"], children=list(item["children"]), info=copy.deepcopy(item["info"]))


def _scored(node: Node) -> float:
    """An evaluated node's score (`record` sets both; only evaluated nodes are compared)."""
    if node.score is None:
        raise ValueError(f"modification tree: node {node.id} is {node.status}, it has no score")
    return node.score


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
