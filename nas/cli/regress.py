"""`nas regress`: run a regression suite and compare it with its stored baseline.

Exit 0 when nothing regressed, 1 on a regression or a metric the run failed to
produce (one line per metric on stderr; with --update-baseline, a crashed probe:
the baseline is then not written), 2 on bad input (unknown suite, a
missing or malformed baseline: one line naming the file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nas.errors import NasError


def main(argv: list[str]) -> None:
    from nas.cli.main import fail
    from nas.regression.probes import SUITES, run_suite

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
    for row in report["metrics"]:
        mark = {"regressed": "!!", "missing": "!!", "improved": "++", "new": "+ "}.get(row["status"], "  ")
        value = "-" if row["value"] is None else f"{row['value']:.6g}"
        base = "-" if row["baseline"] is None else f"{row['baseline']:.6g}"
        print(f"{mark} {row['metric']:<36} {value:>12} {base:>12}  {row['status']}")
    out = Path(report["out"])
    print(f"wrote {out / 'report.json'}, {out / 'report.md'}, {out / 'ratios.png'}")
    if report["baseline_updated"]:
        print(f"baseline written: {report['baseline']}")
        return
    if report["failures"]:
        for line in report["failures"]:
            print(f"nas regress: {line}", file=sys.stderr)
        print(f"nas regress: suite '{args.suite}' FAILED: {len(report['failures'])} problem(s) "
              f"(report: {out / 'report.md'})", file=sys.stderr)
        raise SystemExit(1)
