"""Mutation run: does the test suite notice when the code is wrong?

Makes small, realistic mutants of the modules under `--target` (a comparison flipped, `and`
for `or`, a `not` dropped, a boolean or small integer constant changed, a reversed slice made
forward, a returned value replaced by None, `+` for `-`), runs the chosen tests against each
mutant in a private copy of the tree, and counts a mutant killed when the tests fail (or time
out). Writes the kill rate and every survivor (file, line, the change) to JSON, so a survivor
is a test to write.

    python benchmarks/mutation.py --target nas/sandbox --tests 'tests/test_sandbox.py tests/test_graph.py' \\
        --sample 60 --out benchmarks/results/mutation_sandbox.json

Over the whole library, each mutant running only the tests that run its line: first a coverage
map (the not-slow suite once under coverage, a context per test: benchmarks/covcontext.py), then
a sample stratified by package in proportion to its lines, a kill rate per package:

    python benchmarks/mutation.py --build-map /tmp/covmap.json --map-tests "-m 'not slow'" --jobs 2 --out -
    python benchmarks/mutation.py --library --map /tmp/covmap.json --sample 160 --jobs 2 \\
        --out benchmarks/results/mutation_library.json

A line no test runs is 'uncovered': not run, counted as survived; with `--file-tests` such a
mutant runs instead the tests that ran any line of its file (for lines coverage cannot see: code
run only in sandbox children or the trusted worker), so a first pass is not cut short by what the
map missed. Survivors judged equivalent are
listed by hand in the JSON's "equivalent" (file, line, original, mutated, reason); both rates are
reported, raw and less those. `--recheck` runs the survivors again with newer tests (`final`).

The copy (the source folders and tests, without .venv, .git or run dirs) goes first on
PYTHONPATH, ahead of the editable install's finder, so nothing in the working tree changes
and other work there is never shown a mutant. Mutants are sampled with `--seed`: the same
sample on the same tree.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from dataclasses import fields as fields_of
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json  # noqa: E402

COPIED = ("nas", "supernets", "tasks", "flows", "conf", "tests", "pyproject.toml", "benchmarks")

FLIP_COMPARE = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE,
                ast.GtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
FLIP_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult}


@dataclass
class Mutant:
    file: str
    line: int
    kind: str
    original: str
    mutated: str
    start: tuple[int, int]
    end: tuple[int, int]
    outcome: str = ""
    seconds: float = 0.0
    package: str = ""
    first_line: int = 0  # where the statement holding the change starts (its lines are the ones looked up)
    selection: str = ""  # line: the tests that ran it; import: it runs at import, the file's tests; none
    tests_run: int = 0
    killer: str = ""  # the first failing test (or "collection"), as pytest named it
    context: str = ""  # the text of the change's first line (stripped): which statement a short change sits in


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of docstring constants: changing one changes nothing a test could see."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _variants(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """(kind, replacement) for one node; the replacement is a changed copy."""
    out: list[tuple[str, ast.AST]] = []
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in FLIP_COMPARE:
        out.append(("compare", ast.Compare(node.left, [FLIP_COMPARE[type(node.ops[0])]()], node.comparators)))
    elif isinstance(node, ast.BoolOp):
        out.append(("boolean", ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        out.append(("not", node.operand))
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        out.append(("constant", ast.Constant(not node.value)))
    elif isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 64:
        out.append(("constant", ast.Constant(node.value + 1)))
    elif isinstance(node, ast.BinOp) and type(node.op) in FLIP_BINOP:
        out.append(("arithmetic", ast.BinOp(node.left, FLIP_BINOP[type(node.op)](), node.right)))
    elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice) and node.slice.lower is None
          and node.slice.upper is None and isinstance(node.slice.step, ast.UnaryOp)):
        out.append(("slice", node.value))  # x[::-1] -> x
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        out.append(("return", ast.Return(ast.Constant(None))))
    return out


def _statement_starts(tree: ast.AST) -> dict[int, int]:
    """id(node) -> the first line of the innermost statement holding it (a compound statement's
    header for a node in its header): coverage may record any line of a multi-line statement."""
    starts: dict[int, int] = {}

    def visit(node: ast.AST, first: int) -> None:
        for child in ast.iter_child_nodes(node):
            line = child.lineno if isinstance(child, ast.stmt) else first
            starts[id(child)] = line
            visit(child, line)

    visit(tree, 1)
    return starts


def _segment(lines: list[bytes], node: ast.AST) -> str:
    """ast.get_source_segment from lines split once (it splits the whole source again per node,
    which is quadratic in a module's size). Columns are UTF-8 byte offsets."""
    l0, c0 = node.lineno - 1, node.col_offset  # type: ignore[attr-defined]
    l1, c1 = node.end_lineno - 1, node.end_col_offset  # type: ignore[attr-defined]
    if l0 == l1:
        return lines[l0][c0:c1].decode()
    return b"".join([lines[l0][c0:], *lines[l0 + 1:l1], lines[l1][:c1]]).decode()


def mutants_of(path: Path, relative: str) -> list[Mutant]:
    source = path.read_text()
    tree = ast.parse(source)
    lines = source.encode().splitlines(keepends=True)
    skip = _docstrings(tree)
    starts = _statement_starts(tree)
    found = []
    node: Any
    for node in ast.walk(tree):
        if id(node) in skip or getattr(node, "end_lineno", None) is None or getattr(node, "end_col_offset", None) is None:
            continue
        original = _segment(lines, node)
        for kind, replacement in _variants(node):
            found.append(Mutant(relative, node.lineno, kind, original, ast.unparse(replacement),
                                (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset),
                                first_line=min(starts.get(id(node), node.lineno), node.lineno),
                                context=lines[node.lineno - 1].decode().strip()))
    return found


def apply(source: str, m: Mutant) -> str:
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line.encode()))
    data = source.encode()
    start = offsets[m.start[0] - 1] + m.start[1]
    end = offsets[m.end[0] - 1] + m.end[1]
    replacement = m.mutated
    if m.kind in ("boolean", "arithmetic", "compare", "not", "slice"):
        replacement = f"({replacement})"
    return (data[:start] + replacement.encode() + data[end:]).decode()


