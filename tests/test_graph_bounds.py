"""The trusted worker's own bookkeeping on a child's graph is bounded before it runs (issue 49):
the parser counts what a dry run will cost (nodes, operands, an einsum's tensors) and refuses past
its caps, a splitting operator's outputs are counted before it makes them, fvcore's factorial
einsum counter never sees a graph, the parent comparison is linear past a size, and each phase
of the worker (unpacking, the dry run) runs on a clock its size sets."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
from torch import nn

from nas.measure import _HANDLES, count_flops, einsum_macs
from nas.sandbox import graph as graph_module
from nas.sandbox.aten_ops import MAX_PIECES
from nas.sandbox.graph import (
    EINSUM_OPERAND_COST,
    FORMAT,
    MAX_COST,
    MAX_EINSUM_OPERANDS,
    MAX_NODE_OPERANDS,
    MAX_STRING,
    NODE_COST,
    Artifact,
    GraphError,
    GraphNet,
    compare,
    export_graph,
    pack,
)

X = {"ref": 0}


def node(op: str, *args: object, **kwargs: object) -> dict:
    return {"op": op, "args": list(args), "kwargs": {"map": kwargs}}


def net(nodes: list[dict], shape: tuple[int, int, int] = (3, 4, 4)) -> GraphNet:
    """Both graphs `nodes` over the user input, returning the last node's value."""
    program = {"inputs": [{"kind": "USER_INPUT", "target": None}], "nodes": nodes, "outputs": [{"ref": len(nodes)}]}
    return GraphNet(Artifact({"format": FORMAT, "input_shape": list(shape), "train": program, "eval": program},
                             {"init": {}, "const": {}}))


def _einsum(operands: int) -> dict:
    return node("aten.einsum.default", ",".join(["abcd"] * operands) + "->abcd", [X] * operands)


def test_a_graph_costs_what_its_nodes_operands_and_einsums_say() -> None:
    """`cost`: NODE_COST a node, 1 an operand (a reference, a literal), EINSUM_OPERAND_COST an
    einsum's tensor, 1 a graph input; per graph, checked as it is parsed."""
    g = net([node("aten.relu.default", X), _einsum(3), node("aten.add.Tensor", {"ref": 1}, 2)])
    per_graph = 1 + (NODE_COST + 1) + (NODE_COST + 1 + 3 * EINSUM_OPERAND_COST) + (NODE_COST + 2)
    assert g.cost == 2 * per_graph
    assert g.dry_run_seconds(256) == graph_module.BOOKKEEPING_SECONDS + 2 * g.cost * graph_module.DRY_RUN_SECONDS_PER_UNIT


