"""`nas regress`: run a regression suite and compare it with its stored baseline.

Prints a header, a verdict per metric and a last line PASS (exit 0) or FAIL (exit 1).
Exit 0 when nothing regressed, 1 on a regression or a metric the run failed to
produce (one line per metric on stderr; with --update-baseline, a crashed probe:
the baseline is then not written), 2 on bad input (unknown suite, a
missing or malformed baseline: one line naming the file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nas.cli.main import fail
from nas.errors import NasError
from nas.regression.probes import SUITES, run_suite


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="nas regress", description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="nightly", help=f"suite to run ({', '.join(SUITES)}; default nightly)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="baseline JSON (default: the shipped nas/regression/baselines/<suite>.json)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report directory (default runs/regression/<time>)")
    parser.add_argument("--update-baseline", action="store_true",
                        help="write the baseline from this run (keeps tolerances already in it)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("overrides", nargs="*",
                        help="config overrides for the LLM and design probes, e.g. llm=openai")
    args = parser.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        fail(f"not a config override (KEY=VALUE): {bad[0]}")
    try:
        report = run_suite(args.suite, args.baseline, args.out, overrides=args.overrides,
                           update=args.update_baseline, progress=not args.no_progress)
    except NasError as err:
        fail(str(err))
    out, problems, code = verdict_lines(report)
    print("\n".join(out))
    if code:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(code)


VERDICTS = {"regressed": "REGRESSED", "missing": "MISSING", "improved": "improved", "new": "new",
            "ok": "ok", "info": "info (no tolerance)", "skipped": "skipped"}


def verdict_lines(report: dict[str, Any]) -> tuple[list[str], list[str], int]:
    """The table (a header, one verdict per metric), the files, then PASS or FAIL with the exit
    code it goes with; the problems, one line each, for stderr."""
    out = [f"   {'metric':<36} {'value':>12} {'baseline':>12}  verdict"]
    for row in report["metrics"]:
        mark = {"regressed": "!!", "missing": "!!", "improved": "++", "new": "+ "}.get(row["status"], "  ")
        value = "-" if row["value"] is None else f"{row['value']:.6g}"
        base = "-" if row["baseline"] is None else f"{row['baseline']:.6g}"
        out.append(f"{mark} {row['metric']:<36} {value:>12} {base:>12}  {VERDICTS.get(row['status'], row['status'])}")
    folder = Path(report["out"])
    out.append(f"wrote {folder / 'report.json'}, {folder / 'report.md'}, {folder / 'ratios.png'}")
    counts = ", ".join(f"{n} {status}" for status, n in report["counts"].items())
    failures = report["failures"]
    if report["baseline_updated"]:
        out.append(f"PASS: suite '{report['suite']}': baseline written: {report['baseline']} ({counts})")
        return out, [], 0
    if not failures:
        out.append(f"PASS: suite '{report['suite']}': nothing regressed ({counts})")
        return out, [], 0
    out.append(f"FAIL: suite '{report['suite']}': {len(failures)} problem(s) ({counts}; exit 1)")
    err = [f"nas regress: {line}" for line in failures]
    err.append(f"nas regress: suite '{report['suite']}' FAILED: {len(failures)} problem(s) "
               f"(report: {folder / 'report.md'})")
    return out, err, 1