# The operator classes above, by the names cosmic-ray (and mutmut) give the same changes.
OPERATORS = {"compare": "ReplaceComparisonOperator (==/!=, </<=, >/>=, in/not in, is/is not)",
             "boolean": "ReplaceAndWithOr / ReplaceOrWithAnd",
             "not": "RemoveNot (mutmut: `not x` -> `x`)",
             "constant": "ReplaceTrueWithFalse / ReplaceFalseWithTrue; NumberReplacer (int 0..64 -> n+1, mutmut's)",
             "arithmetic": "ReplaceBinaryOperator (+/-, * -> //, // -> *)",
             "slice": "reversed slice made forward (x[::-1] -> x)",
             "return": "return value -> None (mutmut's `return x` -> `return None`)"}
LIBRARY = ("nas", "supernets", "tasks", "flows")


# ---- what is mutated, and how many of each package ----------------------------------------------

def source_lines(path: Path) -> int:
    """Lines of code: not blank, not only a comment."""
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))


def library_packages(root: Path = ROOT) -> dict[str, list[Path]]:
    """The library by package: each subpackage of nas/ (nas/core, nas/sandbox, ...), nas's own
    top-level modules as one package `nas`, and supernets, tasks and flows."""
    groups: dict[str, list[Path]] = {}
    for top in LIBRARY:
        base = root / top
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base)
            name = f"{top}/{rel.parts[0]}" if top == "nas" and len(rel.parts) > 1 else top
            groups.setdefault(name, []).append(path)
    return {name: files for name, files in groups.items() if any(source_lines(f) for f in files)}


def target_groups(targets: list[str], root: Path = ROOT) -> dict[str, list[Path]]:
    """`--target` folders or files, one group per module."""
    files = sorted({p for t in targets for p in ([root / t] if t.endswith(".py") else (root / t).rglob("*.py"))})
    return {str(f.relative_to(root)): [f] for f in files if source_lines(f)}


def allocate(lines: dict[str, int], available: dict[str, int], total: int, minimum: int) -> dict[str, int]:
    """How many mutants each group gets: first `minimum` (or all it has), the rest in proportion
    to lines by largest remainder, never more than a group has; what a full group cannot take
    goes to the others in proportion too."""
    quota = {g: min(minimum, available[g]) for g in lines}
    left = total - sum(quota.values())
    while left > 0:
        open_ = [g for g in lines if quota[g] < available[g]]
        if not open_:
            break
        weight = sum(lines[g] for g in open_)
        if weight == 0:
            break
        share = {g: left * lines[g] / weight for g in open_}
        give = {g: min(int(share[g]), available[g] - quota[g]) for g in open_}
        given = sum(give.values())
        if given < left:  # the remainders, largest first, one each
            for g in sorted(open_, key=lambda g: (share[g] - int(share[g]), lines[g]), reverse=True):
                if given == left:
                    break
                if quota[g] + give[g] < available[g]:
                    give[g] += 1
                    given += 1
        for g in open_:
            quota[g] += give[g]
        if given == 0:
            break
        left -= given
    return quota


