"""`nas compare DIR... [--baseline S]`: aggregate search runs into a statistics report
(mean ± std, curves, paired tests, Pareto fronts; nas/compare.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nas.cli.main import fail
from nas.compare import BANDS, compare, render_report
from nas.errors import NasError


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="nas compare", description="Aggregate search runs into a statistics report.")
    parser.add_argument("dirs", nargs="+", type=Path, help="run or multirun directories")
    parser.add_argument("--at", nargs="+", type=int, default=None,
                        help="trial counts to report (default: quartiles of the shortest run's length)")
    parser.add_argument("--baseline", default=None,
                        help="group label or strategy name to test every other group against (paired by seed)")
    parser.add_argument("--band", choices=BANDS, default="std",
                        help="curve band: mean ± 1 std, or median and interquartile range (default: std)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: the first DIR)")
    parser.add_argument("--allow-mixed", action="store_true",
                        help="compare runs that differ in dataset, space, evaluator, budget or constraint "
                             "(one group per setting) instead of refusing")
    args = parser.parse_args(argv)
    out = args.out or args.dirs[0]
    try:
        report = compare(args.dirs, out, args.at, baseline=args.baseline, band=args.band,
                         allow_mixed=args.allow_mixed)
    except NasError as err:
        fail(str(err))
    for warning in report["warnings"]:
        print(f"nas: warning: compare: {warning}", file=sys.stderr)
    print(render_report(report), end="")
    written = ["compare.json", "compare.md", *(f for f in report["figures"].values() if f)]
    print("wrote " + ", ".join(str(out / f) for f in written))
