"""The marker table (MARKERS in tests/conftest.py) classifies every test file, names only
tests that exist and registered markers, and `-m` selects by it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from conftest import MARKERS, ROOT

TESTS = ROOT / "tests"


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [*tree.body, *(n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body)]
    return {n.name for n in nodes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and n.name.startswith("test")}


def test_every_test_file_is_in_the_table():
    missing = sorted({p.name for p in TESTS.glob("test_*.py")} - set(MARKERS))
    assert not missing, f"classify these in MARKERS (tests/conftest.py): {missing}"


def test_the_table_names_existing_files_tests_and_markers(pytestconfig):
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    problems = []
    for key, markers in MARKERS.items():
        file, _, test = key.partition("::")
        if not (TESTS / file).is_file():
            problems.append(f"{key}: no such test file")
        elif test and test not in defined_tests(TESTS / file):
            problems.append(f"{key}: no such test in {file}")
        problems += [f"{key}: marker '{m}' is not registered in pyproject.toml" for m in markers if m not in registered]
    assert not problems


def test_markers_select_whole_files_and_single_tests(tmp_path):
    files = ["test_llm_scripted.py", "test_knowledge_config.py", "test_regression.py"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", "llm or cli", *(f"tests/{f}" for f in files)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "NASFLOW_HOME": str(tmp_path)}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    selected: dict[str, set[str]] = {f: set() for f in files}
    for line in proc.stdout.splitlines():
        if "::" in line:
            file, _, test = line.removeprefix("tests/").partition("::")
            selected[file].add(test.split("[")[0])
    assert selected == {"test_llm_scripted.py": defined_tests(TESTS / "test_llm_scripted.py"),  # the file: llm
                        "test_knowledge_config.py": set(),
                        "test_regression.py": {"test_cli_bad_input_exits_2_with_one_line",  # two tests: cli
                                               "test_cli_smoke_suite_against_committed_and_tampered_baselines"}}
