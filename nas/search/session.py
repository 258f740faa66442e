"""One search from its start to its end (`Session`): its run dir locked once and read once, its
parts built once, handed explicitly to `execute`'s runner, the Prefect flow and the loop."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from nas.search.rundir import Resume, RunDir
from nas.search.spec import Search


@dataclass(frozen=True)
class Session:
    """`run` is held (its `lock()` entered by whoever opened the session) for the session's whole
    life, and `resume` is what its one `prepare` read (None: a new search); one loop runs it."""

    search: Search
    run: RunDir
    resume: Resume | None

    def __post_init__(self) -> None:
        if not self.run.held:
            raise RuntimeError(f"a search session needs {self.run.path}'s lock held")

    @classmethod
    def read(cls, search: Search, run: RunDir) -> Session:
        """The session of `search` in `run` (held): the run dir's one read."""
        return cls(search, run, run.prepare(search.spec.identity_fields(), search.spec.batch_lines))

    @classmethod
    @contextmanager
    def open(cls, search: Search, run_dir: Path) -> Iterator[Session]:
        """Lock `run_dir` and read it, for a caller that holds nothing yet (the library's)."""
        run = RunDir(run_dir)
        with run.lock():
            yield cls.read(search, run)
