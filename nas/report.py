"""Human-facing outputs of a run: a best-so-far plot and a markdown report."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from nas.core.trial import SELF_REPORTED, TrialRecord, best_so_far, evaluated, read_history
from nas.io import atomic_write_bytes, atomic_write_text
from nas.terminal import clipped, printable


def _pyplot():
    import matplotlib  # lazy: loads matplotlib (start-up time)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: loads matplotlib (start-up time)

    return plt


def save_figure(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())


def write_run_report(run_dir: Path, summary: dict[str, Any]) -> None:
    """best_so_far.png and report.md of a finished search, from its history.jsonl and `summary`
    (what `SearchLoop.run_search` returned): written by the caller, so library runs make no plots."""
    from nas.search.loop import trusts_self_reported  # lazy: loads numpy (start-up time)

    history = read_history(Path(run_dir) / "history.jsonl")
    plt = _pyplot()
    curve = best_so_far(history, trusts_self_reported(summary.get("spec") or {}))
    fig, ax = plt.subplots(figsize=(6, 4))
    done = evaluated(history)  # x: each trial's own number, as report.md and the CLI give it
    xs = [r.trial for r, v in zip(done, curve) if v is not None]
    ax.plot(xs, [v for v in curve if v is not None], drawstyle="steps-post", label=summary["strategy"])
    ok = [(r.trial, r.accuracy) for r in done if r.accuracy is not None]
    if ok:
        ax.scatter(*zip(*ok), s=6, alpha=0.3, color="gray", label="evaluated")
    ax.set_xlabel("trial")
    ax.set_ylabel("best accuracy so far (%)")
    ax.set_title(f"{summary['strategy']} on {summary['space']} ({summary['evaluator']}), seed {summary['seed']}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    save_figure(fig, Path(run_dir) / "best_so_far.png")
    atomic_write_text(Path(run_dir) / "report.md", render_markdown(history, summary))


def render_markdown(history: list[TrialRecord], summary: dict[str, Any], top: int = 10) -> str:
    from nas.search.loop import trusts_self_reported  # lazy: loads numpy (start-up time)

    best = summary.get("best") or {}
    trust = trusts_self_reported(summary.get("spec") or {})
    self_reported = summary.get("self_reported") or 0
    best_record = next((r for r in history if r.trial == best.get("trial")), None)
    best_note = f" ({SELF_REPORTED})" if best_record is not None and best_record.self_reported else ""
    lines = [
        f"# Search report: {summary['strategy']} on {summary['space']}",
        "",
        "| field | value |", "| --- | --- |",
        f"| evaluator | {summary['evaluator']} |",
        f"| seed | {summary['seed']} |",
        f"| trials | {summary['trials']} (failed {summary['failed']}, cache hits {summary['cache_hits']}"
        + (f", self-reported {self_reported}{'' if trust else ': not ranked'}" if self_reported else "") + ") |",
        *([f"| screened out | {summary['screened']} (asked, scored, not evaluated) |"] if "screened" in summary else []),
        f"| best accuracy | {_fmt(best.get('accuracy'))}{best_note} |",
        f"| best encoding | {_code(best.get('encoding'))} |",
        f"| wall seconds | {summary['wall_seconds']:.2f} |",
    ]
    for n, acc in summary.get("best_at", {}).items():
        lines.append(f"| best at {n} trials | {_fmt(acc)} |")
    ranked = sorted((r for r in history if r.counts_for_best(trust)), key=_accuracy, reverse=True)[:top]
    lines += ["", f"## Top {len(ranked)} architectures", "",
              "| rank | trial | accuracy | params | FLOPs | encoding |",
              "| --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(ranked, 1):
        lines.append(f"| {i} | {r.trial} | {_score(r)} | {_fmt_int(r.params)} | "
                     f"{_fmt_int(r.flops)} | {_code(r.encoding)} |")
    lines += ["", "![best so far](best_so_far.png)", ""]
    if "design" in summary:
        lines += _design_section(history, summary)
    if isinstance(best.get("encoding"), str) and "\n" in best["encoding"]:
        lines += _fenced(best["encoding"])
    return "\n".join(lines)


def _design_section(history: list[TrialRecord], summary: dict[str, Any]) -> list[str]:
    """LLM design strategies: the NADER table (overall and per stage) and one row per design."""
    rows = [("all", summary["design"]), *sorted((summary.get("stages") or {}).items())]
    lines = ["## Design quality", "",
             "| designs | proposals | valid (pass rate) | duplicates | executability | success rate | tokens / valid |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, d in rows:
        tokens = d.get("tokens_per_valid_design")
        lines.append(f"| {name} | {d['proposals']} | {d['valid']} ({d['pass_rate']:.0%}) | {d['duplicates']} | "
                     f"{d['executability']:.0%} | {d['success_rate']:.0%} | {'-' if tokens is None else f'{tokens:,.0f}'} |")
    usage = (summary.get("llm") or {}).get("total")
    if usage:
        lines += ["", f"LLM: {usage.get('calls', 0)} calls ({usage.get('live', 0)} live, {usage.get('cached', 0)} cached, "
                      f"{usage.get('replayed', 0)} replayed, {usage.get('failures', 0)} failed), "
                      f"{usage.get('prompt_tokens', 0):,} prompt + {usage.get('completion_tokens', 0):,} completion tokens."]
    lines += ["", "## Designs", "", "| trial | stage | parent | idea | retries | outcome | accuracy |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in history:
        info = r.strategy
        if "valid" not in info:
            continue
        retries = info.get("retries", info.get("debug_retries", 0) + info.get("downscale_retries", 0))
        outcome = "trained" if r.accuracy is not None else "screened out" if r.screened \
            else _cell(r.error, 80) if r.error else "failed"
        idea = info.get("idea")
        lines.append(f"| {r.trial} | {info.get('stage', '-')} | {info.get('parent', '-')} | "
                     f"{_cell(idea, 70) if idea else '-'} | {retries} | {outcome} | {_score(r)} |")
    return lines + [""]


def _fenced(source: str) -> list[str]:
    """The best design's source (an LLM's or a model file's text) as a code block it cannot
    close early: a fence longer than any run of backticks in it, its control characters escaped."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", source)), default=0))
    return ["## Best design", "", fence, printable(source.rstrip("\n"), lines=True), fence, ""]


