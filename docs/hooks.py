"""mkdocs hooks: the reference pages are generated from the code at build time, so they cannot
go stale.

- `<!-- nasflow:cli -->` (docs/reference/cli.md): every `nas` command's `--help`, run from
  the argparse parsers (nas/cli/; `nas search`'s is Hydra's).
- `<!-- nasflow:config -->` (docs/reference/configuration.md): the Hydra config tree in conf/,
  one section per group, each option's YAML with its comments.
- `<!-- nasflow:packages -->` (docs/architecture.md): the package map, each folder's
  docstring and the first-party packages it imports (read with `ast`, as tests/test_layering.py).
- One page per space, strategy and evaluator (docs/{spaces,strategies,evaluators}/<name>.md),
  from the entry points in pyproject.toml, the registered class's docstring and signature and
  its conf files; a hand-written docs/<kind>/<name>.md of the same name wins (its
  `<!-- nasflow:component -->` marker gets the generated part).
- One page per benchmark (docs/benchmarks/<stem>.md) from benchmarks/results/<stem>.json: the
  script's own markdown table when it writes one, the JSON's numbers, and its PNG plots, listed
  in the nav by title under BENCHMARK_GROUPS (a result none names: under OTHER, titled from its
  script's docstring); `<!-- nasflow:plots -->` (docs/benchmarks/index.md): the plots of no result page.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
KINDS = {  # docs folder -> (entry-point group, conf group, title)
    "spaces": ("nasflow.spaces", "space", "Spaces"),
    "strategies": ("nasflow.strategies", "strategy", "Strategies"),
    "evaluators": ("nasflow.evaluators", "evaluator", "Evaluators"),
}
MARK = "<!-- nasflow:{} -->"


# ---------------------------------------------------------------------------------------------
# CLI reference


def _help(argv: list[str], must: bool = True) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env["COLUMNS"] = "100"
    out = subprocess.run([sys.executable, "-m", "nas.cli", *argv, "--help"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    if out.returncode != 0:
        if not must:  # a word of the top help that is not a subcommand
            return ""
        raise RuntimeError(f"nas {' '.join(argv)} --help failed: {out.stderr[-2000:]}")
    return out.stdout.rstrip()


@cache
def cli_reference() -> str:
    from nas.cli.main import COMMANDS  # the dispatch table: one module per command

    commands = list(COMMANDS)
    with ThreadPoolExecutor(4) as pool:
        tops = dict(zip(commands, pool.map(lambda c: _help([c]), commands)))
        subs: dict[str, list[str]] = {}
        for command, text in tops.items():
            words = re.findall(rf"nas {re.escape(command)} \{{?([a-z][\w-]*)", text)
            words += re.findall(r"^  ([a-z][\w-]*)\s{2,}\S", text, re.M)
            words += [w for group in re.findall(r"\{([a-z,]+)\}", text.splitlines()[0] if text else "")
                      for w in group.split(",")]
            subs[command] = list(dict.fromkeys(w for w in words if w != command))
        candidates = [(c, w) for c, ws in subs.items() for w in ws]
        helps = dict(zip(candidates, pool.map(lambda cw: _help(list(cw), must=False), candidates)))
    summary: dict[str, tuple[str, str]] = {}  # `nas --help`: "  nas CMD SYNOPSIS   what it does"
    for line in _help([]).splitlines():
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) == 2 and parts[0].startswith("nas "):
            word = parts[0].split()[1]
            summary.setdefault(word, (parts[0], parts[1]))
    lines = ["| command | what it does |", "| --- | --- |"]
    out: list[str] = []
    for command in commands:
        synopsis, what = summary.get(command, (f"nas {command}", ""))
        lines.append(f"| [`{synopsis}`](#nas-{command}) | {what} |")
        text = tops[command]
        if command == "search":  # Hydra's help: the groups here; the config is the next page
            text = text.split("== Config ==")[0].rstrip()
        out += [f"## nas {command}", "", "```text", text, "```", ""]
        if command == "search":
            out += ["The rest of `nas search --help` is the composed config: see the "
                    "[configuration reference](configuration.md).", ""]
        for (c, word), sub in helps.items():
            if c == command and sub.startswith(f"usage: nas {command} {word}"):
                out += [f"### nas {command} {word}", "", "```text", sub, "```", ""]
    return "\n".join([*lines, "", *out])


# ---------------------------------------------------------------------------------------------
# Configuration reference


def _comment(text: str) -> str:
    """The leading comment block of a YAML file, as one line."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def _yaml_block(path: Path) -> list[str]:
    return [f'```yaml title="conf/{path.relative_to(ROOT / "conf").as_posix()}"', path.read_text().rstrip(), "```"]