@pytest.mark.parametrize("nodes, error", [
    ([node("aten.cat.default", [X] * MAX_NODE_OPERANDS, 0)],
     rf"^graph node 0 \(aten\.cat\.default\) takes {MAX_NODE_OPERANDS + 1:,} operands, over the "
     rf"{MAX_NODE_OPERANDS:,} a node may take$"),
    ([_einsum(MAX_EINSUM_OPERANDS + 1)],
     rf"^graph node 0 \(aten\.einsum\.default\) contracts {MAX_EINSUM_OPERANDS + 1} tensors, over the "
     rf"{MAX_EINSUM_OPERANDS} an einsum may take$"),
    # einsums within their own bound, past the graph's once each tensor counts EINSUM_OPERAND_COST
    ([_einsum(MAX_EINSUM_OPERANDS)] * (MAX_COST // (MAX_EINSUM_OPERANDS * EINSUM_OPERAND_COST) + 1),
     rf"^graph's dry run would cost over {MAX_COST:,} units \(at node \d+, aten\.einsum\.default: .*bounded "
     "before it runs$"),
    ([node("aten.relu.default", {"ref": i}) for i in range(MAX_COST // NODE_COST)],
     rf"^graph's dry run would cost over {MAX_COST:,} units \(at node \d+, aten\.relu\.default"),
    ([node("aten.einsum.default", "a" * (MAX_STRING - 2) + "->a", [X])],
     rf"^graph node 0 \(aten\.einsum\.default\) takes a string of {MAX_STRING + 1} characters"),
], ids=["node operands", "einsum operands", "einsum cost", "nodes", "string"])
def test_a_dry_run_past_the_parsers_bounds_is_refused_before_it_runs(nodes: list[dict], error: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """What the dry run will cost is counted as the graph is parsed: past a bound, one line and
    nothing run (the meta run of the hostile einsum graphs took hours)."""
    monkeypatch.setattr(GraphNet, "_meta_run", lambda *a: pytest.fail("ran the graph"))
    with pytest.raises(GraphError, match=error):
        net(nodes)


def test_the_bounds_let_through_what_they_name() -> None:
    """One below each bound parses (the caps are the refusals, not something tighter)."""
    net([node("aten.cat.default", [X] * (MAX_NODE_OPERANDS - 1))])
    net([_einsum(MAX_EINSUM_OPERANDS)])
    net([node("aten.einsum.default", "a" * (MAX_STRING - 3) + "->a", [X])])


def test_a_splitting_operator_is_refused_before_it_makes_its_pieces() -> None:
    """`unbind` of the flattened batch (12,288 values at batch 256) would make 12,288 tensors, a cost
    its elements do not show: refused before it runs, in the dry run at the training batch."""
    g = net([node("aten.reshape.default", X, [-1]), node("aten.unbind.int", {"ref": 1}),
             node("operator.getitem", {"ref": 2}, 0)])
    assert g.dry_run(2, 1 << 30)[0] == []  # 96 pieces at batch 2
    began = time.monotonic()
    with pytest.raises(GraphError, match=rf"graph node 1 \(aten\.unbind\.int\) would return 12,288 tensors, "
                                         rf"over the {MAX_PIECES:,} an operator may return"):
        g.dry_run(2, 1 << 30, 256)
    assert time.monotonic() - began < 30


def _alarm(seconds: int):
    def ring(signum, frame):
        raise TimeoutError(f"over {seconds} s")
    signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)


@pytest.mark.parametrize("equation, shapes", [
    ("bij,bjk->bik", [[2, 3, 4], [2, 4, 5]]), ("i,j->ij", [[7], [9]]), ("ij,ij->ij", [[3, 4], [3, 4]]),
    ("ij->", [[3, 4]]), ("...ij,...jk->...ik", [[2, 3, 4, 5], [3, 5, 6]]), ("ij,jk", [[3, 4], [4, 5]]),
    ("abc,abd->acd", [[2, 3, 4], [2, 3, 5]]), ("ij,jk,kl->il", [[3, 4], [4, 5], [5, 6]])])
def test_einsum_is_counted_as_fvcore_counts_it(equation: str, shapes: list[list[int]]) -> None:
    """`einsum_macs` is numpy's count of the contraction, halved, as fvcore's own handle gives it
    (numpy adds one to its optimised count and prints it to four digits: within that)."""
    numpy = next(float(line.split(":")[-1]) for line in np.einsum_path(
        equation, *[np.zeros(s) for s in shapes], optimize="optimal")[1].split("\n") if "optimized flop" in line.lower())
    assert abs(einsum_macs(equation, shapes) - numpy // 2) <= max(1, numpy * 5e-4)


def test_fvcores_factorial_einsum_counter_never_runs_on_a_graph() -> None:
    """A graph of einsums of MAX_EINSUM_OPERANDS empty tensors (free to run) is counted in seconds,
    0 FLOPs: fvcore's own handle would search numpy's optimal path over 16 operands for hours."""
    assert _HANDLES["aten::einsum"].__module__ == "nas.measure"
    equation = ",".join(["a"] * MAX_EINSUM_OPERANDS) + "->a"
    empty = node("aten.new_zeros.default", X, [0])
    nodes = [empty] + [node("aten.einsum.default", equation, [{"ref": 1}] * MAX_EINSUM_OPERANDS)] * 3
    g = net(nodes + [node("aten.sum.default", {"ref": len(nodes)})])
    _alarm(60)
    try:
        assert count_flops(g, (1, 3, 4, 4)) == 0
    finally:
        signal.alarm(0)


class Deep(nn.Module):
    def __init__(self, ops: list[str]) -> None:
        super().__init__()
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for op in self.ops:
            x = getattr(torch, op)(x)
        return x.mean((2, 3))


def test_comparing_with_the_parent_is_exact_when_small_and_linear_when_large(monkeypatch: pytest.MonkeyPatch) -> None:
    """`compare` diffs the operations between the graphs' common start and end (difflib, quadratic)
    up to MAX_DIFF_PAIRS pairs; past them, it counts the operations one has and the other lacks."""
    def rebuilt(ops: list[str]) -> GraphNet:
        m = Deep(ops)
        graph = export_graph(m, torch.randn(2, 3, 4, 4))
        return GraphNet(graph_module.unpack(pack(graph, {"init": {}, "const": graph.pop("constants")}), 1 << 30))

    parent = rebuilt(["relu", "sigmoid", "tanh", "relu", "sigmoid"])
    child = rebuilt(["relu", "tanh", "tanh", "relu", "abs", "sigmoid"])
    assert compare(parent, child) == (True, 2)
    monkeypatch.setattr(graph_module, "MAX_DIFF_PAIRS", 1)  # the linear count, where difflib's would be exact
    assert compare(parent, child) == (True, 2)
    assert compare(parent, parent) == (False, 0)


WORKER = textwrap.dedent("""
    import io, json, sys, torch
    from torch import nn
    from nas.sandbox import graph, trusted_worker
    from nas.sandbox.graph import export_graph, pack

    class Deep(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 10)

        def forward(self, x):
            for _ in range(50):
                x = torch.relu(x)
            return self.fc(x.mean((2, 3)))

    graph.BOOKKEEPING_SECONDS, graph.DRY_RUN_SECONDS_PER_UNIT = float(sys.argv[1]), 0.0
    net = Deep()
    data = export_graph(net, torch.randn(2, 3, 8, 8))
    artifact = pack(data, {"init": dict(net.state_dict()), "const": data.pop("constants")})
    request = {"num_classes": 10, "input_shape": [2, 3, 8, 8], "memory_mb": 1024, "with_parent": False,
               "batch": 256, "seeds": []}
    trusted_worker._check(request, artifact, 1)
""")


def test_each_phase_of_the_worker_has_its_own_clock() -> None:
    """The worker's check with its clocks at 0.05 s a phase: its unpacking or its dry run (50 nodes
    at two batch sizes, a second) is out of time, one failed verdict saying which (with the clocks'
    30 s floor, every check in tests/test_trusted_worker.py passes them)."""
    out = subprocess.run([sys.executable, "-c", WORKER, "0.05"], capture_output=True, text=True, timeout=600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    verdict = json.loads(lines[-1])["verdict"]
    assert (verdict["ok"], verdict["stage"]) == (False, "limits")
    assert re.fullmatch(r"limits: refused: the parent's check of the graph exceeded its clock for (unpacking its "
                        r"[\d,]+ bytes|its dry run \(a cost of [\d,]+\)) \(0 s\)", verdict["error"]), verdict["error"]
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_phase_clock_stops_and_leaves_the_work_its_own_limits() -> None:
    """`_phase(None)` stops a phase's clock: no alarm, no CPU soft limit, default signal actions (the
    counted work's CPU limit kills with SIGXCPU, as the parent expects)."""
    script = textwrap.dedent("""
        import resource, signal, time
        from nas.sandbox import trusted_worker as w
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        w._phase("a phase", 0.2, 1)
        assert signal.getsignal(signal.SIGALRM) is w._out_of_time
        w._phase(None, 0.0, 1)
        time.sleep(0.4)
        assert resource.getrlimit(resource.RLIMIT_CPU) == (hard, hard)
        assert signal.getsignal(signal.SIGXCPU) == signal.SIG_DFL == signal.getsignal(signal.SIGALRM)
        w._phase("another", 0.1, 1)
        try:
            while True:
                pass
        except w._OutOfTime:
            print("out of time")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "out of time", out.stderr[-2000:]
