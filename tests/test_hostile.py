"""Hostile model files against the sandbox, through the real CLI.

Every file in tests/hostile/ is a small valid conv net plus one attack (escape
the tripwire, steal a secret, forge the numbers, reach the network, leave a
process or a file behind, poison a cache, exhaust a resource). The files of one
kind run together as `nas arch validate FILE...` (each in its own sandbox child,
one after another, so an attack on the CLI itself would also show in the files
checked after it); training forges and resource abuse run one by one as
`nas train FILE`. Each CLI run has a scene of its own: a fresh NASFLOW_HOME, a
HOME whose .bashrc holds the API key, a run dir, a canary dir and canary
listeners, with the key and a second token in the CLI's environment. Whatever
the models do, afterwards: nothing new outside, the secrets in no output or
file, no connection, no process left, no number a model forged, one plain line
per file naming it (no control, bidi, zero-width, surrogate or private-use character: a
model's text cannot rewrite the screen or make a line read as another), the CLI's own peak memory bounded, and the CLI itself exits normally.
The `parent` kind forges what the child sends back (the artifact's ZIP, JSON
and safetensors headers, the report's strings) to attack the trusted side's
parsing. Then `nas` is killed mid-check and must leave nothing behind.

With NASFLOW_HOSTILE_REPORT set to a folder, each test writes its cases' outcomes
there as JSON (benchmarks/isolation.py reads them).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import threading
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

from hostile_support import (
    BASE_LINES,
    CLIS,
    EXPECTS,
    FORGED_ACCURACY,
    KINDS,
    PLACEHOLDERS,
    BaseNetwork,
    Canary,
    Hostile,
    changes,
    descendants,
    files_holding,
    hostile_files,
    marked_processes,
    named_outside,
    secret_forms,
    snapshot,
    start_time,
)
from nas.core.trial import SELF_REPORTED
from nas.measure import count_flops, count_params

pytestmark = [pytest.mark.slow, pytest.mark.sandbox]

ROOT = Path(__file__).resolve().parents[1]
NAS = str(Path(sys.executable).with_name("nas"))
CASES = hostile_files()
TRAINED = [c for c in CASES if c.cli == "train"]
GROUPS = {kind: [c for c in CASES if c.cli == "validate" and c.kind == kind] for kind in KINDS}
GROUPS = {kind: cases for kind, cases in GROUPS.items() if cases}
REPORT = os.environ.get("NASFLOW_HOSTILE_REPORT")
# Training runs get tight sandbox limits, so resource abuse ends in seconds, not an hour.
TRAIN_WALL_S = 45  # a case's `# wall_s:` header may lower it (a model that only sleeps needs no more than 15)
# A case's `# cpu_s:` header may lower it: a model that only spins needs no more than the clean model's
# check and export (~1.5 CPU s after the sandbox's imports), with 3x to spare: 5. The fork bomb keeps 10
# (its 256 forks cost ~1.5 CPU s more, which a lower cap could cut short).
TRAIN_CPU_S = 10
TRAIN_ARGS = ["data=digits", "recipe=quick", "recipe.epochs=1", "evaluator.sandbox.memory_mb=1024"]
VALIDATE_WALL_S = 60  # nas.sandbox.Limits' default, which `nas arch validate` uses
SLACK_S = 40  # CLI start-up, the sandbox's start-up, a loaded machine
MAX_OUTPUT = 1 << 20
# A file's verdict line says valid at its start only: a model's text later in the line is not a verdict.
VALID = re.compile(r"^\S+: valid model \(([\d,]+) params, ([\d,]+) FLOPs\)", re.MULTILINE)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # terminal escapes, carriage returns (tabs and newlines pass)
SPOOFING = ("Cf", "Cs", "Co", "Zl", "Zp")  # bidi overrides, zero-width and tag characters, surrogates, private use
# The CLI's own peak resident memory (not its sandbox children's): checking an honest model peaks at
# ~0.9 GB, so a run over this spent a gigabyte more on what a child sent.
PARENT_RSS_MB = 2048
# Where an escaped attack would leave files (always named with its marker): (folder, recursive).
OUTSIDE = [(Path("/tmp"), False), (Path("/var/tmp"), False), (Path("/dev/shm"), False), (ROOT, False),
           (ROOT / "nas", True), (Path(sysconfig.get_paths()["purelib"]), False),
           (Path(sysconfig.get_paths(vars={"base": sys.base_prefix})["purelib"]), False),
           (Path(site.getusersitepackages()), False), (Path.home(), False), (Path.home() / ".cache", False)]

_net = BaseNetwork()
TRUE_PARAMS = count_params(_net)
TRUE_FLOPS = {"validate": count_flops(_net, (1, 3, 32, 32)), "train": count_flops(_net, (1, 3, 8, 8))}  # digits: 8x8
del _net


@dataclass
class Scene:
    """One case's world: the folders the CLI and the attack see, and its secrets."""

    root: Path
    marker: str
    key: str
    token: str

    def __post_init__(self) -> None:
        self.canary_dir, self.home, self.nasflow_home = self.root / "canary", self.root / "home", self.root / "nasflow"
        self.run_dir, self.tmp, self.models = self.root / "run", self.root / "tmp", self.root / "models"
        for folder in (self.canary_dir, self.home, self.run_dir, self.tmp, self.models,
                       self.nasflow_home / "cache", self.nasflow_home / "llm" / "cache" / "ab"):
            folder.mkdir(parents=True)
        self.canary_dir.chmod(0o777)
        (self.canary_dir / "existing.txt").write_text("an existing file\n")
        self.planted = {self.home / ".bashrc": f"export OPENAI_API_KEY={self.key}\n",
                        self.nasflow_home / "credentials": f"NASFLOW_CANARY_TOKEN={self.token}\n",
                        self.run_dir / "notes.txt": f"OPENAI_API_KEY={self.key}\n"}
        for path, text in self.planted.items():
            path.write_text(text)
        (self.nasflow_home / "cache" / "entry").write_bytes(b"a cached evaluation\n")
        (self.nasflow_home / "llm" / "cache" / "ab" / "entry.json").write_text('{"reply": "cached"}\n')
        self.pgid: int | None = None

    def subs(self, port: int, sock: str) -> dict[str, str]:
        return {"__CANARY_DIR__": str(self.canary_dir), "__CANARY_PORT__": str(port), "__CANARY_SOCK__": sock,
                "__NASFLOW_HOME__": str(self.nasflow_home), "__RUN_DIR__": str(self.run_dir),
                "__HOME__": str(self.home), "__MARKER__": self.marker}

    def env(self) -> dict[str, str]:
        return {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(self.home),
                "PYTHONPATH": str(ROOT),  # this tree's `nas`, whichever checkout the venv's `nas` was installed from
                "NASFLOW_HOME": str(self.nasflow_home), "TMPDIR": str(self.tmp), "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1", "MPLCONFIGDIR": str(self.root / "mpl"),  # nas's own plotting cache
                "OPENAI_API_KEY": self.key, "NASFLOW_CANARY_TOKEN": self.token}

    def watched(self) -> dict[str, dict]:
        """Snapshots of what no case may change."""
        return {"canary dir": snapshot(self.canary_dir), "HOME": snapshot(self.home),
                "NASFLOW_HOME/cache": snapshot(self.nasflow_home / "cache"),
                "NASFLOW_HOME/llm/cache": snapshot(self.nasflow_home / "llm" / "cache"),
                "NASFLOW_HOME/credentials": snapshot(self.nasflow_home / "credentials"),
                "run dir": {k: v for k, v in snapshot(self.run_dir).items() if k != "result.json"}}

    def needles(self) -> list[str]:
        """The secrets as they may be smuggled out (the random part identifies them)."""
        return [form for s in (self.key, self.token) for form in secret_forms(s)]

    def leftovers(self) -> dict[int, str]:
        """Processes this case started that still run: they carry the marker or name the case's folders."""
        return marked_processes([self.marker, str(self.root)])

    def leaked_dirs(self) -> list[Path]:
        """Sandbox temp dirs left behind: any under this case's TMPDIR, or in /tmp holding this case's model."""
        mine = list(self.tmp.glob("nas-sandbox-*"))
        for folder in Path("/tmp").glob("nas-sandbox-*"):
            if files_holding(folder, [self.marker], skip=set()):
                mine.append(folder)
        return mine

    def outside_files(self) -> list[Path]:
        return named_outside(self.marker, OUTSIDE)

    def clean(self) -> None:
        """Kill what this case left running and delete what it left outside (all of it ours: marker-named)."""
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for path in [*self.outside_files(), *self.leaked_dirs()]:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


