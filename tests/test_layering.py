"""The project's layers, read from the code (docs, "Architecture"): `nas.core` <- `nas` <-
`supernets` <- `tasks` <- `flows` <- `nas.cli`. No module imports a layer above its own
(module level or inside functions, read with `ast`) or names one in a string (the registries
reach upward through entry points, declared in pyproject.toml); only tasks and flows import
Prefect; the core imports no deep-learning, Prefect or Hydra package (checked by importing it
in a fresh interpreter that refuses those imports and records each attempt); no two modules of
nas/ import each other, even through a chain or an import inside a function, and no two of its
packages either; the imports inside functions are counted, and their number may only fall."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nas", "supernets", "tasks", "flows")

# The torch-free core: patterns over the modules under nas/.
CORE = ["nas.core", "nas.core.*", "nas.strategies", "nas.strategies.*", "nas.search", "nas.search.*", "nas.errors",
        "nas.io", "nas.spaces", "nas.spaces.*.arch", "nas.spaces.*.space", "nas.spaces.*.cost", "nas.design",
        "nas.design.*", "nas.agents.*.strategy", "nas.agents.nader.modtree", "nas.lazy"]
HEAVY = ("torch", "torchvision", "lightning", "pytorch_lightning", "timm", "ofa", "prefect", "hydra")
PREFECT = ("prefect", "prefect_dask", "prefect_ray")
# the core's floor: one-line errors, atomic writes, scrubbing, escaping, declared lazy imports
GROUND = ("nas.errors", "nas.io", "nas.secrets", "nas.terminal", "nas.lazy")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def layer(name: str) -> int:
    """0 the core ... 5 the CLI; -1 for a module that is not ours."""
    if within(name, "nas.cli"):
        return 5
    for rank, package in ((4, "flows"), (3, "tasks"), (2, "supernets"), (1, "nas")):
        if within(name, package):
            return 0 if any(within(name, g) for g in ("nas.core", *GROUND)) else rank
    return -1


@dataclass(frozen=True)
class Imported:
    """One module an import statement names: `module`, the `names` taken from it (() for `import
    module`), and whether the statement sits under `if TYPE_CHECKING:` (for annotations; never runs).
    A declared lazy import, `x = LazyImport("module")` (nas/lazy.py), counts as `import module`: it
    runs on first use, so it couples the two modules as an import inside a function does."""

    module: str
    names: tuple[str, ...]
    typing_only: bool


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _lazy_import(node: ast.AST) -> str:
    """The module of a `LazyImport("module")` call, else ""."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "LazyImport"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    return ""