def _cell(text: Any, n: int) -> str:
    """One table cell of text from an LLM reply or a model file (an idea, an error, an encoding):
    one line of at most n characters, control characters escaped, as a code span (`code_span`:
    no markup in it renders) whose pipes are escaped (a GFM table ends a cell at a bare pipe, even
    inside code)."""
    return code_span(clipped(printable(" ".join(str(text).split())), n).replace("|", "\\|"))


def code_span(text: str) -> str:
    """`text` as a markdown code span, which shows it as written: `~`, `*`, `_`, `<` and `[` are
    no markup there (an NB201 cell's `~0|+|...~1` would be struck through as text). Its fence is
    one backtick longer than the longest run in it, padded with a space where the text starts or
    ends with a backtick or a space (CommonMark strips one space from each end)."""
    if not text:
        return ""
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", text)), default=0))
    pad = " " if text.strip() and (text[0] in "` " or text[-1] in "` ") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _code(encoding: Any) -> str:
    """An encoding in a table cell; a multi-line design (block file, model source) by its size."""
    if encoding is None:
        return "-"
    if isinstance(encoding, str) and "\n" in encoding:
        return f"{len(encoding.splitlines())}-line design (see history.jsonl)"
    return _cell(encoding, 200)


def _score(r: TrialRecord) -> str:
    """A trial's accuracy in a table cell, marked when the model reported it itself."""
    return _fmt(r.accuracy) + (" (self-reported, not verified)" if r.accuracy is not None and r.self_reported else "")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _fmt_int(x: float | None) -> str:
    """Counts (params, FLOPs) are stored as numbers that may be floats: shown whole."""
    return "-" if x is None else f"{int(x):,}"


def _accuracy(r: TrialRecord) -> float:
    """Sort key of ranked records (they have an accuracy)."""
    return r.accuracy if r.accuracy is not None else float("-inf")


class RunReport:
    """`write_run_report` in a child process, started as the search starts (`start`): it imports
    matplotlib (~1 s) while the search runs, then waits for the summary (`send`, as the search ends)
    and draws; `wait` once the caller's own closing work is done (the flow's artifacts). The
    search's process never imports matplotlib, and the files are there when `wait` returns. A
    failure is one warning line: the run's results are in history.jsonl and summary.json whatever
    happens to its report. A child given no summary (`cancel`, `discard`: the search failed) writes nothing."""

    CHILD = ("import json, sys; from nas.report import _pyplot, write_run_report; _pyplot(); "
             "data = sys.stdin.read(); data and write_run_report(sys.argv[1], json.loads(data))")

    def __init__(self, run_dir: Path, summary: dict[str, Any] | None = None) -> None:
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        self.run_dir = Path(run_dir)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.CHILD, str(self.run_dir)],
            stdin=subprocess.PIPE, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True)
        if summary is not None:
            self.send(summary)

    @classmethod
    def start(cls, run_dir: Path) -> RunReport:
        """The child, importing while the search runs; `send` it the summary."""
        return cls(run_dir)

    def send(self, summary: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(summary, default=str))
        except BrokenPipeError:  # the child died already: `wait` says why
            pass
        finally:
            self.cancel()

    def cancel(self) -> None:
        """No (more) summary: a child that has none exits without writing."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def discard(self) -> None:
        """The search failed or was stopped: the child is stopped and reaped, and writes nothing."""
        self.cancel()
        self.proc.terminate()
        self.proc.wait()
        assert self.proc.stderr is not None
        self.proc.stderr.close()

    def wait(self) -> None:
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        if self.proc.wait() != 0:
            last = (err.strip().splitlines() or ["no message"])[-1]
            print(f"warning: {self.run_dir}: best_so_far.png and report.md not written ({last})",
                  file=sys.stderr, flush=True)
