"""Mutation run: does the test suite notice when the code is wrong?

Makes small, realistic mutants of the modules under `--target` (a comparison flipped, `and`
for `or`, a `not` dropped, a boolean or small integer constant changed, a reversed slice made
forward, a returned value replaced by None, `+` for `-`), runs the chosen tests against each
mutant in a private copy of the tree, and counts a mutant killed when the tests fail (or time
out). Writes the kill rate and every survivor (file, line, the change) to JSON, so a survivor
is a test to write.

    python benchmarks/mutation.py --target nas/sandbox --tests 'tests/test_sandbox.py tests/test_graph.py' \\
        --sample 60 --out benchmarks/results/mutation_sandbox.json

The copy (the source folders and tests, without .venv, .git or run dirs) goes first on
PYTHONPATH, ahead of the editable install's finder, so nothing in the working tree changes
and other work there is never shown a mutant. Mutants are sampled with `--seed`: the same
sample on the same tree.
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

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


def mutants_of(path: Path, relative: str) -> list[Mutant]:
    source = path.read_text()
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "end_lineno") or node.end_lineno is None:
            continue
        original = ast.get_source_segment(source, node)
        if original is None:
            continue
        for kind, replacement in _variants(node):
            found.append(Mutant(relative, node.lineno, kind, original, ast.unparse(replacement),
                                (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)))  # type: ignore[arg-type]
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


def run_tests(copy: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p",
                               "no:randomly", "-o", "addopts=", *tests], cwd=copy, env=env,
                              capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - start
    outcome = {0: "survived", 5: "no tests"}.get(done.returncode, "killed")
    return outcome, time.perf_counter() - start


def _copy_tree(copy: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, copy / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
        else:
            shutil.copy2(src, copy / name)


def _locate(source: str, m: Mutant) -> Mutant | None:
    """The mutant placed on `source` as it is now: same spot if the text there still matches, else
    the nearest line whose node of that kind has the same text (the file may have moved on)."""
    for found in mutants_of_source(source, m.file):
        if found.start == m.start and found.original == m.original and found.mutated == m.mutated:
            return found
    near = [f for f in mutants_of_source(source, m.file)
            if f.original == m.original and f.mutated == m.mutated and f.kind == m.kind]
    return min(near, key=lambda f: abs(f.line - m.line)) if near else None


def mutants_of_source(source: str, relative: str) -> list[Mutant]:
    tmp = Path(tempfile.mkdtemp(prefix="nasflow-mutsrc-"))
    try:
        (tmp / "m.py").write_text(source)
        return mutants_of(tmp / "m.py", relative)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_all(chosen: list[Mutant], tests: list[str], timeout: float, jobs: int,
             progress=None) -> tuple[str, float]:
    """Runs the baseline, then every mutant, `jobs` at a time, each in its own private copy."""
    with tempfile.TemporaryDirectory(prefix="nasflow-mutation-") as tmp:
        copies = []
        for j in range(max(1, jobs)):
            copy = Path(tmp) / f"c{j}"
            copy.mkdir()
            _copy_tree(copy)
            copies.append(copy)
        baseline, seconds = run_tests(copies[0], tests, timeout)
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
                target = copy / m.file
                original = target.read_text()
                placed = _locate(original, m)
                if placed is None:
                    m.outcome = "gone"
                    return
                target.write_text(apply(original, placed))
                try:
                    m.outcome, m.seconds = run_tests(copy, tests, timeout)
                finally:
                    target.write_text(original)
            finally:
                with lock:
                    free.append(copy)
                    done[0] += 1
                    print(f"[{done[0]}/{len(chosen)}] {m.outcome:8} {m.file}:{m.line} {m.kind}: "
                          f"{m.original!r} -> {m.mutated!r} ({m.seconds:.0f} s)", flush=True)
                    if progress is not None:
                        progress(seconds)

        with ThreadPoolExecutor(len(copies)) as pool:
            list(pool.map(one, chosen))
        return baseline, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", nargs="+", help="folders or files whose modules are mutated")
    parser.add_argument("--tests", required=True, help="pytest arguments (one string, split on spaces): the tests that should notice")
    parser.add_argument("--sample", type=int, default=50, help="mutants to try (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test run; past it counts as killed")
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once, each in its own copy")
    parser.add_argument("--note", default="", help="free text kept in the JSON (what was sampled, which snapshot)")
    parser.add_argument("--recheck", action="store_true",
                        help="re-run the survivors recorded in --out against today's tests and add a 'final' block "
                             "(mutants listed in its 'equivalent' entries are left out of the final rate)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    tests = shlex.split(args.tests)
    out = Path(args.out)
    if args.recheck:
        return _recheck(out, tests, args)
    if not args.target:
        parser.error("--target is required")

    files = sorted({p for t in args.target for p in ([ROOT / t] if t.endswith(".py") else (ROOT / t).rglob("*.py"))})
    everything = [m for f in files for m in mutants_of(f, str(f.relative_to(ROOT)))]
    chosen = everything if not args.sample else random.Random(args.seed).sample(everything, min(args.sample,
                                                                                               len(everything)))
    chosen.sort(key=lambda m: (m.file, m.start))
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(seconds: float, partial: bool) -> dict:
        """Written after every mutant (partial: true) so a run cut short still leaves its numbers."""
        tried = [m for m in chosen if m.outcome and m.outcome not in ("no tests", "gone")]
        killed = [m for m in tried if m.outcome in ("killed", "timeout")]
        result = {"benchmark": "mutation", "target": args.target, "tests": tests, "seed": args.seed,
                  "sample": args.sample, "note": args.note, "snapshot_taken": started, "partial": partial,
                  "mutants_total": len(everything), "sampled": len(chosen), "tried": len(tried),
                  "killed": len(killed), "kill_rate": round(len(killed) / len(tried), 4) if tried else None,
                  "baseline_seconds": round(seconds, 1),
                  "survivors": [asdict(m) for m in tried if m.outcome == "survived"],
                  "mutants": [asdict(m) for m in chosen]}
        atomic_write_json(out, result)
        return result

    baseline, seconds = _run_all(chosen, tests, args.timeout, args.jobs, lambda s: write(s, True))
    if baseline != "survived":
        print(f"mutation: the tests do not pass on the unmutated tree ({baseline}); nothing to measure",
              file=sys.stderr)
        return 1
    result = write(seconds, False)
    killed = result["killed"]
    tried = result["tried"]
    print(f"mutation: killed {killed}/{tried} ({result['kill_rate']}); {out}")
    return 0


def _recheck(out: Path, tests: list[str], args: argparse.Namespace) -> int:
    import json

    result = json.loads(out.read_text())
    equivalent = result.get("final", {}).get("equivalent", [])

    def key(m: dict) -> tuple:
        return (m["file"], m["line"], m["original"], m["mutated"])

    skip = {key(e) for e in equivalent}
    again = [Mutant(**{**{k: (tuple(v) if k in ("start", "end") else v) for k, v in m.items()}, "outcome": "",
                       "seconds": 0.0})
             for m in result["survivors"] if key(m) not in skip]
    baseline, _ = _run_all(again, tests, args.timeout, args.jobs)
    if baseline != "survived":
        print(f"mutation: the tests do not pass on the unmutated tree ({baseline})", file=sys.stderr)
        return 1
    now_killed = [m for m in again if m.outcome in ("killed", "timeout")]
    still = [m for m in again if m.outcome not in ("killed", "timeout")]
    tried = result["tried"] - len(equivalent)
    killed = result["killed"] + len(now_killed)
    result["final"] = {"tests": tests, "checked": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "equivalent": equivalent,
                       "killed_by_new_tests": [asdict(m) for m in now_killed],
                       "still_surviving": [asdict(m) for m in still],
                       "tried_less_equivalent": tried, "killed": killed,
                       "kill_rate": round(killed / tried, 4) if tried else None}
    atomic_write_json(out, result)
    print(f"mutation: final killed {killed}/{tried} ({result['final']['kill_rate']}); {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
