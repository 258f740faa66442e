"""Which trial of a run to export: the run's spec and history, and the summary's trust rule for "best"."""

from __future__ import annotations

from pathlib import Path

from nas.core.trial import TrialRecord, best_record, read_history
from nas.errors import RunDirError
from nas.export import ExportError, run_summary
from nas.io import read_json_object
from nas.search.loop import trusts_self_reported
from nas.search.spec import SearchSpec


def load_trial(run_dir: Path, trial: int | None) -> tuple[SearchSpec, TrialRecord]:
    """(SearchSpec, the trial's record: the best by the summary's rule when `trial` is None)."""
    summary_path = run_summary(run_dir)
    summary = read_json_object(summary_path)
    try:
        spec = SearchSpec.from_dict(summary["spec"])
    except (KeyError, TypeError, ValueError) as err:
        raise RunDirError(f"{summary_path}: no readable 'spec' ({type(err).__name__}: {err})") from None
    history = read_history(run_dir / "history.jsonl")
    by_trial = {r.trial: r for r in history}
    if trial is None:
        best = best_record(history, trusts_self_reported(summary["spec"]))  # the summary's rule
        if best is None and any(r.accuracy is not None for r in history):
            raise ExportError(f"{run_dir}: every successful trial is self-reported and the evaluator does not "
                              "trust those (evaluator.trust_self_reported=false); choose one with --trial N")
        if best is None:
            raise ExportError(f"{run_dir}: no successful trial ({summary.get('trials', len(history))} trials, "
                              "all failed); nothing to export")
        return spec, best
    if trial not in by_trial:
        raise ExportError(f"{run_dir}: trial {trial} out of range (history.jsonl has trials 0..{len(history) - 1})")
    record = by_trial[trial]
    if record.screened:
        raise ExportError(f"{run_dir}: trial {trial} was screened out (score {record.score}), never evaluated; "
                          "nothing to export")
    if record.accuracy is None:
        raise ExportError(f"{run_dir}: trial {trial} failed ({record.error}); nothing to export")
    return spec, record