@cache
def import_statements(name: str) -> tuple[Imported, ...]:
    """Every import in `name`, anywhere in its code (functions too; relative imports resolved)."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found: list[Imported] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Imported(alias.name, (), typing_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append(Imported(base, tuple(alias.name for alias in node.names), typing_only))
        elif _lazy_import(node):
            found.append(Imported(_lazy_import(node), (), typing_only))
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                visit(stmt, True)
            for stmt in node.orelse:
                visit(stmt, typing_only)
        else:
            for child in ast.iter_child_nodes(node):
                visit(child, typing_only)

    visit(tree, False)
    return tuple(found)


@cache
def imports(name: str) -> frozenset[str]:
    """Every module `name` imports, anywhere in its code (relative imports resolved)."""
    found = set()
    for imp in import_statements(name):
        found.add(imp.module)
        found.update(f"{imp.module}.{n}" for n in imp.names)  # `from nas import cli`
    return frozenset(found)


# A dotted name of one of our upper layers inside a string: an import hidden from `imports`.
DOTTED = re.compile(r"^(nas\.cli|flows|tasks|supernets)(\.[a-z_0-9]+)+(:[A-Za-z_]\w*)?$")


@cache
def named_in_strings(name: str) -> frozenset[str]:
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    return frozenset(node.value.partition(":")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.match(node.value))


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_every_package_is_read():
    assert {"nas.core.registry", "nas.cli.main", "supernets.train", "tasks.evaluate", "flows.search",
            "nas.sandbox.graph"} <= set(MODULES)
    assert {layer(n) for n in MODULES} == {0, 1, 2, 3, 4, 5}


def test_the_reader_sees_imports_inside_functions():
    """A reader that missed function-level imports would pass every rule below."""
    assert "prefect_dask" in imports("flows.task_runners")  # imported inside build_task_runner()
    assert "nas.measure" in imports("nas.sandbox.verify")  # inside functions
    assert "flows.deployments" in imports("nas.cli.serve")  # a declared LazyImport
    assert "nas.config" in imports("nas.cli.search")  # at the top


def test_the_string_reader_sees_dotted_names():
    assert DOTTED.match("flows.search:search_flow") and DOTTED.match("supernets.evaluator")
    assert not DOTTED.match("flows") and not DOTTED.match("tasks are cached") and not DOTTED.match("nas.core.space")


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_reaches_a_layer_above(name):
    rank = layer(name)
    wrong = sorted(imp for imp in imports(name) | named_in_strings(name) if layer(imp) > rank)
    assert wrong == [], f"{name} (layer {rank}) reaches up to: {', '.join(wrong)}"


def test_only_tasks_and_flows_import_prefect():
    wrong = sorted(f"{name} imports {imp}" for name in MODULES if layer(name) not in (3, 4)
                   for imp in imports(name) if any(within(imp, p) for p in PREFECT))
    assert wrong == [], "; ".join(wrong)


def test_top_level_names_are_this_project():
    """`flows`, `tasks`, `supernets` and `conf` are the design card's top-level names: in this
    project's environment they must resolve to its folders, not to another installed package."""
    code = "import conf, flows, supernets, tasks; print('\\n'.join(m.__file__ for m in (conf, flows, supernets, tasks)))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/",
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    found = [Path(line).parent for line in run.stdout.split()]
    assert found == [ROOT / "conf", ROOT / "flows", ROOT / "supernets", ROOT / "tasks"]


def core_modules() -> list[str]:
    return sorted(name for name in MODULES if any(fnmatch(name, pattern) for pattern in CORE))