@dataclass
class Outcome:
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    result: dict | None = None
    peak_rss_mb: float = 0.0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory):
    listeners = Canary(tmp_path_factory.mktemp("canary"))
    yield listeners
    listeners.close()


@pytest.fixture
def scene(tmp_path: Path):
    world = Scene(tmp_path, marker=f"nfm{secrets.token_hex(6)}", key=f"sk-nasflowcanary-{secrets.token_hex(8)}",
                  token=f"tok-nasflowcanary-{secrets.token_hex(8)}")
    yield world
    world.clean()


def start(scene: Scene, models: list[Path], cli: str, wall_s: int = TRAIN_WALL_S,
          cpu_s: int = TRAIN_CPU_S) -> subprocess.Popen:
    if cli == "validate":
        args = [NAS, "arch", "validate", *map(str, models)]
    else:
        args = [NAS, "train", str(models[0]), *TRAIN_ARGS, f"evaluator.sandbox.wall_s={wall_s}",
                f"evaluator.sandbox.cpu_s={cpu_s}", "--out", str(scene.run_dir / "result.json")]
    proc = subprocess.Popen(args, cwd=scene.run_dir, env=scene.env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    scene.pgid = proc.pid
    return proc


def run_cli(scene: Scene, models: list[Path], cli: str, wall_s: int = TRAIN_WALL_S,
            cpu_s: int = TRAIN_CPU_S) -> tuple[Outcome, list[float]]:
    """The CLI's outcome, and when (seconds after its start) each line of its stdout came;
    `wall_s`, `cpu_s`: the sandbox's wall-clock and CPU-time limits for `train`."""
    began = time.monotonic()
    proc = start(scene, models, cli, wall_s, cpu_s)
    limit = len(models) * ((VALIDATE_WALL_S if cli == "validate" else wall_s) + SLACK_S) + SLACK_S
    stdout: list[bytes] = []
    stamps: list[float] = []
    stderr: list[bytes] = []

    def read_lines() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            stdout.append(line)
            stamps.append(time.monotonic() - began)

    def read_all() -> None:
        assert proc.stderr is not None
        stderr.append(proc.stderr.read())

    peak_kb = [0]

    def watch_memory() -> None:
        """The CLI's peak resident memory (VmHWM), read until it has exited (no status, or a zombie's)."""
        status = Path(f"/proc/{proc.pid}/status")
        while True:
            try:
                found = re.search(r"^VmHWM:\s+(\d+) kB", status.read_text(), re.MULTILINE)
            except OSError:
                return
            if found is None:
                return
            peak_kb[0] = max(peak_kb[0], int(found.group(1)))
            time.sleep(0.05)

    readers = [threading.Thread(target=read_lines), threading.Thread(target=read_all),
               threading.Thread(target=watch_memory)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:  # stalled (e.g. stopped by a model): kill it, report it
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        stderr.append(f"\n[test] nas did not finish within {limit} s".encode())
        proc.returncode = None
    for reader in readers:
        reader.join()
    result_file = scene.run_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.is_file() else None
    return Outcome(proc.returncode, b"".join(stdout).decode(errors="replace"),
                   b"".join(stderr).decode(errors="replace"), time.monotonic() - began, result, peak_kb[0] / 1024), stamps


def wait_until_clean(scene: Scene, seconds: float = 5.0) -> tuple[dict[int, str], list[Path]]:
    """Leftover processes and sandbox dirs, once they are gone or `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while True:
        procs, dirs = scene.leftovers(), scene.leaked_dirs()
        if (not procs and not dirs) or time.monotonic() > deadline:
            return procs, dirs
        time.sleep(0.2)


def self_reported(record: object) -> bool:
    """Is the result marked as the model's own, unverified claim (anywhere in the record)?"""
    if isinstance(record, dict):
        return any((k == "self_reported" and bool(v)) or self_reported(v) for k, v in record.items())
    if isinstance(record, list):
        return any(self_reported(v) for v in record)
    return False


def containment(scene: Scene, models: list[Path], before: dict[str, dict], events: list) -> list[str]:
    """(a)-(d): what got out of the sandbox, one line per problem."""
    problems = []
    after = scene.watched()
    for name, snap in before.items():
        problems += [f"(a) {name}: {c}" for c in changes(snap, after[name])]
    problems += [f"(a) file outside: {p}" for p in scene.outside_files()]
    problems += [f"(a) file in the test's dirs named with the marker: {p}"
                 for p in named_outside(scene.marker, [(scene.root, True)])]
    problems += [f"(a) {h}" for h in files_holding(scene.root, [scene.marker], skip=set(models))]
    problems += [f"(b) {h}" for h in files_holding(scene.root, scene.needles(), skip=set(scene.planted))]
    problems += [f"(c) canary listener saw {kind}: {data[:60]!r}" for kind, data in events]
    procs, dirs = wait_until_clean(scene)
    problems += [f"(d) process left: {d}" for d in procs.values()]
    problems += [f"(d) sandbox dir left: {d}" for d in dirs]
    return problems


def cli_problems(scene: Scene, out: Outcome) -> list[str]:
    """(b) secrets in the output, (f) how the CLI ended."""
    problems = [f"(b) a secret ({n[:12]}...) in the CLI's output" for n in scene.needles() if n in out.output]
    if out.returncode not in (0, 1):
        problems.append(f"(f) nas exited with {out.returncode} (0 or 1 expected; negative = killed by a signal)")
    if "Traceback (most recent call last)" in out.stderr:
        problems.append("(f) a Python traceback on stderr")
    if len(out.stdout) > MAX_OUTPUT or len(out.stderr) > MAX_OUTPUT:
        problems.append(f"(f) {len(out.stdout)} + {len(out.stderr)} bytes of output")
    if control := CONTROL.search(out.stdout):
        problems.append(f"(f) a control character ({control.group()!r}) on stdout")
    if spoof := next((c for c in out.stdout + out.stderr if unicodedata.category(c) in SPOOFING), None):
        problems.append(f"(f) a {unicodedata.category(spoof)} character ({spoof!r}) in the output: a line that reads "
                        "as another")
    if out.peak_rss_mb > PARENT_RSS_MB:
        problems.append(f"(h) nas itself peaked at {out.peak_rss_mb:.0f} MB resident, over {PARENT_RSS_MB} MB")
    return problems


def verdict_problems(case: Hostile, out: Outcome) -> list[str]:
    """(e) forged numbers and the header's expectation, from the CLI's verdict on this one file
    (for `validate`: its line alone, as `out.stdout`, exit 0 if that line says valid)."""
    problems = []
    if case.cli == "validate":
        valid = VALID.search(out.stdout)
        if valid:
            params, flops = (int(g.replace(",", "")) for g in valid.groups())
            if (params, flops) != (TRUE_PARAMS, TRUE_FLOPS["validate"]):
                problems.append(f"(e) reported {params} params, {flops} FLOPs; the network has "
                                f"{TRUE_PARAMS} params, {TRUE_FLOPS['validate']} FLOPs")
    elif out.returncode == 0:
        problems += train_problems(out.result)
        if self_reported(out.result) and SELF_REPORTED not in out.stdout:
            problems.append(f"(e) the printed result does not say it is {SELF_REPORTED}")
    seconds_allowed = (VALIDATE_WALL_S if case.cli == "validate" else case.wall_s or TRAIN_WALL_S) + SLACK_S
    if case.expect in ("invalid", "limits") and out.returncode != 1:
        problems.append(f"expected a rejection (exit 1), got exit {out.returncode}")
    if case.expect == "limits" and ("limits" not in out.output or out.seconds > seconds_allowed):
        problems.append(f"expected a limits failure within {seconds_allowed} s, got {out.seconds:.0f} s")
    return problems


def per_file(models: list[Path], out: Outcome, stamps: list[float]) -> tuple[list[Outcome | None], list[str]]:
    """`nas arch validate FILE...`'s verdict on each file (None: no line of its own) from its
    one line per file, in order, and what is wrong with the lines as a whole."""
    lines = out.stdout.splitlines()
    problems = []
    if len(lines) != len(models):
        problems.append(f"(f) {len(lines)} lines on stdout for {len(models)} files")
    verdicts: list[Outcome | None] = []
    for i, model in enumerate(models):
        line = lines[i] if i < len(lines) else ""
        if not line.startswith(f"{model}: "):
            verdicts.append(None)
            continue
        seconds = stamps[i] - (stamps[i - 1] if i else 0.0)
        verdicts.append(Outcome(0 if VALID.search(line) else 1, line + "\n", "", seconds))
    if out.returncode in (0, 1) and out.returncode != max((v.returncode or 0 for v in verdicts if v), default=0):
        problems.append(f"(f) nas exited with {out.returncode}, but its lines say otherwise")
    return verdicts, problems


def report(name: str, outcomes: dict[str, tuple[list[str], float | None]], peak_rss_mb: float) -> None:
    """For benchmarks/isolation.py: each case's problems and seconds, and the peak resident memory
    of the `nas` run that checked it (JSON, one file per test)."""
    if REPORT:
        cases = [{"case": case, "contained": not problems, "seconds": None if secs is None else round(secs, 3),
                  "parent_rss_mb": round(peak_rss_mb), "problems": problems[:3]}
                 for case, (problems, secs) in outcomes.items()]
        path = Path(REPORT, f"{name}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(json.dumps(cases))
        path.with_suffix(".tmp").replace(path)


def train_problems(record: dict | None) -> list[str]:
    if record is None:
        return ["(e) nas train exited 0 without writing --out"]
    if self_reported(record):  # the model's own claim, kept out of "best": nothing to compare
        return []
    problems = []
    metrics = record.get("metrics") or {}
    for name, value in [("accuracy", record.get("accuracy")), ("valid_accuracy", metrics.get("valid_accuracy")),
                        ("test_accuracy", metrics.get("test_accuracy"))]:
        if isinstance(value, (int, float)) and abs(value - FORGED_ACCURACY) < 0.01:
            problems.append(f"(e) {name} {value} is the forged value, and the result is not marked self_reported")
    measured = (record.get("params"), record.get("flops"))
    if record.get("error") is None and measured != (TRUE_PARAMS, TRUE_FLOPS["train"]):
        problems.append(f"(e) trained result says {measured[0]} params, {measured[1]} FLOPs; the network has "
                        f"{TRUE_PARAMS}, {TRUE_FLOPS['train']}")
    return problems


def describe(out: Outcome) -> str:
    return (f"exit {out.returncode} after {out.seconds:.1f} s\n--- stdout (tail)\n{out.stdout[-1500:]}"
            f"\n--- stderr (tail)\n{out.stderr[-1500:]}")


def test_hostile_files_are_well_formed() -> None:
    """Every template has its header, ships the shared network and uses only known placeholders."""
    assert len(CASES) >= 45
    for case in CASES:
        text = case.path.read_text(encoding="utf-8")
        assert case.kind in KINDS and case.cli in CLIS and case.expect in EXPECTS, case.stem
        assert case.cli == "train" or (case.wall_s, case.cpu_s) == (None, None), f"{case.stem}: limits for train only"
        assert "class Network(nn.Module):" in text and BASE_LINES in text, f"{case.stem}: not the shared network"
        unknown = set(re.findall(r"__[A-Z][A-Z_]*__", text)) - set(PLACEHOLDERS) - {"__PLACEHOLDERS__"}
        assert not unknown, f"{case.stem}: unknown placeholders {unknown}"
        compile(case.render({p: "1" for p in PLACEHOLDERS}), case.path.name, "exec")  # parses only
    assert {c.kind for c in CASES} == set(KINDS)


CLEAN = ("import torch\nfrom torch import nn\n\n\nclass Network(nn.Module):\n"
         "    def __init__(self, num_classes: int = 10):\n        super().__init__()\n" + BASE_LINES +
         "\n    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        return self.fc(self.features(x))\n")


# The clean model trains under the lowest CPU limit a case's header sets, so a sandbox that fails every
# model at that limit cannot pass the cases that must end in a limits failure.
CONTROL_CPU_S = min([TRAIN_CPU_S, *(c.cpu_s for c in TRAINED if c.cpu_s)])


@pytest.mark.parametrize("cli", CLIS)
def test_clean_model_passes_in_the_same_scene(cli: str, scene: Scene, canary: Canary) -> None:
    """The control: the shared network without an attack is accepted and measured honestly, so a
    CLI that refuses everything (e.g. no isolation available) cannot pass the hostile cases."""
    model = scene.models / "clean.py"
    model.write_text(CLEAN)
    before, first = scene.watched(), canary.count()
    out, _ = run_cli(scene, [model], cli, cpu_s=CONTROL_CPU_S)
    assert out.returncode == 0, describe(out)
    case = Hostile(path=model, attack="none", kind="forge", cli=cli)
    problems = cli_problems(scene, out) + verdict_problems(case, out)
    problems += containment(scene, [model], before, canary.since(first))
    assert not problems, "\n".join(problems) + "\n" + describe(out)
    if cli == "validate":
        assert VALID.search(out.stdout), describe(out)
    else:
        assert not self_reported(out.result) and 0 < out.result["accuracy"] < 100, out.result


@pytest.mark.parametrize("kind", GROUPS)
def test_hostile_models_are_contained(kind: str, scene: Scene, canary: Canary) -> None:
    """The `validate` cases of one kind, in one `nas arch validate FILE...` run: each file's line
    is judged on its own, containment for the run as a whole (the files share the run's
    marker; what an escape leaves behind is usually named after its attack)."""
    cases = GROUPS[kind]
    models = []
    for case in cases:
        models.append(scene.models / case.path.name)
        models[-1].write_text(case.render(scene.subs(canary.port, canary.sock)))
    before, first = scene.watched(), canary.count()
    out, stamps = run_cli(scene, models, "validate")
    verdicts, run_problems = per_file(models, out, stamps)
    run_problems += cli_problems(scene, out) + containment(scene, models, before, canary.since(first))
    own = {case.stem: (["(f) no line of its own on stdout"], None) if verdict is None
           else (verdict_problems(case, verdict), verdict.seconds) for case, verdict in zip(cases, verdicts)}
    report(f"validate-{kind}", {stem: (mine + run_problems, secs) for stem, (mine, secs) in own.items()},
           out.peak_rss_mb)
    problems = [f"{stem}: {p}" for stem, (mine, _) in own.items() for p in mine]
    problems += [f"the run: {p}" for p in run_problems]
    assert not problems, f"{kind} ({len(cases)} files):\n" + "\n".join(problems) + "\n" + describe(out)


@pytest.mark.parametrize("case", TRAINED, ids=[c.stem for c in TRAINED])
def test_hostile_trained_model_is_contained(case: Hostile, scene: Scene, canary: Canary) -> None:
    model = scene.models / case.path.name
    model.write_text(case.render(scene.subs(canary.port, canary.sock)))
    before, first = scene.watched(), canary.count()
    out, _ = run_cli(scene, [model], case.cli, case.wall_s or TRAIN_WALL_S, case.cpu_s or TRAIN_CPU_S)
    problems = cli_problems(scene, out) + verdict_problems(case, out)
    problems += containment(scene, [model], before, canary.since(first))
    report(f"train-{case.stem}", {case.stem: (problems, out.seconds)}, out.peak_rss_mb)
    assert not problems, f"{case.stem} ({case.attack}):\n" + "\n".join(problems) + "\n" + describe(out)


def test_unexportable_model_still_trains_on_the_data(scene: Scene, canary: Canary) -> None:
    """The one sandbox job that needs data: a model `torch.export` cannot trace is trained in
    a second child that is shown the training files (and only them); its result is self-reported."""
    model = scene.models / "untraceable.py"
    model.write_text(CLEAN.replace("        return self.fc(self.features(x))\n",
                                   "        h = self.features(x)\n        if h.sum() > 0:  # data-dependent\n"
                                   "            h = h * 1.0\n        return self.fc(h)\n"))
    out, _ = run_cli(scene, [model], "train")
    assert out.returncode == 0, describe(out)
    assert self_reported(out.result) and 0 < out.result["accuracy"] <= 100, out.result


def test_model_that_reads_the_data_is_refused_in_one_line(scene: Scene, canary: Canary) -> None:
    """A model that loads digits at import to memorise the valid and test labels (it scored
    100 % when the checking sandbox could read the venv's scikit-learn data) fails to import:
    the sandbox that checks and exports a model shows no dataset, and the parent trains the
    exported graph. The one line names the file it tried to read and the model's line."""
    case = next(c for c in CASES if c.stem == "data_memorise_digits")
    model = scene.models / case.path.name
    model.write_text(case.render(scene.subs(canary.port, canary.sock)))
    out, _ = run_cli(scene, [model], "train")
    assert out.returncode == 1, describe(out)
    errors = [line for line in out.stderr.splitlines() if line.strip() and not line.startswith("training ")]
    assert len(errors) == 1 and errors[0].startswith("nas: error: "), describe(out)
    assert "policy: reading datasets or $NASFLOW_HOME is not allowed" in errors[0], describe(out)
    assert "sklearn/datasets/data" in errors[0] and f"at {model.name}:" in errors[0], describe(out)
    assert not (out.result or {}).get("accuracy"), out.result


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killing_nas_leaves_nothing_behind(sig: signal.Signals, scene: Scene, canary: Canary) -> None:
    """(g) `nas` killed while the sandbox runs a model that sleeps forever (named with the
    marker, with a marked child): the sandbox, its children and its temp dir go with it."""
    sleeper = next(c for c in CASES if c.stem == "dos_sleep_forever")
    model = scene.models / sleeper.path.name
    model.write_text(sleeper.render(scene.subs(canary.port, canary.sock)))
    proc = start(scene, [model], "validate")
    began, running = time.monotonic(), {}
    try:
        while time.monotonic() - began < VALIDATE_WALL_S - 10:
            assert proc.poll() is None, f"nas ended before it could be killed: {proc.communicate()}"
            running = descendants(proc.pid)
            # ready: the model is sleeping (its marker shows), or the sandbox has run a while without one
            if marked_processes([scene.marker]) or (running and time.monotonic() - began > 25):
                break
            time.sleep(0.2)
        time.sleep(1)
        running = descendants(proc.pid)
        assert running, "the sandbox never started"
        os.kill(proc.pid, sig)
        proc.communicate(timeout=30)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            alive = {pid for pid, t in running.items() if start_time(pid) == t}
            procs, dirs = scene.leftovers(), scene.leaked_dirs()
            if not (alive or procs or dirs):
                break
            time.sleep(0.2)
        problems = [f"process left: pid {pid}" for pid in alive if pid not in procs]
        problems += [f"process left: {d}" for d in procs.values()] + [f"sandbox dir left: {d}" for d in dirs]
        assert not problems, f"after {sig.name} to nas:\n" + "\n".join(problems)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
