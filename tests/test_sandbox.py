"""Sandboxed verification of untrusted model source (nas.sandbox).

Every sandboxed run starts a child that imports torch (~1.5 CPU s), so all
cases run once, in parallel, in a module-scoped fixture, and the tests assert
on their verdicts. Hostile cases aim at a directory outside the sandbox, which
must stay empty.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nas.errors import ConfigError
from nas.measure import count_flops, count_params
from nas.sandbox import Limits, Verdict, verify_model_source
from nas.sandbox.verify import child_env
from support.sources import hidden_products, matrix_products

MODELS = Path(__file__).parent / "data" / "models"
PARENT = (MODELS / "cnn_parent.py").read_text()
FORWARD = "        x = self.stage2(self.stage1(self.stem(x)))\n"
RETURN = "return self.fc(torch.flatten(self.pool(x), 1))"
# Roomy wall clocks: 13 cases run 4 at a time, each a child and a trusted worker importing torch, beside
# another test worker, and a loaded 2-core CI machine took over 30 s for one. Nothing here is meant to hit
# them; the loop hits its 1 s CPU cap.
FAST = Limits(wall_s=180, cpu_s=30, memory_mb=512)
LOOP = Limits(wall_s=180, cpu_s=1, memory_mb=512)
SECRET = "sk-must-not-leak"


def in_forward(code: str) -> str:
    """The parent CNN with `code` run at the start of forward (line 28 on)."""
    return PARENT.replace(FORWARD, "".join(f"        {line}\n" for line in code.splitlines()) + FORWARD)


def at_import(code: str) -> str:
    """The parent CNN with `code` appended at module level (line 31 on)."""
    return PARENT + "\n" + code + "\n"


def cases(outside: Path) -> dict[str, tuple[str, Limits, str | None]]:
    """name -> (source, limits, parent source). Only what tests/test_sandbox_fast.py's cases (the same
    checks on a two-layer net at 8x8, not slow) do not show: a limit hit during forward, each forbidden
    call refused in the child with its traceback, and the structure of a renamed, deeper or residual child
    against a parent with batch-norm layers."""
    fork_exec = ("import _posixsubprocess, os\nr, w = os.pipe()\n_posixsubprocess.fork_exec("
                 f"[b'/bin/touch', b'{outside}/bypass'], [b'/bin/touch'], True, (), None, None, -1, -1,"
                 " -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)")
    plain = {
        "valid": PARENT,
        # limits
        "forward_loop": in_forward("while True:\n    pass"),
        # policy
        "fork_bomb": at_import("import os\nwhile True:\n    os.fork()"),
        "system": at_import(f"import os\nos.system('touch {outside}/pwned')"),
        "popen": at_import(f"import subprocess\nsubprocess.run(['touch', '{outside}/popen'])"),
        "fork_exec": at_import(fork_exec),
        "socket": at_import("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)"),
        "ctypes": at_import("import ctypes\nctypes.CDLL(None).getpid()"),
        "kill": at_import("import os\nos.kill(os.getppid(), 0)"),
        "setrlimit": at_import("import resource\nresource.setrlimit(resource.RLIMIT_CPU, (10**6, 10**6))"),
    }
    runs = {name: (src, LOOP if name.endswith("_loop") else FAST, None) for name, src in plain.items()}
    # vs_parent, vs_kernel5: test_base_models.py::test_verifies_and_is_its_own_unchanged_parent and
    # test_sandbox_fast.py::test_a_changed_kernel_is_one_changed_layer
    for name in ("renamed", "two_layers", "residual"):
        runs[f"vs_{name}"] = ((MODELS / f"cnn_{name}.py").read_text(), FAST, PARENT)
    return runs


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("outside-sandbox")


@pytest.fixture(scope="module")
def verdicts(outside: Path) -> dict[str, Verdict]:
    runs = cases(outside)
    with pytest.MonkeyPatch.context() as mp, ThreadPoolExecutor(4) as pool:
        mp.setenv("OPENAI_API_KEY", SECRET)
        futures = {name: pool.submit(verify_model_source, src, limits=limits, parent_source=parent)
                   for name, (src, limits, parent) in runs.items()}
        return {name: f.result() for name, f in futures.items()}


def _load_trusted(path: Path):
    spec = importlib.util.spec_from_file_location("trusted_cnn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_valid_cnn_measured_like_in_process(verdicts: dict[str, Verdict]) -> None:
    v = verdicts["valid"]
    net = _load_trusted(MODELS / "cnn_parent.py").Network(num_classes=10)
    assert (v.ok, v.stage, v.error, v.output_shape) == (True, "done", None, [2, 10])
    assert v.params == count_params(net)
    assert v.flops == count_flops(net, (1, 3, 32, 32))
    assert v.layers == 7  # 3 conv + 3 batch-norm + 1 linear
    assert math.isfinite(v.wall_s) and v.wall_s > 0  # a measured time, not a bound: machines are noisy


@pytest.mark.slow
@pytest.mark.parametrize("name, changed, changed_layers", [
    ("renamed", False, 0), ("two_layers", True, 2),
    ("residual", True, 2),  # a skip connection in forward: two operations (pool, add), no parameter changed
])
def test_structure_vs_parent(verdicts: dict[str, Verdict], name: str, changed: bool,
                             changed_layers: int) -> None:
    v = verdicts[f"vs_{name}"]
    assert v.ok, v.error
    assert (v.changed, v.changed_layers, v.layers) == (changed, changed_layers, 7)


@pytest.mark.slow
@pytest.mark.parametrize("name, error", [  # the other limits: test_sandbox_fast.py::test_each_limit_is_applied
    ("forward_loop", "limits: CPU time 1 s exceeded during forward"),
])
def test_limits(verdicts: dict[str, Verdict], name: str, error: str) -> None:
    v = verdicts[name]
    assert (v.ok, v.stage) == (False, "limits")
    assert v.error.startswith(error), v.error


@pytest.mark.slow
@pytest.mark.parametrize("name, error", [
    ("fork_bomb", "policy: process creation is not allowed (os.fork at model.py:33)"),
    ("system", "policy: process creation is not allowed (os.system at model.py:32)"),
    ("popen", "policy: process creation is not allowed (subprocess.Popen at model.py:32)"),
    ("fork_exec", "policy: process creation is not allowed (_posixsubprocess.fork_exec at model.py:33)"),
    ("socket", "policy: network access is not allowed (socket."),
    ("ctypes", "policy: native code access is not allowed (ctypes.dlopen at model.py:32)"),
    ("kill", "policy: signalling processes is not allowed (os.kill at model.py:32)"),
    ("setrlimit", "policy: changing resource limits is not allowed (resource.setrlimit at model.py:32)"),
])  # swallowed: test_sandbox_fast.py::test_a_swallowed_policy_error_still_ends_the_child
def test_policy(verdicts: dict[str, Verdict], name: str, error: str) -> None:
    v = verdicts[name]
    assert (v.ok, v.stage) == (False, "policy")
    assert v.error.startswith(error), v.error
    assert v.traceback.startswith("Traceback") and v.traceback.endswith(f"PermissionError: {v.error}")


@pytest.mark.slow
def test_hostile_cases_leave_caller_untouched(verdicts: dict[str, Verdict], outside: Path) -> None:
    """system, popen and fork_exec aim at `outside` (a write there: test_sandbox_fast.py's
    test_writing_outside_fails_and_leaves_the_caller_untouched)."""
    assert list(outside.iterdir()) == []
    assert os.environ.get("OPENAI_API_KEY") != SECRET  # the fixture's setenv was undone


def test_syntax_error_is_found_without_a_child() -> None:
    source = PARENT.replace("def forward(self, x: torch.Tensor) -> torch.Tensor:\n        x =",
                            "def forward(self, x: torch.Tensor) -> torch.Tensor\n        x =")
    v = verify_model_source(source, filename="cand.py")
    assert (v.ok, v.stage, v.error) == (False, "syntax", "syntax: SyntaxError: expected ':' at cand.py:27")
    assert v.traceback.endswith("SyntaxError: expected ':'")
    assert v.wall_s < 1


def test_forged_child_reports_are_rejected() -> None:
    good = Verdict(ok=True, stage="done", params=1, flops=2, output_shape=[2, 10]).to_dict()
    assert Verdict.from_child(good) == Verdict(**good)
    for forged in ({**good, "extra": 1}, {**good, "params": "1"}, {**good, "stage": "hacked"},
                   {**good, "ok": False}, {**good, "error": "x" * 5000}, {**good, "output_shape": [2, -1]},
                   [good]):
        with pytest.raises(ValueError):
            Verdict.from_child(forged)


def test_child_env_is_an_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    env = child_env("/tmp/x")
    assert SECRET not in env.values()
    assert (env["HOME"], env["OMP_NUM_THREADS"], env["CUDA_VISIBLE_DEVICES"]) == ("/tmp/x", "1", "")


def test_bad_arguments_fail_fast() -> None:
    with pytest.raises(ConfigError, match="Limits.cpu_s must be > 0"):
        Limits(cpu_s=0)
    with pytest.raises(ValueError, match="plain"):
        verify_model_source(PARENT, filename="../escape.py")
    with pytest.raises(ValueError, match="batch of >= 2"):
        verify_model_source(PARENT, input_shape=(1, 3, 32, 32))




@pytest.mark.slow
def test_products_hidden_from_the_flops_count_are_refused() -> None:
    """fvcore counts no element-wise products or sums: spelled that way, 1.6M multiply-accumulates
    per image would count as ~1e3 FLOPs and pass any budget."""
    roomy = Limits(wall_s=180, cpu_s=30, memory_mb=4096)  # its broadcast product at batch 256 trains in ~3.3 GB
    v = verify_model_source(hidden_products(3072), limits=roomy)
    assert (v.ok, v.stage) == (False, "graph"), v.error
    assert re.search(r"operations per image \(at batch \d+\) outside convolutions and matrix products, more than", v.error)
    assert verify_model_source(matrix_products(3072), limits=roomy).ok
