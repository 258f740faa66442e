"""Flows started with Hydra overrides, as `nas` takes them on the command line, so
any search or ingestion can be launched from the Prefect UI or `prefect
deployment run` with nothing but a list of strings, checked as the command
line's are (nas/config.py): a search's unknown group option or key fails its run in one line."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from flows.knowledge import ingest_flow
from flows.search import run_name
from nas.config import Checked, check_config, checked_job, split_override
from nas.execute import run_session
from nas.knowledge.config import KnowledgeConfig
from nas.llm import LLMConfig
from nas.search.rundir import RunDir
from nas.search.session import Session
from nas.search.spec import SearchSpec

RUN_DIR = "hydra.run.dir"

# The job `overrides_run_name` composed as the run began (its overrides, what `checked_job` made of
# them), taken by the run's body: Prefect calls both in the flow run's context, one after the
# other, so a deployment's run composes its config once, as `nas search` does.
_COMPOSED: ContextVar[tuple[list[str], tuple[SearchSpec, bool, Checked]] | None] = ContextVar(
    "nas_composed_job", default=None)


def overrides_run_name() -> str:
    """The flow run's name, `<strategy>-<space>-s<seed>`, from its parameters as the run begins
    (the flow's `flow_run_name`), so a run has that one name from its start; overrides that do not
    compose keep the flow's name (the run then fails with the command line's one-line error)."""
    _, job = split_override([str(o) for o in flow_run.parameters.get("overrides") or []], RUN_DIR)
    try:
        composed = checked_job(job)
    except Exception:  # noqa: BLE001 - the body says why, in its one line
        return "nas-search"
    _COMPOSED.set((job, composed))
    return run_name(composed[0])


@flow(name="nas-search-overrides", persist_result=False, flow_run_name=overrides_run_name)
def search_overrides_flow(overrides: list[str] | None = None, root: str = "runs") -> dict[str, Any]:
    """Any `nas search` (table, supernet, open-ended design) under the chosen runner;
    writes to `hydra.run.dir=DIR` when given (resuming a run there), else to a new
    ROOT/<strategy>-<space>-s<seed>[-N], and the flow run takes that directory's name
    (a run that fails before writing to a dir it made removes it again)."""
    overrides = list(overrides or [])
    dirs, job = split_override(overrides, RUN_DIR)
    spec, _, checked = _composed(job)  # the flow shows no progress of its own
    cfg = checked.container
    run_dir, made = target_dir(dirs, Path(root).resolve(), run_name(spec))
    run = RunDir(run_dir)
    with run.lock():  # once for the whole search (its `Session`), so a failed start can remove the dir it made
        try:
            if (name := renamed(run_dir, spec, dirs)) is not None:
                _rename_flow_run(name)
            summary = run_session(Session.read(spec.build(), run), cfg.get("runner") or {}, progress=False)
        except BaseException:
            if made:
                run.discard_unstarted()
            raise
    return {"run_dir": str(run_dir), **summary}


def _composed(job: list[str]) -> tuple[SearchSpec, bool, Checked]:
    """What `overrides_run_name` composed for this run (taken: a later run composes its own), else
    composed here. Not in the flow's body, which must pickle (flows/search.py, `_session`)."""
    composed = _COMPOSED.get()
    _COMPOSED.set(None)
    return composed[1] if composed is not None and composed[0] == job else checked_job(job)


def renamed(run_dir: Path, spec: SearchSpec, dirs: list[str]) -> str | None:
    """The flow run's new name where it must say which dir it writes: ROOT/NAME-2 (made because NAME,
    the spec's run name, was taken) renames it NAME-2; a dir the user named (`hydra.run.dir=`) or
    ROOT/NAME keeps its name."""
    return run_dir.name if run_dir.name != run_name(spec) and not dirs else None


def target_dir(dirs: list[str], root: Path, name: str) -> tuple[Path, bool]:
    """The run's dir (the last `hydra.run.dir=` given, else a new ROOT/NAME[-N]) and whether this run
    made it: a given dir that is not there yet is this run's too, one already there never is."""
    if dirs:
        path = Path(dirs[-1]).resolve()
        return path, not path.exists()
    return new_run_dir(root, name), True


def new_run_dir(root: Path, name: str) -> Path:
    """ROOT/NAME, or NAME-2, NAME-3, ... when taken: created here (mkdir is atomic), so two
    runs started at once never share a directory and no earlier run is overwritten."""
    root.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        path = root / (name if n == 1 else f"{name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1


def _rename_flow_run(name: str) -> None:
    """A run whose dir took a suffix (ROOT/NAME-2: NAME was taken) is named after that dir."""

    with get_client(sync_client=True) as client:
        client.set_flow_run_name(flow_run.get_id(), name)


@flow(name="nas-ingest-overrides", persist_result=False)
def ingest_overrides_flow(paths: list[str] | None = None, overrides: list[str] | None = None,
                          out: str | None = None) -> dict[str, Any]:
    """`nas knowledge ingest PATHS [overrides] --prefect`; no paths reads the built-in corpus."""
    cfg = check_config(list(overrides or []))
    settings = {"llm": cfg["llm"], "knowledge": cfg["knowledge"]}
    LLMConfig.from_dict(settings["llm"])  # bad settings fail before any paper is read
    KnowledgeConfig.from_dict(settings["knowledge"])
    return ingest_flow(settings, list(paths or []), out)
