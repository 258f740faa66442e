"""The trusted side's boundary fuzzed for minutes -> JSON (the bounded run: tests/test_fuzz_boundary.py).

The same generators and property as the tests (`tests/support/fuzz.py`): ZIPs, graphs and weights,
and child reports and report lines, mutated from a few small honest artifacts, and every message of the
sandbox's protocol (`protocol`: the child's and the trusted worker's lines, field by field,
`tests/support/protocol_fuzz.py`); every example must end in a value or one one-line refusal
(`GraphError`, `ValueError` for a report, `ProtocolError` for a line: its fields then within their
declared bounds, its text escaped) within a bounded time and peak memory growth. Hypothesis's engine generates (generation only: nothing is shrunk), seeded, for an
equal share of `--seconds` per target. Each broken property is a finding, kept once per kind of
break (numbers in the message as #) with the first example's summary and how often it recurred;
an example over `SECONDS` is a finding too. A break already reported (`fuzz.KNOWN`) names its
xfail test in tests/test_fuzz_boundary.py as `known`. The JSON has, per target, examples and examples per
second, how the examples ended (a value, or which refusal: what the generators reach), the slowest
example, the peak RSS, the findings and the duration.

    python benchmarks/fuzz.py --seconds 300 --seed 1    # 5 min on 2 cores
"""

from __future__ import annotations

import argparse
import collections
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # support.fuzz: a test helper, not in the wheel

import torch  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402

from nas.io import atomic_write_json  # noqa: E402
from support import fuzz  # noqa: E402


class _TimeUp(BaseException):
    """Ends hypothesis's run (not an Exception: hypothesis does not take it as a failing example)."""


def run_target(target: str, seconds: float, rng_seed: int) -> dict:
    strategy, _, _ = fuzz.TARGETS[target]
    ended: collections.Counter[str] = collections.Counter()
    findings: dict[str, dict] = {}
    stats = {"examples": 0, "slowest_s": 0.0, "slowest": ""}
    began = time.monotonic()

    @seed(rng_seed)
    @settings(max_examples=10**9, deadline=None, database=None, phases=["generate"],
              suppress_health_check=list(HealthCheck))
    @given(strategy())
    def one(example) -> None:
        if time.monotonic() - began > seconds:
            raise _TimeUp
        t0 = time.monotonic()
        problem, how = fuzz.outcome(target, example)
        took = time.monotonic() - t0
        stats["examples"] += 1
        ended[how] += 1
        if took > stats["slowest_s"]:
            stats["slowest_s"], stats["slowest"] = round(took, 3), fuzz.summary(target, example)
        if problem is None and took > fuzz.SECONDS:
            problem = f"took {took:.1f} s (over {fuzz.SECONDS:g})"
        if problem is not None:
            # one finding per known break (its xfail test), else per message with its numbers and quotes blanked
            known = fuzz.known(target, example, problem)
            kind = known or re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", re.sub(r"[0-9][0-9,.e+]*", "#", problem))[:100]
            if kind in findings:
                findings[kind]["count"] += 1
                if len(findings[kind]["more"]) < 2:
                    findings[kind]["more"].append({"input": fuzz.summary(target, example), "error": problem})
            else:
                findings[kind] = {"input": fuzz.summary(target, example), "error": problem, "count": 1,
                                  "at_example": stats["examples"], "known": known, "more": []}
                print(f"[{target}] finding: {problem[:160]}\n    input: {fuzz.summary(target, example)[:200]}",
                      flush=True)

    aborted = None
    try:
        one()
    except _TimeUp:
        pass
    except Exception as err:  # a generator's own bug: the run so far is kept, and says so
        aborted = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        print(f"[{target}] aborted: {aborted}", flush=True)
    duration = time.monotonic() - began
    return {"examples": stats["examples"], "seconds": round(duration, 1), "aborted": aborted,
            "examples_per_s": round(stats["examples"] / duration, 2),
            "slowest_example_s": stats["slowest_s"], "slowest_example": stats["slowest"][:300],
            "ended": dict(ended.most_common(40)), "distinct_endings": len(ended),
            "findings": list(findings.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600, help="the whole run, shared equally by the targets")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--targets", nargs="+", default=list(fuzz.TARGETS), choices=list(fuzz.TARGETS))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    began = time.monotonic()
    fuzz.warm()
    warm_s = time.monotonic() - began
    share = args.seconds / len(args.targets)
    targets = {}
    for target in args.targets:
        targets[target] = run_target(target, share, args.seed)
        r = targets[target]
        print(f"{target}: {r['examples']} examples, {r['examples_per_s']}/s, {len(r['findings'])} finding(s)",
              flush=True)
    atomic_write_json(args.out, {
        "command": f"python benchmarks/fuzz.py --seconds {args.seconds:g} --seed {args.seed}",
        "machine": f"{platform.machine()}, {platform.python_version()}, torch {torch.__version__}, 1 thread",
        "seed": args.seed,
        "duration_s": round(time.monotonic() - began, 1),
        "warm_up_s": round(warm_s, 1),
        "bounds": {"seconds_per_example": fuzz.SECONDS, "peak_rss_growth_mb": fuzz.RSS_MB},
        "peak_rss_mb": round(fuzz.peak_rss_mb()),
        "examples": sum(t["examples"] for t in targets.values()),
        "findings": sum(len(t["findings"]) for t in targets.values()),
        "targets": targets,
    })
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
