"""`make run` on a fresh clone, idle and under a background load -> benchmarks/results/make_run.json.

  python benchmarks/make_run.py [--loads 0 4] [--worktree] [--clone /tmp/mr_clone] [--timeout 1800]

What a new user runs: `make run` is `$(BIN)/nas search` (NADER with the embedded SmolLM2 on the
Makefile's defaults), here run in a fresh `git clone` of this repository with a fresh NASFLOW_HOME
per load level. The installed .venv is reused (its `bin` first on PATH and the clone first on
PYTHONPATH, so the clone's code runs) rather than built again: installing is measured separately.
`--worktree` lays this checkout's uncommitted files over the clone (to measure work before its
commit). For each load level, that many busy-loop processes run alongside; the JSON records the
wall seconds, the command's last lines (run dir, best, what the LLM did), the summary's LLM numbers
and the load average sampled through the run (a shared machine: say what the load really was).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json, read_json  # noqa: E402

BIN = Path(sys.executable).parent
BUSY = "while True: pass"


def run_recipe() -> list[str]:
    """`make run`'s command, read from the Makefile: `$(BIN)/nas search ...`."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^run:.*\n\t(.+)$", text, flags=re.MULTILINE)
    if match is None or not match.group(1).strip().startswith("$(BIN)/nas "):
        raise SystemExit(f"Makefile: the run target is not `$(BIN)/nas ...`: {match and match.group(1)!r}")
    return [str(BIN / "nas"), *match.group(1).split()[1:]]


def fresh_clone(clone: Path, worktree: bool) -> str:
    if clone.exists():
        shutil.rmtree(clone)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not worktree:
        return head
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src, dst = ROOT / name, clone / name
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    deleted = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "-d"], capture_output=True,
                             check=True).stdout.decode().split("\0")
    for name in filter(None, deleted):
        (clone / name).unlink(missing_ok=True)
    return f"{head} + working tree"


def one_run(clone: Path, load: int, timeout: float) -> dict:
    home = clone.parent / f"{clone.name}-home-load{load}"
    if home.exists():
        shutil.rmtree(home)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "NASFLOW_", "HYDRA_"))},
           "NASFLOW_HOME": str(home), "PYTHONPATH": str(clone), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(15.0):
            samples.append(round(os.getloadavg()[0], 2))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    try:
        proc = subprocess.run(run_recipe(), cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as stopped:
        code, out, err = None, _text(stopped.stdout), _text(stopped.stderr)
    finally:
        wall = time.perf_counter() - start
        done.set()
        for p in busy:
            p.kill()
            p.wait()
        _stop_local_server(home)
    row: dict = {"load_processes": load, "wall_s": round(wall, 1), "exit": code, "timed_out": code is None,
                 "load_avg_1m_samples": samples, "stdout_tail": out.strip().splitlines()[-6:],
                 "stderr_head": err.strip().splitlines()[:3], "stderr_tail": err.strip().splitlines()[-3:]}
    run_dir = next((line.split("run dir: ", 1)[1].split(" (")[0] for line in (err + out).splitlines()
                    if line.startswith("run dir: ")), None)
    if run_dir and (Path(run_dir) / "summary.json").is_file():
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
        row["summary"] = {k: summary.get(k) for k in ("trials", "failed", "wall_seconds", "exhausted", "design")}
        row["summary"]["llm_total"] = (summary.get("llm") or {}).get("total")
        row["summary"]["best_accuracy"] = (summary.get("best") or {}).get("accuracy")
    row["first_line"] = (err.strip().splitlines() or [""])[0]
    return row


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _stop_local_server(home: Path) -> None:
    state = home / "prefect" / "local-server.json"
    try:
        os.kill(int(json.loads(state.read_text())["pid"]), 15)
    except (OSError, ValueError, KeyError, TypeError):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--clone", type=Path, default=Path("/tmp/mr_clone"))
    parser.add_argument("--worktree", action="store_true", help="lay the uncommitted files over the clone")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "make_run.json")
    args = parser.parse_args()
    source = fresh_clone(args.clone, args.worktree)
    rows = []
    for load in args.loads:
        print(f"make run with {load} busy processes (load avg now {os.getloadavg()[0]:.1f}) ...", flush=True)
        row = one_run(args.clone, load, args.timeout)
        row.update(source=source, when=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        rows.append(row)
        print(f"  {row['wall_s']} s, exit {row['exit']}: {row['stdout_tail'][-1:]}", flush=True)
    report = read_json(args.out) if args.out.exists() else {}
    # A rerun of some load levels keeps the others' rows (each says its own source and time).
    kept = [r for r in report.get("runs", []) if r.get("load_processes") not in args.loads]
    report["runs"] = sorted(kept + rows, key=lambda r: r["load_processes"])
    report["command"] = "make run: " + " ".join(["$(BIN)/nas", *run_recipe()[1:]])
    report["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    report["note"] = ("a fresh clone and NASFLOW_HOME per load level, the installed .venv reused (each row: its commit and "
                      "time; rerunning some load levels keeps the other rows); load_avg_1m_samples "
                      "is the machine's real load (other work included), every 15 s; the issue's targets: at most "
                      "300 s idle on 2 cores, 600 s with 4 busy processes")
    atomic_write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