def stratified_sample(groups: dict[str, list[Mutant]], lines: dict[str, int], total: int, minimum: int,
                      seed: int) -> list[Mutant]:
    """`total` mutants across the groups by `allocate`, each group's drawn with its own generator
    (seeded by `seed` and the group's name), so a group's draw does not depend on the others."""
    quota = allocate(lines, {g: len(ms) for g, ms in groups.items()}, total, minimum)
    chosen: list[Mutant] = []
    for g in sorted(groups):
        rng = random.Random(f"{seed}:{g}")
        for m in rng.sample(groups[g], quota[g]):
            m.package = g
            chosen.append(m)
    chosen.sort(key=lambda m: (m.package, m.file, m.start))
    return chosen


# ---- the coverage map: which tests run which line -----------------------------------------------

COVERAGE_RC = """[run]
data_file = {data}
parallel = true
source =
{sources}
context = ${{NASFLOW_COV_CONTEXT-}}
"""


def build_map(pytest_args: list[str], out: Path, jobs: int, work: Path) -> dict:
    """Runs the tests once under coverage with a context per test (benchmarks/covcontext.py) and
    writes {"tests": {id: {seconds, outcome}}, "lines": {file: {line: [test index]}},
    "import_lines": {file: [line]}} (file relative to the root; test index into "test_ids")."""
    import coverage

    work.mkdir(parents=True, exist_ok=True)
    rc = work / "coveragerc"
    rc.write_text(COVERAGE_RC.format(data=work / ".coverage",
                                     sources="\n".join(f"    {ROOT / t}" for t in LIBRARY)))
    env = {**os.environ, "COVERAGE_PROCESS_START": str(rc), "NASFLOW_COVMAP_DIR": str(work),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])}
    env.pop("NASFLOW_COV_CONTEXT", None)
    xdist = ["-n", str(jobs), "--dist", "worksteal"] if jobs > 1 else ["-p", "no:xdist"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "covcontext", "-p", "no:randomly",
                           "-p", "no:cacheprovider", *xdist, *pytest_args], cwd=ROOT, env=env, check=False)
    seconds = time.perf_counter() - start
    data = coverage.CoverageData(basename=str(work / ".coverage"))
    coverage.Coverage(config_file=str(rc), data_file=str(work / ".coverage")).combine(data_paths=[str(work)])
    data = coverage.CoverageData(basename=str(work / ".coverage"))
    data.read()
    tests = json.loads((work / "tests.json").read_text())
    ids = sorted(tests)
    index = {t: i for i, t in enumerate(ids)}
    lines: dict[str, dict[str, list[int]]] = {}
    import_lines: dict[str, list[int]] = {}
    for filename in sorted(data.measured_files()):
        try:
            rel = str(Path(filename).resolve().relative_to(ROOT))
        except ValueError:
            continue
        by_line = data.contexts_by_lineno(filename)
        lines[rel] = {str(n): sorted({index[c] for c in cs if c in index}) for n, cs in sorted(by_line.items())}
        import_lines[rel] = sorted(n for n, cs in by_line.items() if "" in cs)
    result = {"pytest_args": pytest_args, "jobs": jobs, "exit_status": done.returncode, "seconds": round(seconds, 1),
              "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "test_ids": ids, "tests": tests, "lines": lines, "import_lines": import_lines}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    shutil.rmtree(work, ignore_errors=True)
    return result


def _words(name: str) -> set[str]:
    """A name's words, each also without a plural's `s`: `supernets` meets `supernet`."""
    words = {w for w in name.split("_") if w}
    return words | {w[:-1] for w in words if w.endswith("s") and len(w) > 3}


def own_test(test_id: str, file: str) -> bool:
    """Whether a test's file is named for the module's file or folder: tests/test_llm_client.py for
    nas/llm/client.py, tests/test_supernet_ranking.py for supernets/train.py (not `nas`, the whole library)."""
    stem = Path(test_id.split("::", 1)[0]).stem.removeprefix("test_")
    module = Path(file)
    names = {module.stem} | ({module.parent.name} if module.parent.name not in ("", "nas") else set())
    return bool(_words(stem) & set().union(*(_words(n) for n in names if n != "__init__")))


class Selector:
    """Picks, for a mutant, the passing tests that ran its lines (the statement's first line to the
    change's last), fastest first, at most `cap`. A line run at import outside any test (at
    collection) is a module-level line: every test that ran any line of its file sees its effect,
    so those are added. A line no passing test ran is "none": the mutant is not run, and counts as
    survived."""

    def __init__(self, covmap: dict, cap: int, budget: float = 0.0, own_first: bool = False):
        self.cap = cap
        self.budget = budget
        self.own_first = own_first
        self.covmap = covmap
        ids = covmap["test_ids"]
        tests = covmap["tests"]
        self.ids = ids
        self.seconds = [tests[t]["seconds"] for t in ids]
        self.ok = [tests[t]["outcome"] == "passed" for t in ids]
        self.lines = {f: {int(n): v for n, v in by.items()} for f, by in covmap["lines"].items()}
        self.import_lines = {f: set(v) for f, v in covmap.get("import_lines", {}).items()}

    def select(self, m: Mutant) -> tuple[str, list[str], float]:
        by = self.lines.get(m.file, {})
        span = range(m.first_line or m.line, m.end[0] + 1)
        found = {i for n in span for i in by.get(n, ())}
        how = "line"
        if any(n in self.import_lines.get(m.file, ()) for n in span):
            found |= {i for v in by.values() for i in v}
            how = "import"
        found = {i for i in found if self.ok[i]}
        if not found:
            return "none", [], 0.0
        picked = self._fastest(found, m.file)
        return how, [self.ids[i] for i in picked], sum(self.seconds[i] for i in picked)

    def _fastest(self, found: set[int], file: str) -> list[int]:
        """Fastest first, at most `cap`, and (with a budget) those that fit while their recorded seconds
        add up to at most `budget`: always the first. With `own_first`, the module's own tests
        (`own_test`) come before the rest, so a line every test runs still gets the tests written for it."""
        def order(i: int) -> tuple:
            return (self.own_first and not own_test(self.ids[i], file), self.seconds[i], self.ids[i])

        ordered = sorted(found, key=order)[:self.cap]
        if not self.budget:
            return ordered
        picked: list[int] = []
        spent = 0.0
        for i in ordered:
            if picked and spent + self.seconds[i] > self.budget:
                continue
            picked.append(i)
            spent += self.seconds[i]
        return picked

    def pick(self, m: Mutant, file_tests: bool = False) -> tuple[str, list[str], float]:
        """`select`; for a mutant it finds no tests for ("none") and with `file_tests`, `select_file`."""
        chosen = self.select(m)
        if chosen[0] == "none" and file_tests:
            return self.select_file(m)
        return chosen

    def select_file(self, m: Mutant) -> tuple[str, list[str], float]:
        """The passing tests that ran any line of the mutant's file (fastest first, at most `cap`): for
        a line coverage could not see, run only in a process it does not measure (a sandbox child
        under bubblewrap, the trusted worker's checks: both get an empty environment)."""
        found = {i for v in self.lines.get(m.file, {}).values() for i in v if self.ok[i]}
        picked = self._fastest(found, m.file)
        return ("file" if picked else "none"), [self.ids[i] for i in picked], sum(self.seconds[i] for i in picked)


# ---- running the tests against a mutant ---------------------------------------------------------

def run_tests(copy: Path, tests: list[str], timeout: float, first: bool = True) -> tuple[str, float, str]:
    """(outcome, seconds, the first failing test): the tests in `copy`, in a process group of their
    own, so a timeout ends whatever they started too. `first=False`: every test runs (no -x), and
    the third item names every failing one, a line each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_") and k != "NASFLOW_COV_CONTEXT"}
    env.update({"PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"})
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", *(["-x"] if first else []), "-rfE", "-p",
                             "no:cacheprovider", "-p",
                             "no:randomly", "-p", "no:xdist", "-o", "addopts=", *tests], cwd=copy, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", time.perf_counter() - start, ""
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the tests left running
        except ProcessLookupError:
            pass
    seconds = time.perf_counter() - start
    if proc.returncode == 0:
        return "survived", seconds, ""
    if proc.returncode == 5:
        return "no tests", seconds, ""
    if proc.returncode in (3, 4) and "ERROR: not found:" in out and "conftest" not in out:
        return "error", seconds, out[-400:]  # a node id not found: not the mutant's doing (its tests did not run)
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
    if not first:
        return "killed", seconds, "\n".join(failed)
    return "killed", seconds, failed[0] if failed else "collection"


def _copy_tree(copy: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, copy / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
        else:
            shutil.copy2(src, copy / name)


DISTINCT = 8  # a change's text longer than this names its statement; a shorter one (`True`, `0`) does not


def _locate(source: str, m: Mutant) -> Mutant | None:
    """The mutant placed on `source` as it is now: same spot if the text there still matches, else
    the nearest line whose node of that kind has the same text (the file may have moved on). A short
    change (`True`, `1`) moves only with its line's text (`context`): matched on text alone it would
    be some other statement's constant, a different mutant; without a recorded line, not at all."""
    for found in mutants_of_source(source, m.file):
        if found.start == m.start and found.original == m.original and found.mutated == m.mutated \
                and (len(m.original) > DISTINCT or not m.context or found.context == m.context):
            return found
    near = [f for f in mutants_of_source(source, m.file)
            if f.original == m.original and f.mutated == m.mutated and f.kind == m.kind
            and (len(m.original) > DISTINCT or (m.context and f.context == m.context))]
    return min(near, key=lambda f: abs(f.line - m.line)) if near else None


def mutants_of_source(source: str, relative: str) -> list[Mutant]:
    tmp = Path(tempfile.mkdtemp(prefix="nasflow-mutsrc-"))
    try:
        (tmp / "m.py").write_text(source)
        return mutants_of(tmp / "m.py", relative)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


Plan = Callable[[Mutant], "tuple[list[str], float]"]


def _run_all(chosen: list[Mutant], plan: Plan, baseline_tests: list[str] | None, timeout: float,
             jobs: int, progress=None) -> tuple[str, float]:
    """Runs the baseline (if any), then every mutant, `jobs` at a time, each in its own private
    copy. `plan(m)` gives the mutant's tests and its time limit; no tests: "uncovered", not run."""
    with tempfile.TemporaryDirectory(prefix="nasflow-mutation-") as tmp:
        copies = []
        for j in range(max(1, jobs)):
            copy = Path(tmp) / f"c{j}"
            copy.mkdir()
            _copy_tree(copy)
            copies.append(copy)
        baseline, seconds = "survived", 0.0
        if baseline_tests:
            baseline, seconds, _ = run_tests(copies[0], baseline_tests, timeout)
            if baseline != "survived":
                return baseline, seconds
        print(f"mutation: {len(chosen)} mutants, {len(copies)} at a time, baseline {seconds:.0f} s", flush=True)
        free = list(copies)
        lock = threading.Lock()
        done = [0]

        def one(m: Mutant) -> None:
            with lock:
                copy = free.pop()
            try:
                tests, limit = plan(m)
                m.tests_run = len(tests)
                if not tests:
                    m.outcome = "uncovered"
                    return
                target = copy / m.file
                original = target.read_text()
                placed = _locate(original, m)
                if placed is None:
                    m.outcome = "gone"
                    return
                target.write_text(apply(original, placed))
                try:
                    m.outcome, m.seconds, m.killer = run_tests(copy, tests, limit)
                    m.seconds = round(m.seconds, 1)
                finally:
                    target.write_text(original)
            finally:
                with lock:
                    free.append(copy)
                    done[0] += 1
                    print(f"[{done[0]}/{len(chosen)}] {m.outcome:9} {m.file}:{m.line} {m.kind}: "
                          f"{m.original!r} -> {m.mutated!r} ({m.tests_run} tests, {m.seconds:.0f} s)", flush=True)
                    if progress is not None:
                        progress(seconds)

        with ThreadPoolExecutor(len(copies)) as pool:
            list(pool.map(one, chosen))
        return baseline, seconds


def _clean_check(chosen: list[Mutant], timeout: float) -> list[str]:
    """The tests that killed a mutant, run once more on the unmutated tree (together, to the end): a
    test that fails there too proves nothing, and its mutants are run again without it. Returns
    those tests."""
    killers = sorted({m.killer for m in chosen if m.outcome == "killed" and m.killer not in ("", "collection")})
    if not killers:
        return []
    with tempfile.TemporaryDirectory(prefix="nasflow-mutation-clean-") as tmp:
        copy = Path(tmp)
        _copy_tree(copy)
        outcome, _, failed = run_tests(copy, killers, timeout * 4, first=False)
    if outcome == "timeout":
        print("mutation: the clean check of the killing tests timed out; kills left as they are", flush=True)
        return []
    return [t for t in failed.splitlines() if t in killers]


def _without_flaky_killers(chosen: list[Mutant], plan: Plan, args: argparse.Namespace) -> list[str]:
    """`_clean_check`, then the mutants those tests killed run again without them. Returns the tests."""
    flaky = _clean_check(chosen, args.timeout)
    if flaky:
        again = [m for m in chosen if m.outcome == "killed" and m.killer in flaky]
        print(f"mutation: {len(flaky)} killing tests fail on the unmutated tree too; {len(again)} mutants again "
              f"without them", flush=True)

        def plan_again(m: Mutant) -> tuple[list[str], float]:
            picked, limit = plan(m)
            return [t for t in picked if t not in flaky], limit

        for m in again:
            m.outcome = ""
        _run_all(again, plan_again, None, args.timeout, args.jobs)
    return flaky


# ---- the numbers ------------------------------------------------------------------------------------

COUNTED = ("killed", "timeout", "survived", "uncovered")


def _key(m: dict | Mutant) -> tuple:
    d = asdict(m) if isinstance(m, Mutant) else m
    return (d["file"], d["line"], d["original"], d["mutated"])


def wilson(k: int, n: int, z: float = 1.96) -> list[float] | None:
    if not n:
        return None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def tally(mutants: list[dict], equivalent: set[tuple]) -> dict:
    """Counts of one group: the raw kill rate over every counted mutant (killed and timeout count as
    killed; survived and uncovered as not), and the rate less the mutants listed as equivalent."""
    counted = [m for m in mutants if m["outcome"] in COUNTED]
    killed = [m for m in counted if m["outcome"] in ("killed", "timeout")]
    listed = [m for m in counted if _key(m) in equivalent]
    rest = len(counted) - len(listed)
    return {"tried": len(counted), "killed": len(killed),
            "timeout": sum(m["outcome"] == "timeout" for m in counted),
            "survived": sum(m["outcome"] == "survived" for m in counted),
            "uncovered": sum(m["outcome"] == "uncovered" for m in counted),
            "not_counted": {o: sum(m["outcome"] == o for m in mutants)
                            for o in sorted({m["outcome"] for m in mutants} - set(COUNTED))},
            "kill_rate": round(len(killed) / len(counted), 4) if counted else None,
            "kill_rate_95ci": wilson(len(killed), len(counted)),
            "equivalent_listed": len(listed),
            "kill_rate_less_equivalent": round(len(killed) / rest, 4) if rest else None}


def summarise(mutants: list[dict], lines: dict[str, int], totals: dict[str, int], equivalent: set[tuple]) -> dict:
    packages = {}
    for g in sorted(lines):
        ms = [m for m in mutants if m["package"] == g]
        packages[g] = {"lines": lines[g], "mutants_total": totals[g], "sampled": len(ms), **tally(ms, equivalent)}
    overall = {"lines": sum(lines.values()), "mutants_total": sum(totals.values()), "sampled": len(mutants),
               **tally(mutants, equivalent)}
    rated = [p for p in packages.values() if p["kill_rate"] is not None]
    if rated:  # each package's rate weighted by its lines: the library's rate had it been sampled exactly pro rata
        weight = sum(p["lines"] for p in rated)
        overall["kill_rate_line_weighted"] = round(sum(p["kill_rate"] * p["lines"] for p in rated) / weight, 4)
    return {"overall": overall, "packages": packages}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", nargs="+", help="folders or files whose modules are mutated (one group a module)")
    parser.add_argument("--library", action="store_true",
                        help="mutate the whole library: nas's subpackages, nas's own modules, supernets, tasks, flows")
    parser.add_argument("--tests", default="",
                        help="pytest arguments (one string, split on spaces): without --map the tests every mutant "
                             "runs; with --map, tests added to each mutant's own (tests newer than the map)")
    parser.add_argument("--map", help="the coverage map (--build-map): each mutant runs only the tests that ran it")
    parser.add_argument("--build-map", metavar="MAP", help="run --map-tests under coverage and write the map; then stop")
    parser.add_argument("--map-tests", default="-m 'not slow'", help="pytest arguments for --build-map")
    parser.add_argument("--cap", type=int, default=60, help="with --map: at most this many tests a mutant, the fastest")
    parser.add_argument("--budget", type=float, default=0,
                        help="with --map: the fastest tests a mutant only while their recorded seconds add up to at "
                             "most this (the fastest one always); 0: no budget")
    parser.add_argument("--own-tests-first", action="store_true",
                        help="with --map: the module's own tests (their file named for its file or folder) before "
                             "the rest, then the fastest")
    parser.add_argument("--sample", type=int, default=50, help="mutants to try (0: all)")
    parser.add_argument("--minimum", type=int, default=4, help="mutants at least from each group (package or module)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds per test run (with --map: plus 3x the selected tests' recorded time); past it "
                             "counts as killed")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once, each in its own copy")
    parser.add_argument("--note", default="", help="free text kept in the JSON (what was sampled, which snapshot)")
    parser.add_argument("--recheck", action="store_true",
                        help="re-run the survivors recorded in --out against today's tests and add a 'final' block")
    parser.add_argument("--file-tests", action="store_true",
                        help="with --map: a mutant on a line no test ran (uncovered) runs the tests that ran any line "
                             "of its file instead (lines run only where coverage cannot see: sandbox children, the "
                             "trusted worker); in a first run and in --recheck")
    parser.add_argument("--only-new", action="store_true",
                        help="with --recheck: leave out the map's tests that the first run already passed on that "
                             "mutant (its selection at its cap and budget); the rest, and --tests, run")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    tests = shlex.split(args.tests)
    out = Path(args.out)
    if args.build_map:
        made = build_map(shlex.split(args.map_tests), Path(args.build_map), args.jobs,
                         Path(tempfile.mkdtemp(prefix="nasflow-covmap-")))
        counts = {o: sum(t["outcome"] == o for t in made["tests"].values()) for o in ("passed", "failed", "skipped")}
        print(f"mutation: coverage map of {len(made['test_ids'])} tests {counts} in {made['seconds']:.0f} s, "
              f"{len(made['lines'])} files; {args.build_map}")
        return 0
    selector = (Selector(json.loads(Path(args.map).read_text()), args.cap, args.budget, args.own_tests_first)
                if args.map else None)
    if selector is None and not tests:
        parser.error("--tests is required without --map")
    if args.recheck:
        return _recheck(out, tests, selector, args)
    if not (args.target or args.library):
        parser.error("--target or --library is required")

    files = library_packages() if args.library else target_groups(args.target)
    lines = {g: sum(source_lines(f) for f in fs) for g, fs in files.items()}
    groups = {g: [m for f in fs for m in mutants_of(f, str(f.relative_to(ROOT)))] for g, fs in files.items()}
    groups = {g: ms for g, ms in groups.items() if ms}  # a module of imports only (an __init__) has none
    lines = {g: n for g, n in lines.items() if g in groups}
    for g, ms in groups.items():
        for m in ms:
            m.package = g
    everything = [m for ms in groups.values() for m in ms]
    if args.sample:
        chosen = stratified_sample(groups, lines, args.sample, args.minimum, args.seed)
    else:
        chosen = sorted(everything, key=lambda m: (m.package, m.file, m.start))
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    clock = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    # equivalents listed in an earlier run of the same sample are kept (and count only if still sampled)
    earlier = json.loads(out.read_text()) if out.is_file() else {}
    sampled_keys = {_key(m) for m in chosen}
    equivalent = [e for e in earlier.get("equivalent", []) if _key(e) in sampled_keys]

    def plan(m: Mutant) -> tuple[list[str], float]:
        if selector is None:
            m.selection = "given"
            return tests, args.timeout
        m.selection, picked, expected = selector.pick(m, args.file_tests)
        if not picked:
            return [], 0.0
        return [*picked, *tests], args.timeout + 3 * expected

    def write(partial: bool, flaky: list[str] | None = None) -> dict:
        """Written after every mutant (partial: true) so a run cut short still leaves its numbers."""
        done = [asdict(m) for m in chosen if m.outcome]
        numbers = summarise(done, lines, {g: len(ms) for g, ms in groups.items()}, {_key(e) for e in equivalent})
        result = {"benchmark": "mutation", "mode": "library" if args.library else "target",
                  "target": list(LIBRARY) if args.library else args.target,
                  "tool": {"name": "benchmarks/mutation.py", "operators": OPERATORS,
                           "drawn": "every mutant the operators make in each module's AST (docstrings left out), "
                                    "sampled at random with the seed, stratified by group: at least --minimum each, "
                                    "the rest in proportion to the group's lines of code (largest remainder)"},
                  "seed": args.seed, "sample": args.sample, "minimum_per_group": args.minimum, "note": args.note,
                  "snapshot_taken": started, "partial": partial,
                  "runtime_seconds": round(time.perf_counter() - clock, 1),
                  "selection": ({"map": args.map, "map_made": selector_made, "map_tests": selector_args,
                                 "cap": args.cap, "budget_seconds": args.budget,
                                 "own_tests_first": args.own_tests_first,
                                 "cap_rule": "the fastest by the map's recorded duration, at most `cap`, and only "
                                             "while their recorded seconds add up to `budget_seconds` (the fastest "
                                             "always runs)",
                                 "extra_tests": tests,
                                 "rule": "a mutant runs the passing tests that ran its statement's lines in the "
                                         "coverage run (per-test contexts, subprocesses included); a module-level "
                                         "line run at import (at collection) adds the tests that ran any line of "
                                         "its file; a "
                                         "line no test ran is 'uncovered' and counts as survived, not run"
                                         + ("; with uncovered_ran_file_tests, such a line runs instead the "
                                            "passing tests that ran any line of its file (selection 'file'), "
                                            "and is 'uncovered' only if none did" if args.file_tests else ""),
                                 "uncovered_ran_file_tests": bool(args.file_tests)}
                                if selector is not None else {"tests": tests}),
                  "time_limit": (f"{args.timeout:.0f} s + 3x the selected tests' recorded seconds"
                                 if selector is not None else f"{args.timeout:.0f} s") + "; a timeout counts as killed",
                  "pytest": "-x -q -p no:randomly -p no:cacheprovider -o addopts=, node ids fastest first",
                  "counted": "killed and timeout count as killed; survived and uncovered as survived; 'gone', "
                             "'error' (pytest usage/internal error) and 'no tests' are listed, not counted",
                  "flaky_killers": flaky or [],
                  **numbers,
                  "equivalent": equivalent,
                  "survivors": [m for m in done if m["outcome"] in ("survived", "uncovered")],
                  "mutants": [asdict(m) for m in chosen]}
        atomic_write_json(out, result)
        return result

    selector_made = selector_args = None
    if selector is not None:
        raw = json.loads(Path(args.map).read_text())
        selector_made, selector_args = raw.get("made"), raw.get("pytest_args")
        del raw
    # the given tests (with a map: those newer than it) must pass on the unmutated tree, or every
    # mutant would count as killed by them
    baseline, _ = _run_all(chosen, plan, tests, args.timeout, args.jobs, lambda s: write(True))
    if baseline != "survived":
        print(f"mutation: the tests do not pass on the unmutated tree ({baseline}); nothing to measure",
              file=sys.stderr)
        return 1
    flaky = _without_flaky_killers(chosen, plan, args) if selector is not None else []
    result = write(False, flaky)
    o = result["overall"]
    print(f"mutation: killed {o['killed']}/{o['tried']} ({o['kill_rate']}); {out}")
    for g, p in result["packages"].items():
        print(f"  {g:24} {p['killed']:3}/{p['tried']:<3} {p['kill_rate']}")
    return 0


def _recheck(out: Path, tests: list[str], selector: Selector | None, args: argparse.Namespace) -> int:
    """Runs the recorded survivors again (the map's tests for each, plus --tests) and adds a 'final'
    block: the counts with the survivors the new tests kill, raw and less the listed equivalents."""
    result = json.loads(out.read_text())
    equivalent = result.get("equivalent", []) or result.get("final", {}).get("equivalent", [])
    fields = {f.name for f in fields_of(Mutant)}
    errors = [m for m in result["mutants"] if m["outcome"] == "error"]  # pytest's own error: run again as well
    kept: list[dict[str, Any]] = [{k: (tuple(v) if k in ("start", "end") else v) for k, v in m.items() if k in fields}
                                  for m in [*result["survivors"], *errors]]
    again = [Mutant(**{**m, "outcome": "", "seconds": 0.0}) for m in kept]

    first = result.get("selection", {})
    before = (Selector(selector.covmap, first["cap"], first.get("budget_seconds", 0.0),
                       first.get("own_tests_first", False))
              if selector is not None and args.only_new and "cap" in first else None)

    def plan(m: Mutant) -> tuple[list[str], float]:
        picked: list[str] = []
        expected = 0.0
        if selector is not None:
            m.selection, picked, expected = selector.pick(m, args.file_tests)
            if before is not None and m.selection in ("line", "import"):  # those it passed in the first run
                ran = set(before.select(m)[1])
                picked = [t for t in picked if t not in ran]
        return [*tests, *[t for t in picked if t not in tests]], args.timeout + 3 * expected  # the new tests first

    def finish(partial: bool) -> dict:
        """The final block, written after every mutant (partial: true; the ones not yet run again keep
        their first outcome) so a recheck cut short still leaves its numbers."""
        by_key = {_key(m): asdict(m) for m in again if m.outcome}
        mutants = [by_key.get(_key(m), m) if m["outcome"] in ("survived", "uncovered", "error") else m
                   for m in result["mutants"]]
        if "packages" in result:
            lines = {g: p["lines"] for g, p in result["packages"].items()}
            totals = {g: p["mutants_total"] for g, p in result["packages"].items()}
            numbers = summarise([m for m in mutants if m["outcome"]], lines, totals, {_key(e) for e in equivalent})
        else:
            numbers = {"overall": tally([m for m in mutants if m["outcome"]], {_key(e) for e in equivalent})}
        result["final"] = {"tests": tests, "checked": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "partial": partial, "rerun": sum(1 for m in again if m.outcome), "to_rerun": len(again),
                           "uncovered_ran_file_tests": bool(args.file_tests),
                           "selection": {"cap": args.cap, "budget_seconds": args.budget,
                                         "own_tests_first": args.own_tests_first,
                                         "left_out_first_run_s_tests": bool(before is not None)},
                           "equivalent": equivalent,
                           "killed_by_new_tests": [asdict(m) for m in again if m.outcome in ("killed", "timeout")],
                           "still_surviving": [asdict(m) for m in again
                                               if m.outcome and m.outcome not in ("killed", "timeout")],
                           **numbers}
        atomic_write_json(out, result)
        return numbers

    baseline, _ = _run_all(again, plan, tests, args.timeout, args.jobs, lambda s: finish(True))
    if baseline != "survived":
        print(f"mutation: the tests do not pass on the unmutated tree ({baseline})", file=sys.stderr)
        return 1
    flaky = _without_flaky_killers(again, plan, args)
    numbers = finish(False)
    if flaky:
        result["final"]["flaky_killers"] = flaky
        atomic_write_json(out, result)
    o = numbers["overall"]
    print(f"mutation: final killed {o['killed']}/{o['tried']} ({o['kill_rate']}; less equivalent "
          f"{o['kill_rate_less_equivalent']}); {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