@cache
def config_reference() -> str:
    conf = ROOT / "conf"
    groups = sorted(p for p in conf.iterdir() if p.is_dir() and not p.name.startswith("__"))
    out = ["`conf/config.yaml` composes one option of each group; `nas search GROUP=OPTION` picks another "
           "and `nas search GROUP.KEY=VALUE` sets one key (an unknown key is refused in one line).", "",
           "| group | options |", "| --- | --- |"]
    for group in groups:
        options = ", ".join(f"[`{p.stem}`](#{group.name}-{p.stem.replace('_', '-')})"
                            for p in sorted(group.glob("*.yaml")))
        out.append(f"| [`{group.name}`](#group-{group.name.replace('_', '-')}) | {options} |")
    out += ["", "## The root: conf/config.yaml", "", *_yaml_block(conf / "config.yaml"), ""]
    for group in groups:
        out += [f"## Group `{group.name}` {{#group-{group.name.replace('_', '-')}}}", ""]
        for path in sorted(group.glob("*.yaml")):
            anchor = f"{group.name}-{path.stem.replace('_', '-')}"
            out += [f"### `{group.name}={path.stem}` {{#{anchor}}}", ""]
            note = _comment(path.read_text())
            if note:
                out += [note, ""]
            out += [*_yaml_block(path), ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# Package map

PACKAGE_DIRS = ["nas/core", "nas/strategies", "nas/search", "nas/spaces", "nas/design", "nas/evaluators",
                "nas/train", "nas/data", "nas/proxies", "nas/agents", "nas/sandbox", "nas/llm", "nas/knowledge",
                "nas/export", "nas/regression", "supernets", "tasks", "flows", "nas/cli", "conf"]
FIRST_PARTY = ("nas", "supernets", "tasks", "flows", "conf")


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] not in FIRST_PARTY:
        return None
    if parts[0] == "nas" and len(parts) > 1:
        candidate = f"nas/{parts[1]}"
        return candidate if candidate in PACKAGE_DIRS else "nas (modules)"
    return parts[0]


def _imports(folder: Path) -> set[str]:
    found: set[str] = set()
    for path in folder.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("").parts
        package = ".".join(rel[:-1] if rel[-1] == "__init__" else rel[:-1])
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    found.add(".".join([*base, node.module] if node.module else base))
                elif node.module:
                    found.add(node.module)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "LazyImport"
                  and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                found.add(node.args[0].value)  # a declared lazy import (nas/lazy.py) is an import all the same
    return found


@cache
def package_map() -> str:
    rows = ["| folder | what it holds | first-party packages it imports |", "| --- | --- | --- |"]
    for folder in PACKAGE_DIRS:
        path = ROOT / folder
        init = path / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) if init.is_file() else None
        holds = " ".join((doc or "").split("\n\n")[0].split()) or "—"
        mine = folder.replace("/", ".")
        used = sorted({p for m in _imports(path) if (p := _package_of(m)) and p != folder
                       and not m.startswith(mine)})
        rows.append(f"| `{folder}/` | {holds} | {', '.join(f'`{u}`' for u in used) or '—'} |")
    loose = sorted(p.stem for p in (ROOT / "nas").glob("*.py") if p.stem != "__init__")
    rows += ["", f"`nas (modules)` are the loose modules of `nas/`: {', '.join(f'`{m}`' for m in loose)}."]
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# One page per space, strategy and evaluator


@cache
def entry_points() -> dict[str, dict[str, str]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["project"]["entry-points"]


def _registered(tree: ast.Module, name: str) -> ast.ClassDef | None:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for deco in node.decorator_list:
                if (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)
                        and deco.func.attr == "register" and deco.args
                        and isinstance(deco.args[0], ast.Constant) and deco.args[0].value == name):
                    return node
    return None


def _signature(cls: ast.ClassDef) -> list[str]:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = node.args
            params = args.args[1:] + args.kwonlyargs
            defaults = [None] * (len(args.args[1:]) - len(args.defaults)) + list(args.defaults) \
                + list(args.kw_defaults)
            rows = []
            for param, default in zip(params, defaults):
                kind = ast.unparse(param.annotation) if param.annotation else ""
                value = ast.unparse(default) if default is not None else "required"
                rows.append(f"| `{param.arg}` | `{kind}` | `{value}` |".replace("`` ", "— "))
            return rows
    return []


