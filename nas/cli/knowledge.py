"""`nas knowledge`: build and query the design-knowledge store.

  nas knowledge ingest [PATH...] [--out DIR] [--prefect]   read papers (PDF, .md/.txt, .jsonl), idea lists (NADER's
                                                 inspirations.json) or NADER experience files; no PATH: the
                                                 built-in corpus
  nas knowledge search "QUERY" [-k N] [--main-category X] [--granularity G] [--target T] [--source S] [--json]
  nas knowledge tree [--build] [--target T] [--json] [--out FILE]
  nas knowledge stats [--json] [--plot FILE.png]

Overrides as for `nas search`: `llm=openai`, `llm=replay llm.replay_from=DIR`,
`knowledge.path=DIR`, `knowledge.tagger=llm`, `knowledge.screen=llm|embed|off`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from flows.prefect_server import prefect_api
from nas.cli.main import check_group_overrides, fail
from nas.config import check_config
from nas.errors import ConfigError, InputError, NasError, OutputPathError
from nas.home import home
from nas.knowledge.config import KnowledgeConfig
from nas.knowledge.ingest import run_ingest
from nas.knowledge.reader import IngestReport
from nas.knowledge.stats import idea_stats, plot_stats, render_stats
from nas.knowledge.tree_build import build_tree
from nas.lazy import LazyImport
from nas.llm import LLMClient, LLMConfig
from nas.status import status
from nas.terminal import printable
from tasks.env import configure_prefect_env

# Prefect: only `ingest --prefect` runs the flow, after configure_prefect_env
knowledge_flows = LazyImport("flows.knowledge")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nas knowledge", description="Design-knowledge store.")
    sub = parser.add_subparsers(dest="command", required=True)
    ingest = sub.add_parser("ingest", help="read papers or idea lists into the store")
    ingest.add_argument("paths", nargs="*", type=Path)
    ingest.add_argument("--out", type=Path, default=None, help="ingest record dir (transcripts, summary.json)")
    ingest.add_argument("--prefect", action="store_true", help="run as the Prefect flow (a task per file)")
    search = sub.add_parser("search", help="ideas nearest to a query")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--main-category", dest="main")
    search.add_argument("--sub-category", dest="sub")
    search.add_argument("--granularity", choices=["operation", "block", "network"])
    search.add_argument("--target", choices=["performance", "efficiency"])
    search.add_argument("--source")
    search.add_argument("--json", action="store_true")
    tree = sub.add_parser("tree", help="show the attribute tree, or rebuild it from reference models")
    tree.add_argument("--build", action="store_true", help="analyse timm reference models with the LLM")
    tree.add_argument("--target", choices=["performance", "efficiency"])
    tree.add_argument("--json", action="store_true")
    tree.add_argument("--out", type=Path, default=None, help="where --build writes the tree JSON")
    stats = sub.add_parser("stats", help="ideas per category")
    stats.add_argument("--json", action="store_true")
    stats.add_argument("--plot", type=Path, default=None, help="bar chart PNG of ideas per main category")
    return parser


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        raise SystemExit(0 if argv else 2)
    overrides = [a for a in argv[1:] if "=" in a and not a.startswith("-")]
    args = _parser().parse_args([argv[0], *[a for a in argv[1:] if a not in overrides]])
    check_group_overrides(overrides)
    try:
        cfg = check_config(overrides)
        settings = {"llm": cfg["llm"], "knowledge": cfg["knowledge"]}
        LLMConfig.from_dict(settings["llm"])  # bad settings fail before any work, whatever the command
        KnowledgeConfig.from_dict(settings["knowledge"])
        {"ingest": _ingest, "search": _search, "tree": _tree, "stats": _stats}[args.command](args, settings)
    except (ConfigError, InputError, OutputPathError) as err:
        fail(str(err))
    except NasError as err:
        print(f"nas: error: {err}", file=sys.stderr)
        raise SystemExit(1) from None


def _ingest(args, settings: dict[str, Any]) -> None:
    if args.prefect:
        configure_prefect_env()  # before flows import Prefect: its home under NASFLOW_HOME

        # PREFECT_API_URL's server, else the shared local one, else (temporary) Prefect's for this process
        with prefect_api(show=True), status("ingesting as a Prefect flow (a task per file)"):  # no bar of its own
            summary = knowledge_flows.ingest_flow(settings, [str(p) for p in args.paths],
                                                  str(args.out) if args.out else None)
        out = Path(summary["record"])
    else:
        tty = sys.stderr.isatty()
        job, summary = run_ingest(settings, args.paths, args.out, progress=tty,
                                  echo=None if tty else lambda line: print(line, file=sys.stderr, flush=True))
        out = job.out
    report = IngestReport(**summary["report"])
    for bad in report.bad_files:
        print(printable(f"skipped {bad['path']}: {bad['reason']}"), file=sys.stderr)
    for failure in report.failures:  # an LLM's or a paper's words may be quoted
        print(printable(f"not read {failure['where']}: {failure['error']}"), file=sys.stderr)
    print(f"papers {report.papers} (cached {report.cached}, accepted {report.accepted}, rejected "
          f"{report.rejected}, failed {report.failed}), idea lists {report.idea_lists}, experiences "
          f"{report.experiences}; ideas {report.ideas}: "
          f"added {report.added}, duplicates {report.duplicates}; store holds {summary['ideas_in_store']} "
          f"ideas; {report.seconds:.1f} s")
    print(f"record: {out}")


def _search(args, settings: dict[str, Any]) -> None:
    if args.k <= 0:
        raise ConfigError(f"-k must be > 0, got {args.k}")
    kcfg = KnowledgeConfig.from_dict(settings["knowledge"])
    if args.main:
        tree = kcfg.load_tree()
        if args.main not in tree.mains():
            raise ConfigError(f"unknown main category '{args.main}' (valid: {', '.join(tree.mains())})")

    with status("searching the idea store (the embedding model loads first)"):  # ~3 s on 2 busy cores
        store = kcfg.open_store()
        hits = store.search(args.query, k=args.k, main=args.main, sub=args.sub, granularity=args.granularity,
                            target=args.target, source=args.source)
    if args.json:
        print(json.dumps([{"score": round(h.score, 4), **h.idea.to_dict()} for h in hits], indent=2))
        return
    if not hits:
        print("no ideas match (is the store empty? run `nas knowledge ingest`)")
    for h in hits:
        tag = h.idea.tag.path() if h.idea.tag else "untagged"
        print(printable(f"{h.score:.3f}  [{tag}]  {h.idea.text}"))  # an LLM's words, from a paper's
        if h.idea.paper_title:
            print(printable(f"       from: {h.idea.paper_title}"))


def _tree(args, settings: dict[str, Any]) -> None:
    kcfg = KnowledgeConfig.from_dict(settings["knowledge"])
    if args.build:
        out = args.out or home() / "knowledge" / "attribute_tree.json"
        client = LLMClient(LLMConfig.from_dict(settings["llm"]), run_dir=out.parent / (out.stem + "-record"))
        tree, report = build_tree(client, progress=sys.stderr.isatty())
        tree.save(out)
        n_main, n_sub = tree.size()
        print(f"analysed {report['models']} reference models ({report['failed']} calls failed): "
              f"{n_main} main categories, {n_sub} sub-categories; wrote {out}")
        print(f"use it with knowledge.tree={out}")
        return
    tree = kcfg.load_tree()
    if args.json:
        print(json.dumps(tree.to_dict(), indent=2))
        return
    for target in [args.target] if args.target else tree.targets:
        print(f"{target}:")
        print("  " + tree.render(target).replace("\n", "\n  "))
    n_main, n_sub = tree.size()
    print(f"{n_main} main categories, {n_sub} sub-categories")


def _stats(args, settings: dict[str, Any]) -> None:
    kcfg = KnowledgeConfig.from_dict(settings["knowledge"])
    store = kcfg.open_store()
    stats = idea_stats(store, kcfg.load_tree())
    stats["experiences"] = kcfg.open_experiences().count()
    if args.plot:
        plot_stats(stats, args.plot)
    if args.json:
        print(json.dumps(stats, indent=2))
    else:
        print(render_stats(stats), end="")
    if args.plot:
        print(f"wrote {args.plot}", file=sys.stderr)
