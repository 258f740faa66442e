"""Fast twins of the slow-only checks of the trusted side (tests/test_sandbox.py, test_trusted_worker.py,
test_cli_arch.py): the same assertion on a two-layer conv net at 8x8, so `pytest -m 'not slow'` fails on a
slip in the sandbox child, its limits and policy, the verdict's handling or the hand-over of a kept hash.

The sandboxed cases run once, two at a time, in a module-scoped fixture (each a child and a trusted worker
importing torch, ~3 CPU s); the tests assert on their verdicts. Where a slow test makes the same check on a
larger net, the docstring names it; where none is named, this file is the check."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from nas.measure import count_flops, count_params
from nas.sandbox import Limits, Verdict, verify
from nas.sandbox.graph import GraphNet, export_graph, graph_hash, pack, unpack
from nas.sandbox.verify import train_model_source, verify_model_source
from nas.spaces.nader.network import network_source
from support.sources import TINY, hidden_products, matrix_products

SHAPE = (2, 3, 8, 8)
FORWARD = "        x = torch.relu(self.conv(x))\n"
RETURN = "return self.fc(x.mean((2, 3)))"
AT_FORWARD = TINY.splitlines().index(FORWARD.rstrip("\n")) + 1  # the line `in_forward`'s code starts on
AT_IMPORT = len(TINY.splitlines()) + 2  # the line `at_import`'s code starts on
RETURN_LINE = AT_FORWARD + 1
# Roomy wall clocks for a loaded 2-core machine; only "sleep" is meant to hit its own, the loops their 1 s of CPU.
FAST = Limits(wall_s=180, cpu_s=30, memory_mb=512)
LOOP = Limits(wall_s=60, cpu_s=1, memory_mb=512)
# forge_carried_select_table's export traces 32,768 select nodes: ~26 CPU s on an idle core, over FAST's 30
# on CI's loaded two (stage "limits" instead of the parent's "graph" refusal this test is about).
EXPORT_HEAVY = Limits(wall_s=300, cpu_s=120, memory_mb=512)
SECRET = "sk-must-not-leak-fast"
TRAIN = {"data": {"name": "digits"}, "num_classes": 10, "input_shape": SHAPE,
         "recipe": {"epochs": 1, "batch_size": 64}, "engine": {"kind": "fast"}, "seeds": [0]}


def in_forward(code: str) -> str:
    """TINY with `code` run at the start of forward (line AT_FORWARD on)."""
    return TINY.replace(FORWARD, "".join(f"        {line}\n" for line in code.splitlines()) + FORWARD)


def at_import(code: str) -> str:
    """TINY with `code` appended at module level (line AT_IMPORT on)."""
    return TINY + "\n" + code + "\n"


def tiny_hash(source: str = TINY) -> str:
    """The graph hash of `source`'s network exported here at SHAPE (our own source: fine to run)."""
    namespace: dict = {}
    exec(compile(source, "tiny.py", "exec"), namespace)
    net = namespace["Network"](num_classes=10)
    graph = export_graph(net, torch.randn(SHAPE))
    art = unpack(pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants")}), 1 << 30)
    return graph_hash(GraphNet(art), art.graph)


HOSTILE = Path(__file__).parent / "hostile"
# tests/hostile/ files whose defence is the parent's own check of what the child sent, and the four
# test_terminal_safe.py runs through `nas arch validate` on a non-UTF-8 terminal.
FORGES = ["forge_isfinite", "forge_carried_select_table", "forge_count_params", "forge_report_request_fd",
          "forge_tensor_numel"]
TERMINAL = ["proto_surrogate_exception", "proto_surrogate_export_error", "spoof_bidi_exception",
            "spoof_zero_width_verdict"]
HOSTILE_CASES = FORGES + TERMINAL
KERNEL5 = TINY.replace("nn.Conv2d(3, 4, 3, padding=1)", "nn.Conv2d(3, 4, 5, padding=2)")


def compiled_plan():
    """A NADER block file compiled at width 16 for one block a stage at 8x8 (tests/test_dag_compile.py's at 32)."""
    from nas.spaces.nader.dag.macro import BlockSet, Skeleton, plan

    blocks = BlockSet.from_text((Path(__file__).parent / "data" / "blocks" / "shuffle_se.txt").read_text())
    return plan(blocks, Skeleton.nb201(n=1, input_size=8), 16)


def cases(outside: Path) -> dict:
    """name -> (source, limits, parent source)."""
    plain = {
        "valid": TINY,
        "torchvision": at_import("import torchvision.ops\nassert torchvision.ops.StochasticDepth(0.1, 'row')"),
        "import_loop": at_import("while True:\n    pass"),
        "empty_huge": at_import("torch.empty(10**12)"),
        "alloc_600mb": in_forward("big = torch.ones(15 * 10**7)"),  # fine without the 512 MB cap
        "list_grow": at_import("junk = []\nwhile True:\n    junk.append(bytearray(10**8))"),
        "file_size": in_forward("open('big.bin', 'wb').write(b'x' * (32 << 20))"),
        "swallowed_loop": at_import("import os\ntry:\n    os.system('true')\nexcept Exception:\n    pass\n"
                                    "while True:\n    pass"),
        "write_outside": in_forward(f"open('{outside}/escape.txt', 'w').write('x')"),
        "sys_exit": at_import("import sys\nsys.exit(0)"),
        "os_exit_after_flood": in_forward("import os\nfor _ in range(20):\n    print('x' * 10**6)\nos._exit(0)"),
        "no_network": TINY.replace("class Network", "class Net"),
        "wrong_shape": TINY.replace("nn.Linear(4, num_classes)", "nn.Linear(4, num_classes + 1)"),
        "mismatch": TINY.replace("nn.Linear(4, num_classes)", "nn.Linear(2, num_classes)"),
        "detached": TINY.replace(RETURN, RETURN + ".detach()"),
        "nan": TINY.replace(RETURN, RETURN + " * float('nan')"),
        "env": in_forward("import os\nraise RuntimeError(os.environ.get('OPENAI_API_KEY', 'no key'))"),
    }
    runs = {name: (src, LOOP if name.endswith("_loop") else FAST, None) for name, src in plain.items()}
    runs["sleep"] = (in_forward("import time\ntime.sleep(120)"), Limits(wall_s=8, cpu_s=5), None)
    runs["vs_kernel5"] = (KERNEL5, FAST, TINY)
    runs["vs_broken_parent"] = (TINY, FAST, TINY.replace("class Network", "class Net"))
    runs["compiled"] = (network_source(compiled_plan()), FAST, None)
    for name in HOSTILE_CASES:  # templates without placeholders (but in their comments): run as they are
        limits = EXPORT_HEAVY if name == "forge_carried_select_table" else FAST
        runs[f"hostile_{name}"] = ((HOSTILE / f"{name}.py").read_text(encoding="utf-8"), limits, None)
    return runs


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("outside-sandbox")


TRAINED: list[tuple] = []  # (graph hash, label) of each verdict `train_model_source` handed on to training


def _trained(verdict: Verdict, *args, **kwargs) -> tuple[Verdict, list]:
    """`train_graphs` (training itself is not what these tests check): records what it was handed."""
    TRAINED.append((verdict.graph, kwargs["label"]))
    return verdict, ["trained"]


@pytest.fixture(scope="module")
def verdicts(outside: Path) -> dict[str, Verdict]:
    runs = cases(outside)
    kept = tiny_hash()  # what a check of TINY keeps
    with pytest.MonkeyPatch.context() as mp, ThreadPoolExecutor(2) as pool:
        mp.setenv("OPENAI_API_KEY", SECRET)
        mp.setattr(verify, "train_graphs", _trained)
        futures = {name: pool.submit(verify_model_source, src, input_shape=SHAPE, limits=limits,
                                     parent_source=parent)
                   for name, (src, limits, parent) in runs.items()}
        futures |= {f"train_{name}": pool.submit(train_model_source, src, checked=kept, limits=FAST, **TRAIN)
                    for name, src in (("same", TINY), ("other", KERNEL5))}
        return {name: f.result() for name, f in futures.items()}


def test_a_tiny_valid_net_is_measured_like_in_process(verdicts: dict[str, Verdict]) -> None:
    """Twin of test_sandbox.py::test_valid_cnn_measured_like_in_process: the verdict's numbers are what
    this process counts on the same network, and its graph hash is the graph's."""
    v = verdicts["valid"]
    namespace: dict = {}
    exec(compile(TINY, "tiny.py", "exec"), namespace)
    net = namespace["Network"](num_classes=10)
    assert (v.ok, v.stage, v.error, v.output_shape, v.self_reported) == (True, "done", None, [2, 10], False)
    assert (v.params, v.flops, v.layers) == (count_params(net), count_flops(net, (1, 3, 8, 8)), 2)
    assert v.graph == tiny_hash()
    assert v.wall_s > 0


def test_installed_libraries_may_load_native_code_fast(verdicts: dict[str, Verdict]) -> None:
    """Installed libraries may load their native code in the child (torchvision's ops)."""
    assert verdicts["torchvision"].ok, verdicts["torchvision"].error


def test_a_changed_kernel_is_one_changed_layer(verdicts: dict[str, Verdict]) -> None:
    """A changed kernel is one changed layer: the candidate is compared with its parent
    (test_base_models.py checks the unchanged case, test_sandbox.py renamed/deeper/residual ones)."""
    v = verdicts["vs_kernel5"]
    assert v.ok, v.error
    assert (v.changed, v.changed_layers, v.layers) == (True, 1, 2)


def test_a_parent_that_fails_to_build_fast(verdicts: dict[str, Verdict]) -> None:
    """A parent that fails to build is a structure verdict, not a comparison with nothing."""
    v = verdicts["vs_broken_parent"]
    assert (v.ok, v.stage, v.changed) == (False, "structure", None)
    assert v.error == ("structure: parent instantiate: parent_model.py defines no `Network` class"
                       " (nn.Module classes found: Net)")
    namespace: dict = {}
    exec(compile(TINY, "tiny.py", "exec"), namespace)
    assert v.params == count_params(namespace["Network"](num_classes=10))  # the candidate itself was measured


@pytest.mark.parametrize("name, error", [
    ("import_loop", "limits: CPU time 1 s exceeded during import"),
    ("sleep", "limits: wall time 8 s exceeded"),
    ("empty_huge", f"limits: out of memory (memory_mb=512): tried to allocate 4000000000000 bytes at "
                   f"model.py:{AT_IMPORT}"),
    ("alloc_600mb", f"limits: out of memory (memory_mb=512): tried to allocate 600000000 bytes at "
                    f"model.py:{AT_FORWARD}"),
    ("list_grow", f"limits: out of memory (memory_mb=512) at model.py:{AT_IMPORT + 2}"),
    ("file_size", f"limits: file size limit 16 MB exceeded at model.py:{AT_FORWARD}"),
])
def test_each_limit_is_applied(verdicts: dict[str, Verdict], name: str, error: str) -> None:
    """Each limit (CPU, wall clock, memory, file size) ends the child with a limits verdict
    (test_sandbox.py keeps the one hit during forward)."""
    v = verdicts[name]
    assert (v.ok, v.stage) == (False, "limits"), v.error
    assert v.error.startswith(error), v.error
    if name == "sleep":  # stopped at its 8 s (and the start-up before), not at some later clock
        assert v.wall_s < 40, v.wall_s


def test_a_swallowed_policy_error_still_ends_the_child(verdicts: dict[str, Verdict]) -> None:
    """The first forbidden call ends the child with a
    policy verdict (its line, its traceback), however the model catches the error."""
    v = verdicts["swallowed_loop"]
    assert (v.ok, v.stage) == (False, "policy"), v.error
    assert v.error.startswith(f"policy: process creation is not allowed (os.system at model.py:{AT_IMPORT + 2})")
    assert v.traceback.startswith("Traceback") and v.traceback.endswith(f"PermissionError: {v.error}")


def test_writing_outside_fails_and_leaves_the_caller_untouched(verdicts: dict[str, Verdict], outside: Path) -> None:
    """A write outside the child's dir fails and leaves the caller untouched (test_sandbox.py's
    test_hostile_cases_leave_caller_untouched runs system, popen and fork_exec)."""
    v = verdicts["write_outside"]
    assert not v.ok and v.stage in ("policy", "forward"), v.error
    assert "escape.txt" in v.error
    assert list(outside.iterdir()) == []
    assert os.environ.get("OPENAI_API_KEY") != SECRET


@pytest.mark.parametrize("name, stage, error", [
    ("sys_exit", "import", f"import: SystemExit: 0 at model.py:{AT_IMPORT + 1}"),
    ("os_exit_after_flood", "crash", "crash: sandbox exited with status 0 during forward without a verdict"),
    ("no_network", "instantiate", "instantiate: model.py defines no `Network` class (nn.Module classes found: Net)"),
    ("wrong_shape", "output_shape", "output_shape: output shape [2, 11] != expected [2, 10]"),
    ("mismatch", "forward",
     f"forward: RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x4 and 2x10) at model.py:{RETURN_LINE}"),
    ("detached", "backward", "backward: RuntimeError: element 0 of tensors does not require grad"),
    ("nan", "output_shape", "output_shape: output contains NaN or Inf values"),
    ("env", "forward", f"forward: RuntimeError: no key at model.py:{AT_FORWARD + 1}"),  # API keys are stripped
])
def test_each_model_error_is_its_stage(verdicts: dict[str, Verdict], name: str, stage: str, error: str) -> None:
    """Each kind of model error is the verdict of the stage it happens in."""
    v = verdicts[name]
    assert (v.ok, v.stage) == (False, stage)
    assert v.error.startswith(error), v.error


def test_the_traceback_and_the_flood_fast(verdicts: dict[str, Verdict]) -> None:
    """A traceback shows the model's frames only, and a flood of output is capped."""
    assert verdicts["mismatch"].traceback.splitlines() == [
        "Traceback (most recent call last):",
        f'  File "model.py", line {RETURN_LINE}, in forward',
        f"    {RETURN}",
        "RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x4 and 2x10)",
    ]
    tail = verdicts["os_exit_after_flood"].traceback
    assert len(tail.splitlines()) <= 20 and len(tail) <= 64 << 10


def test_a_kept_verdict_vouches_only_for_its_own_graph(verdicts: dict) -> None:
    """Twin of test_trusted_worker.py::test_a_kept_verdict_vouches_for_no_other_graph: training with a
    kept verdict's hash (`checked`) trains a file that exports the network checked, and refuses in one
    line, before any training, a file that now exports another."""
    same, runs = verdicts["train_same"]
    assert same.ok and runs == ["trained"], same.error
    other, runs = verdicts["train_other"]
    assert (other.ok, other.stage, runs) == (False, "graph", [])
    assert other.error.startswith("graph: the network sent for training (sha256 ") and "\n" not in other.error
    assert f"is not the one checked (sha256 {tiny_hash()[:12]})" in other.error
    assert TRAINED == [(tiny_hash(), "model.py")]  # only the checked network reached training, named by its file


POLICY = textwrap.dedent("""
    import sys
    from nas.sandbox.limits import install_policy

    class Denied(Exception):
        pass

    def deny(error, traceback):
        raise Denied(error)

    work, model = sys.argv[1], sys.argv[2]
    source = open(model).read()
    namespace = {}
    exec(compile(source, model, "exec"), namespace)  # defines one function per forbidden call
    install_policy(work, {model: "model.py"}, deny)
    for name in sys.argv[3:]:
        try:
            namespace[name]()
            print("allowed")
        except Denied as err:
            print(err)
""")
# One forbidden call per function, each on its own line of "model.py" (line 2 + 3 * its index).
CALLS = {
    "fork": "import os; os.fork()",
    "system": "import os; os.system('true')",
    "popen": "import subprocess; subprocess.run(['true'])",
    "fork_exec": ("import _posixsubprocess, os; r, w = os.pipe(); _posixsubprocess.fork_exec([b'/bin/true'], "
                  "[b'/bin/true'], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, "
                  "None, -1, None, False)"),
    "socket": "import socket; socket.create_connection(('127.0.0.1', 9), timeout=1)",
    "ctypes": "import ctypes; ctypes.CDLL(None).getpid()",
    "kill": "import os; os.kill(os.getppid(), 0)",
    "setrlimit": "import resource; resource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))",
}
POLICY_ERRORS = {
    "fork": "policy: process creation is not allowed (os.fork at model.py:{line})",
    "system": "policy: process creation is not allowed (os.system at model.py:{line})",
    "popen": "policy: process creation is not allowed (subprocess.Popen at model.py:{line})",
    "fork_exec": "policy: process creation is not allowed (_posixsubprocess.fork_exec at model.py:{line})",
    "socket": "policy: network access is not allowed (socket.",
    "ctypes": "policy: native code access is not allowed (ctypes.dlopen at model.py:{line})",
    "kill": "policy: signalling processes is not allowed (os.kill at model.py:{line})",
    "setrlimit": "policy: changing resource limits is not allowed (resource.setrlimit at model.py:{line})",
}


def test_each_forbidden_call_is_refused_naming_itself_and_its_line(tmp_path: Path) -> None:
    """Twin of test_sandbox.py::test_policy (the kinds of forbidden call and their lines), without a
    sandbox child: the audit policy (`install_policy`) in a plain Python process that never imports
    torch, each call refused in its one line naming the call and the model's line."""
    work, model = tmp_path / "work", tmp_path / "model.py"
    work.mkdir()
    model.write_text("".join(f"\ndef {name}():\n    {code}\n" for name, code in CALLS.items()))
    out = subprocess.run([sys.executable, "-c", POLICY, str(work), str(model), *CALLS], capture_output=True,
                         text=True, timeout=120, check=True).stdout.splitlines()
    assert len(out) == len(CALLS), out
    for i, (name, said) in enumerate(zip(CALLS, out)):
        assert said.startswith(POLICY_ERRORS[name].format(line=3 + 3 * i)), (name, said)


def _base_network() -> torch.nn.Module:
    from hostile_support import BaseNetwork

    return BaseNetwork()


def test_what_a_child_forges_the_parent_checks_again(verdicts: dict[str, Verdict]) -> None:
    """Twin of test_hostile.py::test_hostile_models_are_contained (kind forge: forge_isfinite,
    forge_count_params, forge_report_request_fd, forge_tensor_numel) and test_fairnad_forger_e2e.py (forge_carried_select_table, refused only by the
    parent's parse of the graph): checks the child's code was patched to pass are the parent's own."""
    nan = verdicts["hostile_forge_isfinite"]
    assert (nan.ok, nan.stage, nan.error) == (False, "output_shape", "output_shape: output contains NaN or Inf values")
    table = verdicts["hostile_forge_carried_select_table"]
    assert (table.ok, table.stage) == (False, "graph") and "\n" not in table.error, table.error
    counted = verdicts["hostile_forge_count_params"]
    assert counted.ok and not counted.self_reported, counted.error
    assert (counted.params, counted.flops) == (count_params(_base_network()), count_flops(_base_network(), (1, 3, 8, 8)))
    forged = verdicts["hostile_forge_report_request_fd"]  # a verdict of 1 param, 1 FLOP written to the report fd
    assert (forged.ok, forged.stage) == (False, "crash") and "malformed report" in forged.error, forged.error
    numel = verdicts["hostile_forge_tensor_numel"]  # counts 1 a tensor, and so cannot be exported as a graph
    assert not numel.ok or numel.params == count_params(_base_network()) or (
        numel.self_reported and numel.export_error), numel  # a number of the model's own is marked so


def test_the_validate_line_of_a_hostile_message_is_one_plain_line(verdicts: dict[str, Verdict], monkeypatch,
                                                                  capsys, tmp_path: Path) -> None:
    """Twin of test_terminal_safe.py::test_the_cli_prints_one_plain_line_per_hostile_file_on_any_terminal:
    the real child's messages (lone surrogates, bidi overrides, zero-width, tag and private-use
    characters) make one escaped line per file, in order, that an ASCII or latin-1 terminal prints."""
    from argparse import Namespace

    from nas.cli import arch

    for name in TERMINAL:  # escaped as the parent reads them, before the CLI escapes its line again
        v = verdicts[f"hostile_{name}"]
        assert all(text is None or text.isprintable() for text in (v.error, v.export_error)), v
    paths = [tmp_path / f"{name}.py" for name in TERMINAL]
    by_path = {path: verdicts[f"hostile_{path.stem}"] for path in paths}
    monkeypatch.setattr(arch, "_verify", lambda args, path, text, parent: by_path[path])
    statuses = [arch._validate_one(path, "", None, Namespace()) for path in paths]
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert statuses == [1, 0, 1, 1] and [line.split(": ", 1)[0] for line in lines] == list(map(str, paths)), out
    assert all(line.isprintable() for line in lines) and out.encode("ascii")  # ASCII, so latin-1 too
    assert "\\ud800" in lines[0] and "\\u202e" in lines[2] and "\\u200b" in lines[3], out
    assert ": valid model (" in lines[1] and "\\udcff\\ud800" in lines[1], out




def _check_here(source: str) -> dict:
    """The trusted worker's check (`measure`) of `source`'s network exported here (our own source)."""
    namespace: dict = {}
    exec(compile(source, "hidden.py", "exec"), namespace)
    net = namespace["Network"](num_classes=10)
    graph = export_graph(net, torch.randn(SHAPE))
    data = pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants")})
    return verify.measure(data, num_classes=10, input_shape=list(SHAPE), memory_mb=1024, with_parent=False,
                          batch=256, seeds=[], on_work=lambda units: None)


def test_products_hidden_from_the_flops_count_are_refused_fast() -> None:
    """Twin of test_sandbox.py::test_products_hidden_from_the_flops_count_are_refused, in this process
    on an 8x8 input: ~200k element-wise operations per image that fvcore does not count are refused;
    the same products as matrix products pass."""
    refused = _check_here(hidden_products(192))
    assert (refused["ok"], refused["stage"]) == (False, "graph"), refused["error"]
    assert re.search(r"operations per image \(at batch 256\) outside convolutions and matrix products, more than",
                     refused["error"]), refused["error"]
    honest = _check_here(matrix_products(192))
    assert honest["ok"], honest["error"]


def test_a_compiled_block_file_passes_the_sandbox_at_its_planned_size(verdicts: dict[str, Verdict]) -> None:
    """The source a block file compiles to is a valid model file, measured (on the trusted side) at
    the size its plan says."""
    v, p = verdicts["compiled"], compiled_plan()
    assert v.ok, v.error
    assert (v.params, v.flops, v.output_shape) == (p.params, p.flops, [2, 10])
