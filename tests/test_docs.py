"""The documentation site builds with `mkdocs build --strict` (a warning fails it: a broken link,
a page missing from the nav, a generator error), and its generated reference pages cover what the
code has: every `nas` command, every config group, every registered space, strategy and
evaluator, every benchmark result. The README stays short and links only to pages that exist."""

from __future__ import annotations

import html
import importlib.util
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


def _hooks():
    """docs/hooks.py, the mkdocs hooks module (not a package: loaded by path, as mkdocs does)."""
    spec = importlib.util.spec_from_file_location("nasflow_docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    hooks = _hooks()
    results = ROOT / "benchmarks" / "results"
    nav = html.unescape((site / "benchmarks" / "index.html").read_text())
    assert "Search quality" in nav and "Speed and cost" in nav  # the nav's groups
    for result in results.glob("*.json"):
        page = site / "benchmarks" / result.stem / "index.html"
        assert page.is_file(), page
        title = hooks.benchmark_title(result.stem)
        assert re.search(rf"<h1[^>]*>{re.escape(title)}", html.unescape(page.read_text())), (page, title)
        assert title in nav, title
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


def test_benchmarks_are_listed_by_title_in_groups():
    """The nav's benchmarks section listed 38 pages by file name: each result is now under a group,
    once, by a title of words (a result no group names is under OTHER, titled from its script)."""
    hooks = _hooks()
    nav = hooks.benchmark_nav()
    pages = [(group, title, uri) for section in nav for group, items in section.items()
             for item in items for title, uri in item.items()]
    assert sorted(uri for _, _, uri in pages) == sorted(f"benchmarks/{s}.md" for s in hooks.benchmark_stems())
    assert len({group for group, _, _ in pages}) >= 3
    for group, title, uri in pages:
        stem = uri.removeprefix("benchmarks/").removesuffix(".md")
        assert title != stem and "_" not in title and title[0].isupper(), (stem, title)
        assert (group == hooks.OTHER) == all(stem not in titles for titles in hooks.BENCHMARK_GROUPS.values())
    assert len({title for _, title, _ in pages}) == len(pages)


def test_the_python_api_example_runs_and_reads_its_result(tmp_path):
    """Getting started's Python snippet runs as written (from an empty directory) and shows how to read
    what the search found: it prints the best trial that summary.json holds."""
    page = (ROOT / "docs" / "getting-started.md").read_text()
    block = next(b for b in re.findall(r"^```python\n(.*?)^```", page, re.M | re.S) if "SearchLoop" in b)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env |= {"NASFLOW_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    best = json.loads((tmp_path / "runs" / "py" / "summary.json").read_text())["best"]
    assert out.stdout.splitlines() == [
        f"best {best['accuracy']:.2f}% at trial {best['trial']} of 100: {best['encoding']}", "100 evaluated, 0 cached"]


def test_readme_commands_on_checkout_files_say_they_run_from_the_repository_root():
    """A tour command naming a file of the checkout (tests/data/blocks/...) works only from the
    repository root: the paragraph above its block says so."""
    parts = re.split(r"^```.*$", (ROOT / "README.md").read_text(), flags=re.M)  # prose, code, prose, code, ...
    seen = 0
    for prose, code in zip(parts[0::2], parts[1::2]):
        above = [p for p in prose.split("\n\n") if p.strip()][-1]
        for line in code.splitlines():
            words = line.removeprefix("$ ").split()
            if words[:1] == ["nas"] and any("/" in w and (ROOT / w).is_file() for w in words):
                seen += 1
                assert "repository root" in above, (line, above)
    assert seen


def test_the_docs_home_has_a_quick_start():
    """docs/index.md opens with the commands a newcomer runs first (each run or listed by
    tests/test_readme_commands.py, as every command in docs/)."""
    home = (ROOT / "docs" / "index.md").read_text()
    section = home.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S)[0]
    commands = [line.split("  #")[0].strip() for line in block.splitlines()]
    assert commands[0] == "make run" and any(c.startswith("nas search ") for c in commands) and "nas ui" in commands
