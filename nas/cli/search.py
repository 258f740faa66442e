"""`nas search`: every job's config is composed and checked before Hydra runs, so a
rejected command leaves no run dir and says why in one line; each job then takes its
run dir's lock before anything is written there (`.hydra/`, `search.log`), once for the
whole search (its `Session`), and a job that fails before its search writes anything
removes them again."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nas.cli.hydra_job import plain_run, run_composed
from nas.cli.main import check_group_overrides, fail
from nas.config import Checked, check_build, checked_job, job_overrides, searchpath
from nas.core.trial import read_history
from nas.errors import NasError
from nas.execute import run_session
from nas.io import atomic_write_text, check_output
from nas.search.loop import check_budget
from nas.search.rundir import Resume, RunDir
from nas.search.session import Session
from nas.search.spec import Search, SearchSpec
from nas.status import status
from nas.terminal import printable
from tasks.env import configure_prefect_env, quiet_termination

MULTIRUN = ("-m", "--multirun")


def main(argv: list[str]) -> None:
    check_group_overrides(argv)
    flags = [a for a in argv if a.startswith("-")]
    existing = output_dirs(argv)
    checked, built = None, None
    if not set(flags) - set(MULTIRUN):  # --help, --cfg job, ...: Hydra's own, nothing is written
        try:
            checked, built = check_jobs(job_overrides([a for a in argv if a not in MULTIRUN], bool(flags)))
        except NasError as err:
            fail(str(err))
    sys.argv = ["nas search", *searchpath(), *argv]
    if not flags and checked is not None and plain_run(checked.config):
        run_composed(checked.config, lambda cfg: search_job(cfg, existing, built))  # composes nothing again
    else:
        _hydra_entry(existing, built)


def output_dirs(argv: list[str]) -> set[Path]:
    """The given run dirs that are there before Hydra makes its own (never removed), after checking
    each given output dir: Hydra makes it itself, where a file in the way is a traceback."""
    existing: set[Path] = set()
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") in ("hydra.run.dir", "hydra.sweep.dir") and not value.strip():
            fail(f"{key.lstrip('+')} is empty: give a directory (an empty one would write into the current one)")
        if key.lstrip("+") in ("hydra.run.dir", "hydra.sweep.dir") and "${" not in value:
            try:
                check_output(Path(value), directory=True)
            except NasError as err:
                fail(str(err))
            if key.lstrip("+") == "hydra.run.dir" and Path(value).is_dir():
                existing.add(Path(value).resolve())
    return existing


def check_jobs(jobs: list[list[str]]) -> tuple[Checked, Search | None]:
    """Every job's config, then its components once per distinct job but seed (the slow part: an
    evaluator may load a table); a sweep's checks take about a second a job, and one job's build
    2-5 s (torch's imports), so they show progress. Counted steps, so that off a terminal a
    component's error (raised after the imports) is still the only line. Returns the first
    job's composed config, and a single job's built parts: it runs on both."""
    if len(jobs) == 1:
        spec, progress, checked = checked_job(jobs[0])
        with status(f"checking space={spec.space.name}, strategy={spec.strategy.name} and "
                    f"evaluator={spec.evaluator.name}", total=1, show=progress) as advance:
            built = check_build(spec, keep=True)
            advance()
        return checked, built
    first, progress, checked = checked_job(jobs[0])  # its `progress` decides for the sweep (rarely swept)
    with status(f"checking {len(jobs)} jobs", total=len(jobs), show=progress) as advance:
        specs = [first]
        advance()
        for job in jobs[1:]:
            specs.append(checked_job(job)[0])
            advance()
        for spec in {repr({**spec.to_dict(), "seed": 0}): spec for spec in specs}.values():
            check_build(spec)
    return checked, None


def _detach_logs_in(run_dir: Path) -> None:
    """Close the log files Hydra set up in a run dir that was removed (its `search.log`, opened
    on the first line): whatever this process logs next would fail to create it."""
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    for logger in loggers:
        for handler in list(logger.handlers):
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == run_dir:
                logger.removeHandler(handler)
                handler.close()


def discard_failed_start(run: RunDir, existing: set[Path]) -> None:
    """After a failed start: the run dir is removed unless it was there before this command
    (`existing`) or the search wrote to it; once removed, its log files are closed too."""
    if run.path not in existing:
        run.discard_unstarted()
        if not run.path.exists():
            _detach_logs_in(run.path)


def _hydra_entry(existing: set[Path], built: Search | None) -> None:
    """Hydra's main: a sweep (-m), Hydra's own flags (--cfg, --help), a `hydra.verbose` run."""
    @hydra.main(config_path="pkg://conf", config_name="config", version_base="1.3")
    def search(cfg: DictConfig) -> None:
        search_job(cfg, existing, built)

    search()


def reused(built: Search | None, spec: SearchSpec) -> Search:
    """The checks' build when it is this job's spec (no second load of its space), else the spec's own."""
    return built if built is not None and built.spec == spec else spec.build()


def search_job(cfg: Any, existing: set[Path], built: Search | None) -> None:
    """One job, under Hydra's run (its run dir and logging set up). `existing`: run dirs that were
    there before this command (a user's own, an earlier run's): a failed start leaves them where
    they were; it removes only a dir it made. `built`: the parts the checks built for a single
    job (a sweep's jobs build their own)."""
    configure_prefect_env()  # before a runner imports Prefect: its home and cache under NASFLOW_HOME

    run_dir: Path | None = None  # Ctrl-C may come before it is known
    try:
        container = OmegaConf.to_container(cfg, resolve=True)
        spec = SearchSpec.from_config(container)
        run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
        run = RunDir(run_dir)
        signal.signal(signal.SIGINT, interrupt_once)
        signal.signal(signal.SIGTERM, terminate_once)
        quiet_termination()
        logging.getLogger("prefect.flow_runs").addFilter(said_in_one_line)
        with run.lock():  # before anything is written: another search may own the dir; until it ends
            try:
                resume = check_run_dir(run, spec)
                save_hydra_files(run_dir / ".hydra", cfg)
                search = reused(built, spec)
                summary = run_session(Session(search, run, resume), container.get("runner") or {},
                                      bool(container.get("progress", True)))
            except BaseException:  # a start that failed (Prefect's, a runner setting's) leaves no dir
                discard_failed_start(run, existing)
                raise
        print_summary(run_dir, summary)
    except NasError as err:
        fail(str(err))
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: the saved state resumes the search; no traceback
        interrupted(run_dir, isinstance(stop, Terminated))


def check_run_dir(run: RunDir, spec: SearchSpec) -> Resume | None:
    """The run dir's one read and its refusals, each one line, before Prefect starts (whose flow
    would log a traceback first) and before `.hydra/` is rewritten; the loop says the run dir when
    it starts, from what this read."""
    resume = run.prepare(spec.identity_fields(), spec.batch_lines)
    check_budget(run.path, resume.history if resume else [], spec.trials)
    return resume


def said_in_one_line(record: logging.LogRecord) -> bool:
    """Drops Prefect's record of a flow's NasError, traceback and all: `fail` says it in one line."""
    return not (record.exc_info and isinstance(record.exc_info[1], NasError))


def interrupt_once(signum: int, frame: Any) -> None:
    """Ctrl-C as Python's default, once: a second one while the first unwinds (Prefect's
    shutdown, its server's stop at exit) would end in a traceback instead of the one line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a scheduler's or container's stop) unwinds as Ctrl-C does."""


def terminate_once(signum: int, frame: Any) -> None:
    """SIGTERM as Ctrl-C, once. Under Prefect the flow engine's own handler runs first (it marks
    the run crashed), then signals again with this one back in place."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Terminated


def interrupted(run_dir: Path | None, terminated: bool = False) -> None:
    """One line on what was saved, then exit as a shell reports the signal (130 Ctrl-C, 143 SIGTERM)."""
    what, status = ("terminated", 143) if terminated else ("interrupted", 130)
    # removed (RunDir.discard_unstarted), or a given dir kept: either way no search state was written
    if run_dir is None or not RunDir(run_dir).state_path.exists():
        print(f"nas: {what} before the search started; nothing was saved", file=sys.stderr)
        raise SystemExit(status)
    trials = RunDir(run_dir).saved_trials()
    print(f"nas: {what} after {trials} trial{'s' * (trials != 1)}; run the same command to resume "
          f"(run dir: {run_dir})", file=sys.stderr)
    raise SystemExit(status)


def print_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    print(f"run dir: {run_dir}")
    if summary.get("ui"):  # the flow run in the UI of the server it reported to (its port may not be 4200)
        print(f"UI: {summary['ui']}")
    if summary.get("exhausted"):  # fewer trials than asked for: say why, not just the count
        budget = (summary.get("spec") or {}).get("trials", "?")
        print(f"ended after {summary['trials']} of {budget} trials: {summary['exhausted']}")
    best = summary.get("best")
    if best is None:
        print(f"best: none ({summary['trials']} trials, all failed)")
        return
    encoding = best["encoding"]  # a string, or a list of choices (SPOS, OFA)
    # a block file or model source is dozens of lines: the report shows it, export writes it out
    lines = encoding.strip().count("\n") + 1 if isinstance(encoding, str) else 1
    # escaped: an LLM's design on one line (`nas.terminal`)
    shown = printable(str(encoding)) if lines == 1 else f"({lines}-line design in {run_dir / 'report.md'})"
    print(f"best: {best['accuracy']:.2f}% {shown} key={best['key']} "
          f"(trial {best['trial']} of {summary['trials']}, {summary['wall_seconds']:.1f}s, "
          f"{summary['cache_hits']} cached)")
    if lines > 1:
        print(f"export it: nas export {run_dir}")
    if summary.get("design"):
        print(llm_line(run_dir, summary))


def llm_line(run_dir: Path, summary: dict[str, Any]) -> str:
    """What the LLM did in a design search: designs proposed, valid, trained, better than the root."""
    design, history = summary.get("design") or {}, read_history(run_dir / "history.jsonl")
    root = next((r for r in history if (r.strategy or {}).get("stage") == "root"), None)
    designed = [r for r in history if r is not root]
    trained = [r for r in designed if r.accuracy is not None]
    base = root.accuracy if root is not None else None
    better = [r for r in trained if base is not None and r.accuracy is not None and r.accuracy > base]
    total = ((summary.get("llm") or {}).get("total") or {})
    root_text = f" ({root.accuracy:.2f}%)" if root is not None and root.accuracy is not None else ""
    beat = beat_parent(summary.get("tree"))
    line = (f"LLM: {design.get('proposals', len(designed))} designs proposed, {design.get('valid', '?')} valid, "
            f"{len(trained)} trained, {len(better)} better than the root{root_text}"
            f"{'' if beat is None else f', {beat} better than their parent'}; "
            f"{total.get('calls', 0)} calls, {total.get('tokens', 0)} tokens, {total.get('latency_s', 0.0):.0f} s, "
            f"{total.get('retries', 0)} retries")
    if trained and not better and base is not None:  # said plainly: the search found nothing better
        line += (f"\nno design beat the root{root_text}: the best is the unmodified base design. A stronger "
                 "model designs better: llm=openai llm.base_url=URL llm.model=NAME (any OpenAI-compatible endpoint)")
    return line


def beat_parent(tree: Any) -> int | None:
    """Evaluated nodes of a modification tree (summary's `tree`) scoring above their parent; None without one."""
    if not isinstance(tree, dict) or not isinstance(tree.get("nodes"), list):
        return None
    score = {n.get("id"): n.get("score") for n in tree["nodes"] if isinstance(n, dict)}
    return sum(1 for n in tree["nodes"] if isinstance(n, dict) and n.get("parent") is not None
               and isinstance(n.get("score"), (int, float)) and isinstance(score.get(n["parent"]), (int, float))
               and n["score"] > score[n["parent"]])


def save_hydra_files(folder: Path, cfg: Any) -> None:
    """What Hydra writes to `.hydra/` (its own writing is off: `hydra.output_subdir: null`)."""
    hydra_cfg = HydraConfig.get()
    atomic_write_text(folder / "config.yaml", OmegaConf.to_yaml(cfg))
    atomic_write_text(folder / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})))
    atomic_write_text(folder / "overrides.yaml", OmegaConf.to_yaml(hydra_cfg.overrides.task))