def _conf_files(group: str, name: str) -> list[Path]:
    folder = ROOT / "conf" / group
    files = []
    for path in sorted(folder.glob("*.yaml")):
        text = path.read_text()
        named = re.search(r"^name:\s*([\w-]+)", text, re.M)
        if path.stem == name or (named and named.group(1) == name) or path.stem.startswith(f"{name}_"):
            files.append(path)
    return files


def component_reference(kind: str, name: str) -> str:
    group, conf_group, _ = KINDS[kind]
    module = entry_points()[group][name]
    path = ROOT / Path(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    tree = ast.parse(path.read_text())
    cls = _registered(tree, name)
    out = [f"Registered as `{name}` in the `{group}` entry-point group (pyproject.toml) by "
           f"`{module}` (`{path.relative_to(ROOT)}`)" + (f", class `{cls.name}`." if cls else "."), ""]
    doc = ast.get_docstring(tree)
    if doc:
        out += ["## Module", "", doc, ""]
    if cls:
        if ast.get_docstring(cls):
            out += [f"## `{cls.name}`", "", ast.get_docstring(cls) or "", ""]
        rows = _signature(cls)
        if rows:
            out += ["## Parameters", "", "The constructor's arguments (the conf file sets them; the space, "
                    "seed and similar are given by the search):", "",
                    "| parameter | type | default |", "| --- | --- | --- |", *rows, ""]
    files = _conf_files(conf_group, name)
    if files:
        out += ["## Configuration", ""]
        for conf in files:
            out += [f"`{conf_group}={conf.stem}`:", "", *_yaml_block(conf), ""]
    return "\n".join(out)


def _component_page(kind: str, name: str) -> str:
    own = ROOT / "docs" / kind / f"{name}.md"
    if own.is_file():
        return own.read_text()
    return f"# `{name}`\n\n{MARK.format('component')}\n"


# ---------------------------------------------------------------------------------------------
# Benchmarks


def _flatten(value: object, prefix: str = "", depth: int = 0) -> list[tuple[str, str]]:
    if isinstance(value, dict):
        rows = []
        for key, item in value.items():
            rows += _flatten(item, f"{prefix}.{key}" if prefix else str(key), depth + 1)
        return rows
    if isinstance(value, list):
        if all(isinstance(v, (int, float)) for v in value) and len(value) <= 12:
            return [(prefix, ", ".join(_fmt(v) for v in value))]
        return [(prefix, f"({len(value)} items)")]
    if isinstance(value, str) and len(value) > 160:
        value = value[:157] + "..."
    return [(prefix, _fmt(value))]


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _list_tables(data: object, prefix: str = "", depth: int = 0) -> list[str]:
    """Lists of flat records as tables (at most 40 rows each)."""
    out: list[str] = []
    if depth > 2:
        return out
    if isinstance(data, dict):
        for key, item in data.items():
            out += _list_tables(item, f"{prefix}.{key}" if prefix else key, depth + 1)
    elif isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        columns = list(dict.fromkeys(k for r in data for k, v in r.items()
                                     if not isinstance(v, (dict, list))))[:10]
        if columns:
            out += [f"**{prefix}** ({len(data)} rows{', first 40' if len(data) > 40 else ''})", "",
                    "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
            out += ["| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |" for r in data[:40]]
            out.append("")
    return out


def _best_at_tables(data: object, prefix: str = "", depth: int = 0) -> list[str]:
    """Groups of methods with `best_at` {budget: {mean, std}}: one row per method, one column per budget."""
    out: list[str] = []
    if not isinstance(data, dict) or depth > 3:
        return out
    methods = {k: v["best_at"] for k, v in data.items()
               if isinstance(v, dict) and isinstance(v.get("best_at"), dict) and v["best_at"]}
    if methods:
        budgets = sorted({b for m in methods.values() for b in m}, key=lambda b: float(b))
        out += [f"**{prefix or 'results'}**: best accuracy after n trials, mean ± std", "",
                "| method | " + " | ".join(f"@{b}" for b in budgets) + " |", "|" + " --- |" * (len(budgets) + 1)]
        for name, best in methods.items():
            cells = []
            for b in budgets:
                cell = best.get(b)
                if isinstance(cell, dict) and "mean" in cell:
                    cells.append(f"{cell['mean']:.2f} ± {cell.get('std', 0):.2f}")
                else:
                    cells.append(_fmt(cell) if cell is not None else "")
            out.append(f"| `{name}` | " + " | ".join(cells) + " |")
        out.append("")
    for key, item in data.items():
        out += _best_at_tables(item, f"{prefix}.{key}" if prefix else key, depth + 1)
    return out


BENCHMARK_GROUPS: dict[str, dict[str, str]] = {  # the nav's groups: result stem -> page title
    "Search quality": {
        "search_efficiency": "Random search against REA (NB201 table)",
        "peers": "Strategies against Optuna's samplers (NB201 table)",
        "peers_supernet": "Strategies against Optuna on a supernet",
        "collm_nb201": "CoLLM-NAS against the baselines (NB201 table)",
        "collm_nb201_baselines": "CoLLM-NAS's baselines alone",
        "predictor_nb201": "Screening with a learned predictor",
        "supernet_search": "Two-stage NAS on an OFA supernet",
        "design_quality": "NADER's design-quality ablation",
        "proxies": "Zero-cost proxies against the NB201 table",
        "proxies_shallow": "Zero-cost proxies, one cell per stage",
        "supernet_ranking": "Do supernet scores rank subnets?",
    },
    "Speed and cost": {
        "make_run": "The default job (make run) on a fresh clone",
        "cli_latency": "CLI command latency",
        "import_time": "Import times",
        "orchestration": "What Prefect orchestration costs",
        "cache_rerun": "The task cache and cached re-runs",
        "arch_throughput": "Architecture representations' throughput",
        "train_throughput": "Training throughput on CPU",
        "train_throughput_gpu_h100": "Training throughput on an H100",
        "train_throughput_gpu_h200": "Training throughput on an H200",
        "llm_layer": "The embedded LLM's speed and cache",
        "llm_prompt_cache": "The local LLM server's prompt cache",
        "llm_threads": "The local LLM's threads on shared cores",
        "knowledge": "The knowledge store's cost",
        "supernet_eval": "What one subnet score costs at ImageNet size",
        "kernel_profile": "Where a training step's device time goes",
        "fused_pack": "Small models trained fused",
        "test_costs": "Slow tests before and after a change",
    },
    "Scale-out and deployment": {
        "scale_out": "Batch and asynchronous search on 1-8 workers",
        "cluster_recovery": "A worker killed mid-evaluation (Dask, Ray)",
        "docker_build": "The Docker image, built",
        "trusted_worker_gpu_h200": "The trusted training worker on an H200",
    },
    "Sandbox and tests": {
        "isolation": "Hostile models contained, and what isolation costs",
        "fuzz": "The trusted side's boundary fuzzed",
        "graph_information": "What honest networks carry besides their inputs",
        "op_costs": "Operators timed against the work model",
        "mutation_library": "Mutation testing: the whole library, by package",
        "mutation_library_seed1206": "Mutation testing: the whole library, the seed-1206 sample",
        "mutation_weak_packages": "Mutation testing: a second sample of the six weakest packages",
        "mutation_library_seed52": "Mutation testing: the whole library, the first sample (seed 52)",
        "mutation_core": "Mutation testing: the core",
        "mutation_core_2": "Mutation testing: the core, second pass",
        "mutation_sandbox": "Mutation testing: the sandbox",
        "mutation_sandbox_seed49": "Mutation testing: the sandbox, the seed-49 sample (before issue 49's tests)",
        "mutation_sandbox_fresh": "Mutation testing: the sandbox, a fresh sample",
        "mutation_sandbox_fresh2": "Mutation testing: the sandbox, a second fresh sample",
        "mutation_sandbox_fresh3": "Mutation testing: the sandbox, a third fresh sample",
        "mutation_sandbox_fresh4": "Mutation testing: the sandbox, a fourth fresh sample",
        "mutation_strategies_tasks": "Mutation testing: strategies and tasks",
    },
}
OTHER = "Other results"


def benchmark_stems() -> list[str]:
    return sorted(p.stem for p in RESULTS.glob("*.json"))


def benchmark_title(stem: str) -> str:
    """Its title in BENCHMARK_GROUPS, else its script's docstring's first line up to its ` -> `
    or `:`, else the stem in words."""
    for titles in BENCHMARK_GROUPS.values():
        if stem in titles:
            return titles[stem]
    script = ROOT / "benchmarks" / f"{stem}.py"
    doc = ast.get_docstring(ast.parse(script.read_text())) if script.is_file() else None
    first = re.split(r" -> |:(?:\s|$)", doc.strip().splitlines()[0])[0].rstrip(". ") if doc else ""
    return first or stem.replace("_", " ").capitalize()


def benchmark_nav() -> list[dict[str, list[dict[str, str]]]]:
    """The benchmarks section's groups, each its pages by title, in BENCHMARK_GROUPS' order."""
    stems = benchmark_stems()
    named = {stem for titles in BENCHMARK_GROUPS.values() for stem in titles}
    groups = [(group, [s for s in titles if s in stems]) for group, titles in BENCHMARK_GROUPS.items()]
    groups.append((OTHER, [s for s in stems if s not in named]))
    return [{group: [{benchmark_title(s): f"benchmarks/{s}.md"} for s in members]}
            for group, members in groups if members]


def plots(stem: str) -> list[str]:
    return sorted(p.name for p in RESULTS.glob("*.png") if p.stem == stem or p.stem.startswith(f"{stem}_")
                  and not any(p.stem == s or p.stem.startswith(f"{s}_") for s in benchmark_stems()
                              if s != stem and s.startswith(stem)))


def other_plots() -> str:
    """The PNGs of benchmarks/results that belong to no result's page."""
    placed = {name for stem in benchmark_stems() for name in plots(stem)}
    out = []
    for png in sorted(RESULTS.glob("*.png")):
        if png.name not in placed:
            out += [f"`{png.name}`", "", f"![{png.name}](img/{png.name})", ""]
    return "\n".join(out)


def benchmark_page(stem: str) -> str:
    try:
        data = json.loads((RESULTS / f"{stem}.json").read_text())
    except ValueError as err:  # a benchmark rewriting it right now: say so, do not fail the build
        return f"# {stem}\n\n`benchmarks/results/{stem}.json` could not be read when the docs were built: {err}.\n"
    out = [f"# {benchmark_title(stem)}", "",
           f"Generated from `benchmarks/results/{stem}.json` when the docs were built"
           + (f"; written by `benchmarks/{stem}.py`." if (ROOT / "benchmarks" / f"{stem}.py").is_file() else "."),
           ""]
    for name in plots(stem):
        out += [f"![{name}](img/{name})", ""]
    table = RESULTS / f"{stem}.md"
    if table.is_file():
        text = table.read_text()
        text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.M)  # below the page title
        text = re.sub(r"!\[([^\]]*)\]\(([^)/]+\.png)\)", r"![\1](img/\2)", text)
        out += ["## The script's report", "", text.strip(), ""]
    tables = _best_at_tables(data) + _list_tables(data)
    if tables:
        out += ["## Records", "", *tables]
    rows = _flatten({k: v for k, v in data.items()} if isinstance(data, dict) else {"rows": data})
    out += ["## Every number", "", '??? note "All scalar fields of the JSON"', "",
            "    | field | value |", "    | --- | --- |", *[f"    | `{k}` | {v} |" for k, v in rows], ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# mkdocs events


def on_config(config, **kwargs):
    """Fill the nav's generated sections: the component pages and the benchmark pages."""
    nav = config["nav"]

    def expand(items):
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                continue
            (title, value), = item.items()
            if isinstance(value, list):
                expand(value)
            elif isinstance(value, str) and value.endswith("/index.md"):
                kind = value.split("/")[0]
                if kind in KINDS:
                    names = sorted(entry_points()[KINDS[kind][0]])
                    items[i] = {title: [value, *[{n: f"{kind}/{n}.md"} for n in names]]}
                elif kind == "benchmarks":
                    items[i] = {title: [value, *benchmark_nav()]}

    expand(nav)
    return config


def on_files(files: Files, config, **kwargs):
    for kind, (group, _, _) in KINDS.items():
        for name in sorted(entry_points()[group]):
            uri = f"{kind}/{name}.md"
            if files.get_file_from_path(uri) is None:
                files.append(File.generated(config, uri, content=_component_page(kind, name)))
    for stem in benchmark_stems():
        files.append(File.generated(config, f"benchmarks/{stem}.md", content=benchmark_page(stem)))
    for png in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"benchmarks/img/{png.name}", abs_src_path=str(png)))
    return files


def on_page_markdown(markdown: str, page, config, files, **kwargs):
    if MARK.format("cli") in markdown:
        markdown = markdown.replace(MARK.format("cli"), cli_reference())
    if MARK.format("config") in markdown:
        markdown = markdown.replace(MARK.format("config"), config_reference())
    if MARK.format("packages") in markdown:
        markdown = markdown.replace(MARK.format("packages"), package_map())
    if MARK.format("plots") in markdown:
        markdown = markdown.replace(MARK.format("plots"), other_plots())
    if MARK.format("component") in markdown:
        kind, name = page.file.src_uri.removesuffix(".md").split("/")
        markdown = markdown.replace(MARK.format("component"), component_reference(kind, name))
    return markdown
