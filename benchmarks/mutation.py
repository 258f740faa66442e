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
import time
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", nargs="+", required=True, help="folders or files whose modules are mutated")
    parser.add_argument("--tests", required=True, help="pytest arguments (one string, split on spaces): the tests that should notice")
    parser.add_argument("--sample", type=int, default=50, help="mutants to try (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test run; past it counts as killed")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    tests = shlex.split(args.tests)

    files = sorted({p for t in args.target for p in ([ROOT / t] if t.endswith(".py") else (ROOT / t).rglob("*.py"))})
    everything = [m for f in files for m in mutants_of(f, str(f.relative_to(ROOT)))]
    chosen = everything if not args.sample else random.Random(args.seed).sample(everything, min(args.sample,
                                                                                               len(everything)))
    chosen.sort(key=lambda m: (m.file, m.start))
    with tempfile.TemporaryDirectory(prefix="nasflow-mutation-") as tmp:
        copy = Path(tmp)
        for name in COPIED:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, copy / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
            else:
                shutil.copy2(src, copy / name)
        baseline, seconds = run_tests(copy, tests, args.timeout)
        if baseline != "survived":
            print(f"mutation: the tests do not pass on the unmutated tree ({baseline}); nothing to measure",
                  file=sys.stderr)
            return 1
        print(f"mutation: {len(chosen)} of {len(everything)} mutants, baseline {seconds:.0f} s", flush=True)
        for i, m in enumerate(chosen, 1):
            target = copy / m.file
            original = target.read_text()
            target.write_text(apply(original, m))
            try:
                m.outcome, m.seconds = run_tests(copy, tests, args.timeout)
            finally:
                target.write_text(original)
            print(f"[{i}/{len(chosen)}] {m.outcome:8} {m.file}:{m.line} {m.kind}: {m.original!r} -> {m.mutated!r}",
                  flush=True)
    tried = [m for m in chosen if m.outcome != "no tests"]
    killed = [m for m in tried if m.outcome in ("killed", "timeout")]
    result = {"benchmark": "mutation", "target": args.target, "tests": tests, "seed": args.seed,
              "mutants_total": len(everything), "tried": len(tried), "killed": len(killed),
              "kill_rate": round(len(killed) / len(tried), 4) if tried else None,
              "baseline_seconds": round(seconds, 1),
              "survivors": [asdict(m) for m in tried if m.outcome == "survived"],
              "mutants": [asdict(m) for m in chosen]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, result)
    print(f"mutation: killed {len(killed)}/{len(tried)} ({result['kill_rate']}); {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
