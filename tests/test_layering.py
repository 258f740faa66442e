"""The package's layers, read from the code (README, "Architecture"): the CLI and Prefect sit
on top of the library, and nothing below imports them (module level or inside functions,
read with `ast`); the core imports no deep-learning, Prefect or Hydra package (checked by
importing it in a fresh interpreter that refuses those imports and records each attempt)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from fnmatch import fnmatch
from functools import cache
from pathlib import Path

import pytest

NAS = Path(__file__).resolve().parents[1] / "nas"

# The torch-free core: patterns over the modules under nas/.
CORE = ["nas.core", "nas.core.*", "nas.strategies", "nas.strategies.*", "nas.search", "nas.search.*", "nas.errors",
        "nas.io", "nas.spaces", "nas.spaces.*.arch", "nas.spaces.*.space", "nas.spaces.*.cost", "nas.design",
        "nas.design.*"]
HEAVY = ("torch", "torchvision", "lightning", "pytorch_lightning", "timm", "ofa", "prefect", "hydra")

# (imported name, the packages whose modules may import it): the library reaches the top
# layers only through registry module tables (strings), never an import.
OWNERS = [("nas.cli", ("nas.cli",)), ("nas.orchestration", ("nas.orchestration", "nas.cli")),
          ("prefect", ("nas.orchestration",)), ("prefect_dask", ("nas.orchestration",)),
          ("prefect_ray", ("nas.orchestration",))]


def module_name(path: Path) -> str:
    parts = path.relative_to(NAS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(NAS.rglob("*.py"))}


@cache
def imports(name: str) -> frozenset[str]:
    """Every module `name` imports, anywhere in its code (relative imports resolved)."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from nas import cli`
    return frozenset(found)


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_reader_sees_imports_inside_functions():
    """A reader that missed function-level imports would pass every rule below."""
    assert "nas.orchestration.server" in imports("nas.cli.serve")  # imported inside main()
    assert "prefect.runner" in imports("nas.orchestration.serve")  # inside serve()
    assert "nas.config" in imports("nas.cli.search")


@pytest.mark.parametrize("target, owners", OWNERS, ids=[t for t, _ in OWNERS])
def test_only_the_layers_above_import(target, owners):
    wrong = sorted({f"{name} imports {imp}" for name in MODULES if not any(within(name, o) for o in owners)
                    for imp in imports(name) if within(imp, target)})
    assert wrong == [], f"only {' and '.join(owners)} may import {target}: " + "; ".join(wrong)


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
                         timeout=120, cwd=NAS.parent, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout)


def test_core_list_matches_modules():
    core = core_modules()
    assert {"nas.core.registry", "nas.search.loop", "nas.design.nader", "nas.spaces.nb201.arch",
            "nas.spaces.nader.space", "nas.spaces.source.space"} <= set(core)


@pytest.mark.parametrize("name", core_modules())
def test_core_imports_no_heavy_package(core_imports, name):
    result = core_imports[name]
    assert result["heavy"] == [], f"{name} imports {', '.join(result['heavy'])}"
    assert result["error"] is None, f"{name}: {result['error']}"
    assert core_imports["loaded"] == []
