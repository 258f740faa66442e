"""Caller side of the sandbox: verify an untrusted model file in a child process.

The candidate source is never imported or exec'd here: this process only
`compile()`s it for the syntax check, then runs `nas.sandbox.worker` in a
fresh session (its own process group), in a private temp dir, with a minimal
environment. The child reports JSON lines on a pipe, which are validated
field by field; nothing from the child is unpickled. Whatever happens, the
whole process group is SIGKILLed before this returns.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from nas.sandbox.limits import Limits

STAGES = ("syntax", "import", "instantiate", "forward", "output_shape", "backward", "measure",
          "structure", "train", "done", "limits", "policy", "crash")
MAX_SEEDS = 16
_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the `nas` package
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "LD_LIBRARY_PATH")
_MAX_SOURCE = 1 << 20
_MAX_REPORT = 1 << 20  # bytes read from the report pipe; a flood beyond is a malformed report
_OUTPUT_TAIL = 64 << 10  # bytes of the child's stdout+stderr kept, for crash diagnostics


@dataclass
class Verdict:
    """Outcome of one verification; `error` is the one line to show a user or
    feed an LLM debug prompt, `traceback` the model-only frames to go with it.

    `stage` is where it stopped: syntax, import, instantiate, forward,
    output_shape, backward, measure, structure (the parent failed to build) or
    done; or why: limits (wall/CPU/memory/file size), policy (a forbidden
    action) or crash (the child died without reporting, e.g. os._exit or a
    segfault). `flops` are fvcore multiply-adds for one image; `layers`
    counts layers with parameters (FairNAD discards single-layer networks).
    `changed` and `changed_layers` compare with the parent source, when one is
    given: see `nas.sandbox.worker._compare`.
    """

    ok: bool
    stage: str
    error: str | None = None
    traceback: str | None = None
    params: int | None = None
    flops: int | None = None
    output_shape: list[int] | None = None
    changed: bool | None = None
    changed_layers: int | None = None
    layers: int | None = None
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_child(cls, data: object) -> "Verdict":
        """Build from the child's JSON, checking every field: the child ran
        untrusted code and may have written anything on the pipe."""
        if not isinstance(data, dict) or set(data) != {f.name for f in dataclasses.fields(cls)}:
            raise ValueError("report has the wrong fields")
        checks = {"ok": lambda v: type(v) is bool, "stage": lambda v: v in STAGES,
                  "error": _opt_str(1000), "traceback": _opt_str(8000), "params": _opt_int,
                  "flops": _opt_int, "changed": lambda v: v is None or type(v) is bool,
                  "output_shape": lambda v: v is None or (type(v) is list and all(_count(n) for n in v)),
                  "changed_layers": _opt_int, "layers": _opt_int,
                  "wall_s": lambda v: type(v) in (int, float)}
        bad = [k for k, check in checks.items() if not check(data[k])]
        if bad:
            raise ValueError(f"report field(s) {', '.join(bad)} malformed")
        if data["ok"] != (data["stage"] == "done") or (not data["ok"] and not data["error"]):
            raise ValueError("report's ok, stage and error disagree")
        return cls(**data)


def _count(v: object) -> bool:
    return type(v) is int and v >= 0


def _opt_int(v: object) -> bool:
    return v is None or _count(v)


def _opt_str(cap: int):
    return lambda v: v is None or (isinstance(v, str) and len(v) <= cap)


def verify_model_source(source: str, *, num_classes: int = 10,
                        input_shape: tuple[int, ...] = (2, 3, 32, 32),
                        parent_source: str | None = None, limits: Limits = Limits(),
                        filename: str = "model.py") -> Verdict:
    """Check that `source` defines `Network(num_classes=...)` whose forward on a
    random `input_shape` batch gives `(batch, num_classes)` and backpropagates;
    measure it; with `parent_source`, say whether (and how many) layers changed.
    The source runs only in a sandboxed child under `limits`."""
    _check_args(filename, num_classes, input_shape)
    start = time.monotonic()
    verdict = _syntax(source, filename) or _run_child(source, num_classes, input_shape,
                                                      parent_source, limits, filename)[0]
    verdict.wall_s = round(time.monotonic() - start, 3)
    return verdict


def train_model_source(source: str, *, data: dict, recipe: dict, engine: dict, seeds: list[int],
                       num_classes: int, input_shape: tuple[int, ...], gpu: bool = False, threads: int = 1,
                       limits: Limits = Limits(), filename: str = "model.py") -> tuple[Verdict, list]:
    """Verify `source` as `verify_model_source` does, then train a fresh
    instance per seed in the same sandboxed child: `data`, `recipe` and
    `engine` are the settings dicts of `nas.data`, `Recipe` and `Engine`.
    Returns the verdict (stage "train" if training raised) and the checked
    `TrainResult`s, one per seed that finished."""
    from nas.train.result import TrainResult

    _check_args(filename, num_classes, input_shape)
    if not 1 <= len(seeds) <= MAX_SEEDS:
        raise ValueError(f"seeds: between 1 and {MAX_SEEDS} seeds, got {len(seeds)}")
    start = time.monotonic()
    verdict, trained = _syntax(source, filename), []
    if verdict is None:
        request = {"data": data, "recipe": recipe, "engine": engine, "seeds": list(seeds), "gpu": gpu,
                   "threads": threads}
        verdict, reports = _run_child(source, num_classes, input_shape, None, limits, filename, request)
        try:
            trained = [TrainResult.from_untrusted(r, max_epochs=recipe.get("epochs", 0)) for r in reports]
        except ValueError as err:
            verdict, trained = Verdict(ok=False, stage="crash", error=f"crash: {err}"), []
        if verdict.ok and len(trained) != len(seeds):
            verdict = Verdict(ok=False, stage="crash",
                              error=f"crash: {len(trained)} training reports for {len(seeds)} seeds")
    verdict.wall_s = round(time.monotonic() - start, 3)
    return verdict, trained


def _check_args(filename: str, num_classes: int, input_shape: tuple[int, ...]) -> None:
    if not re.fullmatch(r"[A-Za-z_][\w.-]*\.py", filename):
        raise ValueError(f"filename must be a plain *.py file name, got {filename!r}")
    if len(input_shape) < 2 or input_shape[0] < 2:
        raise ValueError(f"input_shape needs a batch of >= 2 (BatchNorm), got {tuple(input_shape)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")


def _syntax(source: str, filename: str) -> Verdict | None:
    """compile() parses without executing anything, so it is safe in-process."""
    if len(source.encode("utf-8", "replace")) > _MAX_SOURCE:
        return Verdict(ok=False, stage="syntax", error=f"syntax: source is over {_MAX_SOURCE >> 20} MB")
    try:
        with warnings.catch_warnings():  # e.g. invalid escape sequences: the child's business
            warnings.simplefilter("ignore")
            compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as err:
        line = f"\n    {err.text.rstrip()}" if err.text else ""
        return Verdict(ok=False, stage="syntax",
                       error=f"syntax: {type(err).__name__}: {err.msg} at {filename}:{err.lineno}",
                       traceback=f'  File "{filename}", line {err.lineno}{line}\n{type(err).__name__}: {err.msg}')
    except (ValueError, RecursionError, MemoryError) as err:  # null bytes, absurd nesting
        return Verdict(ok=False, stage="syntax", error=f"syntax: {type(err).__name__}: {err}")
    return None


def _run_child(source: str, num_classes: int, input_shape: tuple[int, ...],
               parent_source: str | None, limits: Limits, filename: str,
               train: dict | None = None) -> tuple[Verdict, list]:
    with tempfile.TemporaryDirectory(prefix="nas-sandbox-", ignore_cleanup_errors=True) as tmp:
        files = {"candidate": filename}
        Path(tmp, filename).write_text(source, encoding="utf-8")
        if parent_source is not None:
            files["parent"] = f"parent_{filename}"
            Path(tmp, files["parent"]).write_text(parent_source, encoding="utf-8")
        read_end, write_end = os.pipe()
        request = {"result_fd": write_end, "files": files, "num_classes": num_classes,
                   "input_shape": list(input_shape), "limits": dataclasses.asdict(limits), "train": train}
        Path(tmp, "request.json").write_text(json.dumps(request), encoding="utf-8")
        deadline = time.monotonic() + limits.wall_s
        with open(read_end, "rb", buffering=0) as report:  # closes read_end however this ends
            try:
                proc = subprocess.Popen([sys.executable, "-s", "-P", "-m", "nas.sandbox.worker", tmp],
                                        cwd=tmp, env=_child_env(tmp, gpu=bool(train and train["gpu"])),
                                        stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        pass_fds=(write_end,), start_new_session=True)
            finally:
                os.close(write_end)
            with proc.stdout:
                try:
                    run = _collect(proc, report.fileno(), deadline)
                finally:
                    _kill_group(proc)
        run.returncode = proc.returncode
        return _conclude(run, limits), run.trained


def _child_env(tmp: str, gpu: bool = False) -> dict[str, str]:
    """An allow-list: no API keys or tokens reach the child, and no GPU unless
    it trains on one (a check runs on CPU; a GPU context also needs the
    address-space cap lifted, which `apply_rlimits` does for GPU training)."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP}
    env.update(HOME=tmp, TMPDIR=tmp, PYTHONPATH=str(_ROOT), PYTHONHASHSEED="0",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return env


@dataclass
class _Run:
    """What the parent observed of one child."""

    returncode: int | None = None
    timed_out: bool = False
    stage: str = "startup"
    verdict: object = None
    policy: object = None
    malformed: bool = False
    output: bytes = b""
    trained: list = dataclasses.field(default_factory=list)  # one training report per seed, unchecked


def _collect(proc: subprocess.Popen, report_fd: int, deadline: float) -> _Run:
    """Drain the report and output pipes until both close or the deadline
    passes, keeping bounded amounts of each, so a flooding child never blocks
    or bloats the caller."""
    run, report = _Run(), b""
    with selectors.DefaultSelector() as sel:
        sel.register(report_fd, selectors.EVENT_READ)
        sel.register(proc.stdout.fileno(), selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                run.timed_out = True
                return run
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                elif key.fd != report_fd:
                    run.output = (run.output + chunk)[-_OUTPUT_TAIL:]
                elif len(report) + len(chunk) > _MAX_REPORT:
                    run.malformed = True
                else:
                    report += chunk
                    *lines, report = report.split(b"\n")
                    for line in lines:
                        _take(run, line)
    while not _exited(proc.pid):
        if time.monotonic() >= deadline:
            run.timed_out = True
            return run
        time.sleep(0.005)
    return run


def _exited(pid: int) -> bool:
    """Has the child exited? Does not reap it, so its pid, which is also the
    process-group id, cannot be reused before `_kill_group`."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _take(run: _Run, line: bytes) -> None:
    try:
        msg = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        run.malformed = True
        return
    if not isinstance(msg, dict) or len(msg) != 1:
        run.malformed = True
    elif "stage" in msg and msg["stage"] in STAGES:
        run.stage = msg["stage"]
    elif "verdict" in msg and run.verdict is None:  # the worker sends exactly one
        run.verdict = msg["verdict"]
    elif "policy" in msg and run.policy is None:
        run.policy = msg["policy"]
    elif "trained" in msg and len(run.trained) < MAX_SEEDS:
        run.trained.append(msg["trained"])
    else:
        run.malformed = True


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL everything the child started, then reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _conclude(run: _Run, limits: Limits) -> Verdict:
    """A policy report wins (the child may have swallowed the exception and
    looped on), then a complete verdict, then what the exit says."""
    rc, during = run.returncode, f" during {run.stage}"
    if run.policy is not None:
        policy = run.policy
        if (isinstance(policy, dict) and set(policy) == {"error", "traceback"}
                and isinstance(policy["error"], str) and policy["error"].startswith("policy: ")
                and _opt_str(1000)(policy["error"]) and _opt_str(8000)(policy["traceback"])):
            return Verdict(ok=False, stage="policy", error=policy["error"], traceback=policy["traceback"])
        return _crash("malformed policy report from the sandbox", run)
    if run.verdict is not None and not run.malformed:
        try:
            return Verdict.from_child(run.verdict)
        except ValueError as err:
            return _crash(f"malformed verdict from the sandbox: {err}", run)
    if run.timed_out:
        return Verdict(ok=False, stage="limits", error=f"limits: wall time {limits.wall_s:g} s exceeded{during}")
    if rc == -signal.SIGXCPU:
        return Verdict(ok=False, stage="limits", error=f"limits: CPU time {limits.cpu_s} s exceeded{during}")
    if rc == -signal.SIGXFSZ:
        return Verdict(ok=False, stage="limits", error=f"limits: file size limit {limits.file_mb} MB exceeded{during}")
    if rc == -signal.SIGKILL:  # not ours (that is timed_out): the CPU hard limit or the OOM killer
        return Verdict(ok=False, stage="limits", error=f"limits: killed by SIGKILL{during} (CPU or memory)")
    if run.malformed:
        return _crash(f"malformed report from the sandbox{during}", run)
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
    return _crash(f"sandbox {how}{during} without a verdict", run)


def _crash(what: str, run: _Run) -> Verdict:
    """The tail of the child's output (e.g. a fatal error) stands in for a traceback."""
    tail = run.output.decode("utf-8", "replace").strip().splitlines()[-20:]
    return Verdict(ok=False, stage="crash", error=f"crash: {what}", traceback="\n".join(tail) or None)