# Imports every module given, in order, refusing HEAVY packages and recording who asked:
# a refused import cannot load what later modules would then seem not to need.
PROBE = """
import importlib, json, sys
HEAVY = set(sys.argv[1].split(","))
attempts = {}
current = [None]

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HEAVY:
            attempts.setdefault(current[0], []).append(name)
            raise ModuleNotFoundError(f"refused: {name}")
        return None

sys.meta_path.insert(0, Refuse())
out = {}
for name in sys.argv[2:]:
    current[0] = name
    try:
        importlib.import_module(name)
        error = None
    except ModuleNotFoundError as err:
        error = str(err)
    out[name] = {"heavy": sorted(set(attempts.get(name, []))), "error": error}
out["loaded"] = sorted({m.split(".")[0] for m in sys.modules} & HEAVY)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def core_imports() -> dict:
    run = subprocess.run([sys.executable, "-c", PROBE, ",".join(HEAVY), *core_modules()], capture_output=True, text=True,
                         timeout=120, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


def test_core_list_matches_modules():
    core = core_modules()
    assert {"nas.core.registry", "nas.search.loop", "nas.agents.nader.strategy", "nas.spaces.nb201.arch",
            "nas.spaces.nader.space", "nas.spaces.source.space"} <= set(core)


@pytest.mark.parametrize("name", core_modules())
def test_core_imports_no_heavy_package(core_imports, name):
    result = core_imports[name]
    assert result["heavy"] == [], f"{name} imports {', '.join(result['heavy'])}"
    assert result["error"] is None, f"{name}: {result['error']}"
    assert core_imports["loaded"] == []


def test_strategies_and_the_search_loop_import_no_cycle():
    """The search loop imports strategies; a strategy imports nothing of `nas.search` (the trial
    types both use are in `nas.core.trial`), so the two packages form no cycle."""
    wrong = sorted(f"{name} imports {imp}" for name in MODULES if within(name, "nas.strategies")
                   for imp in imports(name) if within(imp, "nas.search"))
    assert wrong == [], "; ".join(wrong)


def runtime_imports(name: str) -> set[str]:
    """Our modules that `name`'s imports load when they run, top-level or inside functions: `from p
    import m` of a submodule counts as p.m, like `import p.m` (the package p runs first in both, as
    for every submodule, and counts in neither); imports under `if TYPE_CHECKING:` never run."""
    found = set()
    for imp in import_statements(name):
        if imp.typing_only:
            continue
        submodules = {f"{imp.module}.{n}" for n in imp.names} & MODULES.keys()
        found |= submodules
        if imp.module in MODULES and len(submodules) < max(1, len(imp.names)):
            found.add(imp.module)
    return found - {name}


def cycles(graph: dict[str, list[str]]) -> dict[frozenset[str], list[str]]:
    """Each group of nodes of `graph` (node -> the nodes it imports) that reach one another (a strongly
    connected component of more than one node), with one cycle through it: a -> b -> ... -> a."""
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), list(graph[start])
        while todo:
            if (n := todo.pop()) not in seen:
                seen.add(n)
                todo.extend(graph[n])
        reach[start] = seen
    found: dict[frozenset[str], list[str]] = {}
    done: set[str] = set()
    for start in graph:
        group = {n for n in reach[start] if start in reach[n]} | {start}
        if len(group) < 2 or start in done:
            continue
        done |= group
        path, parent, todo = [start], {}, [start]  # the shortest way back to `start`, within the group
        while start not in parent:
            n = todo.pop(0)
            for m in graph[n]:
                if m in group and m not in parent:
                    parent[m] = n
                    todo.append(m)
        n = parent[start]
        while n != start:
            path.insert(1, n)
            n = parent[n]
        found[frozenset(group)] = [*path, start]
    return found


def import_cycles(names: set[str]) -> dict[frozenset[str], list[str]]:
    """Each group of modules among `names` that reach one another through imports, with one cycle."""
    return cycles({n: sorted(runtime_imports(n) & names) for n in sorted(names)})


def package_of(name: str) -> str:
    """The unit of `name` for the package rule: its package right under the top one (`nas.sandbox`
    for nas.sandbox.graph), or, for a module right under it (nas/measure.py), the module itself."""
    parts = name.split(".")
    unit = ".".join(parts[:2])
    return unit if len(parts) > 2 or (unit in MODULES and MODULES[unit].name == "__init__.py") else name


def package_imports(names: set[str]) -> dict[str, dict[str, tuple[str, str]]]:
    """package -> {package it imports: (one module, the module of the other package it imports)}."""
    graph: dict[str, dict[str, tuple[str, str]]] = {}
    for name in sorted(names):
        edges = graph.setdefault(package_of(name), {})
        for imp in sorted(runtime_imports(name) & names):
            if package_of(imp) != package_of(name):
                edges.setdefault(package_of(imp), (name, imp))
    return graph


def package_cycles(names: set[str]) -> dict[frozenset[str], list[str]]:
    """Each group of packages among `names`' that import one another, module level or inside functions
    (or through a declared LazyImport), with one cycle, each step named by a module import that makes it:
    `nas.a (nas.a.x -> nas.b.y) -> nas.b ...`."""
    graph = package_imports(names)
    found = cycles({p: sorted(edges) for p, edges in graph.items()})
    return {group: [f"{a} ({' -> '.join(graph[a][b])})" for a, b in zip(path, path[1:])] + [path[-1]]
            for group, path in found.items()}


# Cycles being undone by someone else right now; each entry goes when its change lands.
ALLOWED_CYCLES: set[frozenset[str]] = set()
# Package cycles too big to break in one change: each entry names its packages, says why it is
# here, and goes when the cycle is broken.
ALLOWED_PACKAGE_CYCLES: set[frozenset[str]] = set()


def write_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    """Modules for a reader test, named as given (`probe.a` and `probe.a.x`: a package and its module)."""
    import_statements.cache_clear()  # the readers cache by name: another test's probe.a is not this one
    imports.cache_clear()
    packages = {n.rpartition(".")[0] for n in files} | {n for n in files if any(m.startswith(n + ".") for m in files)}
    for name in sorted({*files, *packages} - {""}):
        is_package = name in packages
        path = tmp_path.joinpath(*name.split("."), "__init__.py") if is_package else \
            tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files.get(name, ""))
        monkeypatch.setitem(MODULES, name, path)


def test_the_cycle_finder_sees_function_level_imports(tmp_path, monkeypatch):
    """A cycle closed by an import inside a function is a cycle; an annotation-only import is not."""
    files = {"probe.a": "from probe import c\n\n\ndef f():\n    from probe.b import g  # lazy: reason\n",
             "probe.b": "from probe import a\n",
             "probe.c": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from probe.a import f\n"}
    write_probe(tmp_path, monkeypatch, files)
    assert runtime_imports("probe.c") == set()
    assert import_cycles(set(files)) == {frozenset({"probe.a", "probe.b"}): ["probe.a", "probe.b", "probe.a"]}


def test_the_cycle_finder_sees_declared_lazy_imports(tmp_path, monkeypatch):
    files = {"probe.a": "from nas.lazy import LazyImport\n\nb = LazyImport('probe.b')\n",
             "probe.b": "from probe import a\n"}
    write_probe(tmp_path, monkeypatch, files)
    assert runtime_imports("probe.a") == {"probe.b", "nas.lazy"}
    assert import_cycles(set(files)) == {frozenset({"probe.a", "probe.b"}): ["probe.a", "probe.b", "probe.a"]}


def test_the_package_cycle_finder_sees_cycles_between_packages(tmp_path, monkeypatch):
    """No two modules import each other, but their packages do: x (in a) -> y (in b) -> z (in a), the
    last step inside a function; a module right under the top package is a unit of its own."""
    files = {"probe.a.x": "from probe.b import y\n",
             "probe.a.z": "X = 1\n",
             "probe.b.y": "def f():\n    from probe.a.z import X\n",
             "probe.top": "from probe.a import x\n",
             "probe.b.w": "import probe.top\n"}
    write_probe(tmp_path, monkeypatch, files)
    names = {n for n in MODULES if n.startswith("probe.")}
    assert import_cycles(names) == {}
    assert package_of("probe.a.x") == package_of("probe.a") == "probe.a" and package_of("probe.top") == "probe.top"
    # one group (b.w -> top -> a.x closes a second cycle through b), shown by its shortest cycle
    assert package_cycles(names) == {frozenset({"probe.a", "probe.b", "probe.top"}): [
        "probe.a (probe.a.x -> probe.b.y)", "probe.b (probe.b.y -> probe.a.z)", "probe.a"]}


def test_no_import_cycle_among_nas_modules():
    """A cycle hidden in a function-level import still couples both modules: each must import
    without the other (move what both need below them, or split a module by what it holds)."""
    cycles = [path for group, path in import_cycles({n for n in MODULES if within(n, "nas")}).items()
              if group not in ALLOWED_CYCLES]
    assert cycles == [], "import cycles among nas/ modules (each: a -> b -> ... -> a):\n" + "\n".join(
        " -> ".join(path) for path in cycles)


def test_no_import_cycle_among_nas_packages():
    """The packages of nas/ (nas.sandbox, nas.train, ...; a module right under nas/ on its own) form
    layers too: a package that imports another, even inside a function, is not imported by it."""
    cycles = [path for group, path in package_cycles({n for n in MODULES if within(n, "nas")}).items()
              if group not in ALLOWED_PACKAGE_CYCLES]
    assert cycles == [], "import cycles among nas/ packages (each: a (module -> module) -> b ... -> a):\n" + \
        "\n".join(" -> ".join(path) for path in cycles)


def package_levels(names: set[str]) -> list[list[str]]:
    """`names`' packages (and loose modules) in levels, lowest first: each imports (module level or
    inside functions) only from the levels below its own, as low as that lets it sit."""
    graph = {p: set(edges) - {p} for p, edges in package_imports(names).items()}
    levels: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(graph):
        level = sorted(p for p in graph.keys() - placed if graph[p] <= placed)
        assert level, f"no package order: a cycle among {sorted(graph.keys() - placed)}"
        levels.append(level)
        placed |= set(level)
    return levels


ORDER_DOC = ROOT / "docs" / "architecture.md"
ORDER_BEGIN = "<!-- package-order: written by `python tests/test_layering.py --order`; do not edit -->"
ORDER_END = "<!-- /package-order -->"


def package_order_picture() -> str:
    """The package order as docs/architecture.md draws it: the top level first, an arrow down for "imports
    from the levels below"."""
    rows = []
    for rank, level in reversed(list(enumerate(package_levels({n for n in MODULES if within(n, "nas")})))):
        rows += [f"{rank:>3}  {'   '.join(level)}", "      |"]
    return "\n".join(["```text", *rows[:-1], "```"])


def write_package_order() -> None:
    text = ORDER_DOC.read_text()
    head, _, rest = text.partition(ORDER_BEGIN)
    _, _, tail = rest.partition(ORDER_END)
    ORDER_DOC.write_text(f"{head}{ORDER_BEGIN}\n{package_order_picture()}\n{ORDER_END}{tail}")


def test_the_package_order_picture_is_the_code_s():
    """docs/architecture.md's picture of the package order inside nas/ is regenerated from the imports."""
    text = ORDER_DOC.read_text()
    assert ORDER_BEGIN in text and ORDER_END in text, f"{ORDER_DOC} lost its package-order markers"
    drawn = text.partition(ORDER_BEGIN)[2].partition(ORDER_END)[0].strip()
    assert drawn == package_order_picture(), (
        "the package order changed: python tests/test_layering.py --order redraws docs/architecture.md's picture")


def test_the_package_levels_put_each_import_below(tmp_path, monkeypatch):
    files = {"probe.top.x": "from probe.mid.y import Y\nimport probe.low.z\n", "probe.mid.y": "def f():\n"
             "    import probe.low.z\n", "probe.low.z": "", "probe.low.w": "", "probe.side": "import probe.low.w\n"}
    write_probe(tmp_path, monkeypatch, files)
    assert package_levels(set(files)) == [["probe.low"], ["probe.mid", "probe.side"], ["probe.top"]]


def function_level_imports(name: str) -> list[tuple[int, str]]:
    """(line, source) of every import statement inside a function of `name` (methods and nested
    functions too), commented or not; those under `if TYPE_CHECKING:` never run and are not counted.
    An import belongs at the top of its module; one that must wait (start-up time, torch-free
    modules) is a declared `LazyImport` at the top (nas/lazy.py), not a statement in a function."""
    text = MODULES[name].read_text()
    lines = text.splitlines()
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit_one(stmt, in_function)
                continue
            visit_one(child, in_function)

    def visit_one(child: ast.AST, in_function: bool) -> None:
        if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append((child.lineno, lines[child.lineno - 1].strip()))
        visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(text, str(MODULES[name])), False)
    return found


# The imports inside functions of nas/, flows/, tasks/ and supernets/ (`python tests/test_layering.py`
# lists them by module): a ratchet, lowered as they go (277 before issue 51); it never rises.
FUNCTION_IMPORTS_MAX = 98


def test_the_import_counter_sees_imports_inside_functions(tmp_path, monkeypatch):
    module = tmp_path / "probe.py"
    module.write_text("import os\nfrom typing import TYPE_CHECKING\n\n\ndef f():\n    import json  # lazy: a reason\n\n\n"
                      "class C:\n    import sys\n\n    def m(self):\n        def inner():\n"
                      "            from os import path\n        if TYPE_CHECKING:\n            import typing\n"
                      "        return inner\n")
    monkeypatch.setitem(MODULES, "probe", module)
    # a reason comment does not exempt it; a class body is not a function; nested functions count
    assert function_level_imports("probe") == [(6, "import json  # lazy: a reason"), (14, "from os import path")]
    assert not function_level_imports("nas.core.trial")


def function_import_counts() -> Counter[str]:
    return Counter({name: n for name in MODULES if (n := len(function_level_imports(name)))})


def test_function_level_imports_do_not_grow():
    counts = function_import_counts()
    total = sum(counts.values())
    most = ", ".join(f"{MODULES[name].relative_to(ROOT)} {n}" for name, n in counts.most_common(8))
    assert total <= FUNCTION_IMPORTS_MAX, (
        f"{total} imports inside functions, more than FUNCTION_IMPORTS_MAX = {FUNCTION_IMPORTS_MAX}: move the new ones "
        "to the top of their module (or, for a torch-free or start-up-time module, declare one LazyImport at the "
        f"top: nas/lazy.py). Most: {most} (all: python tests/test_layering.py)")
    if total < FUNCTION_IMPORTS_MAX:
        print(f"{total} imports inside functions: FUNCTION_IMPORTS_MAX ({FUNCTION_IMPORTS_MAX}) can go down to {total}")


if __name__ == "__main__" and sys.argv[1:] == ["--order"]:  # redraw docs/architecture.md's package order
    write_package_order()
    print(package_order_picture())
elif __name__ == "__main__":  # the count: python tests/test_layering.py
    counts = function_import_counts()
    for name, count in counts.most_common():
        print(f"{count:4d} {name}")
    print(f"{sum(counts.values())} imports inside functions (FUNCTION_IMPORTS_MAX = {FUNCTION_IMPORTS_MAX})")


def test_evaluators_list_their_spaces_without_torch():
    """Which spaces each evaluator scores (error messages, `nas search` checks) is read from the
    evaluators' classes and the supernets' entry points: no torch, seconds at start-up."""
    code = ("import json, sys\nfrom nas.evaluators import EVALUATORS\n"
            "spaces = {n: EVALUATORS.get(n).spaces() for n in EVALUATORS.names()}\n"
            "print(json.dumps({'spaces': spaces, 'torch': 'torch' in sys.modules}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    assert out["torch"] is False
    assert {"supernet", "table", "train"} <= set(out["spaces"])
    assert "nb201" in out["spaces"]["supernet"] and "nb201" in out["spaces"]["table"]


def test_importing_flows_and_tasks_changes_no_setting():
    """Prefect's environment is set by an explicit call (`tasks.env.configure_prefect_env`) from the
    entry points that run flows, not as a side effect of an import."""
    code = ("import json, os, sys\nbefore = dict(os.environ)\nfactory = __import__('logging').getLogRecordFactory()\n"
            "import flows, flows.search, flows.deployments, tasks, tasks.evaluate, tasks.llm\n"
            "changed = sorted(k for k in {*before, *os.environ} if before.get(k) != os.environ.get(k))\n"
            "print(json.dumps({'changed': changed, 'factory': factory is __import__('logging').getLogRecordFactory()}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "NASFLOW_"))}
    env["NASFLOW_HOME"] = os.environ["NASFLOW_HOME"]
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         check=False, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out == {"changed": [], "factory": True}
