"""The documentation site builds with `mkdocs build --strict` (a warning fails it: a broken link,
a page missing from the nav, a generator error), and its generated reference pages cover what the
code has: every `nas` command, every config group, every registered space, strategy and
evaluator, every benchmark result. The README stays short and links only to pages that exist."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT

SITE_GROUPS = {"spaces": "nasflow.spaces", "strategies": "nasflow.strategies", "evaluators": "nasflow.evaluators"}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env["NO_MKDOCS_2_WARNING"] = "1"  # mkdocs-material's banner about its successor
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    warnings = [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert done.returncode == 0 and not warnings, done.stderr[-5000:]
    return out


def _text(page: Path) -> str:
    return re.sub(r"<[^>]+>", "", page.read_text())


def test_cli_reference_has_every_command_and_subcommand(site):
    from nas.cli.main import COMMANDS

    html = (site / "reference" / "cli" / "index.html").read_text()
    for command in COMMANDS:
        assert f'id="nas-{command}"' in html, command
    for sub in ("arch-validate", "arch-show", "arch-draw", "knowledge-ingest", "knowledge-search"):
        assert f'id="nas-{sub}"' in html, sub
    assert "usage: nas compare" in _text(site / "reference" / "cli" / "index.html")


def test_configuration_reference_has_every_group_and_option(site):
    text = (site / "reference" / "configuration" / "index.html").read_text()
    for group in (p for p in (ROOT / "conf").iterdir() if p.is_dir() and not p.name.startswith("__")):
        for option in group.glob("*.yaml"):
            assert f"conf/{group.name}/{option.name}" in text, option


def test_one_page_per_registered_space_strategy_and_evaluator(site):
    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    for folder, group in SITE_GROUPS.items():
        for name, module in entry_points[group].items():
            page = site / folder / name / "index.html"
            assert page.is_file(), page
            assert module in page.read_text(), (page, module)


def test_benchmark_pages_and_plots_come_from_the_results(site):
    results = ROOT / "benchmarks" / "results"
    for result in results.glob("*.json"):
        page = site / "benchmarks" / result.stem / "index.html"
        assert page.is_file(), page
        json.loads(result.read_text())  # a page says when a JSON could not be read; here it must
    for png in results.glob("*.png"):
        assert (site / "benchmarks" / "img" / png.name).is_file(), png
    peers = _text(site / "benchmarks" / "peers" / "index.html")
    assert "@100" in peers and "optuna_tpe" in peers


def test_package_map_lists_the_layers(site):
    text = _text(site / "architecture" / "index.html")
    for folder in ("nas/core/", "supernets/", "tasks/", "flows/", "nas/cli/", "conf/"):
        assert folder in text, folder


def test_readme_is_short_and_links_to_pages_that_exist():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links
    for link in links:
        assert (ROOT / link).is_file(), link
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").rglob("*.md"):
        assert page.relative_to(ROOT / "docs").as_posix() in nav or page.parent.name in SITE_GROUPS, page
