"""One ingest, as the CLI and the Prefect flow run it: build the Reader from the
`llm` and `knowledge` settings, read, and leave a record (summary.json with the
LLM accounting, plus the transcripts a replay needs)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from nas.errors import InputError, OutputPathError, RunDirError
from nas.home import home
from nas.io import atomic_write_json, check_output, make_dir, read_json_object
from nas.knowledge.config import KnowledgeConfig
from nas.knowledge.embed import default_embedder
from nas.knowledge.papers import builtin_corpus
from nas.knowledge.reader import IngestReport, Reader
from nas.llm import LLMClient, LLMConfig


@dataclass
class Ingest:
    reader: Reader
    client: Any           # nas.llm.LLMClient
    out: Path
    paths: list[Path]
    backend: str

    def summary(self, report: IngestReport) -> dict[str, Any]:
        store = self.reader.store
        summary = {"paths": [str(p) for p in self.paths], "report": report.to_dict(),
                   "llm": self.client.usage.to_dict(), "llm_backend": self.backend,
                   "ideas_in_store": store.count(), "papers_in_store": store.count_papers(),
                   "experiences_in_store": self.reader.experiences.count()}
        atomic_write_json(self.out / "summary.json", summary)
        return summary


RECORD_FILES = {"summary.json", "llm"}  # what an ingest leaves in its --out


def check_record_dir(out: Path) -> None:
    """An existing `out` must be an earlier ingest record (empty, or only what an ingest
    writes, its summary.json one of an ingest): summary.json is replaced, nothing else is."""
    if not out.is_dir():
        check_output(out, directory=True)
        return
    others = sorted(p.name for p in out.iterdir() if p.name not in RECORD_FILES)
    try:
        summary = read_json_object(out / "summary.json") if (out / "summary.json").is_file() else {}
    except RunDirError as err:  # the --out is in the way, as when it holds another file
        raise OutputPathError(f"{err}; pass a new or empty --out") from None
    if others or (summary and "llm_backend" not in summary):
        why = f"holds {others[0]}" if others else "its summary.json is not an ingest's"
        raise OutputPathError(f"{out}: exists and is not an earlier ingest record ({why}); "
                              "pass a new or empty --out")


def prepare(settings: dict[str, Any], paths: list[Path], out: Path | None) -> Ingest:
    kcfg = KnowledgeConfig.from_dict(settings["knowledge"])
    lcfg = LLMConfig.from_dict(settings["llm"])
    paths = [Path(p) for p in paths] or [builtin_corpus()]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise InputError(f"{missing[0]}: no such file or directory")
    out = Path(out) if out else home() / "knowledge" / "ingests" / time.strftime("%Y-%m-%d_%H-%M-%S")
    check_record_dir(out)
    make_dir(out)
    tree = kcfg.load_tree()
    embedder = default_embedder()
    client = LLMClient(lcfg, run_dir=out)
    # A replay screens as the recorded run did: by the model it recorded.
    reader_model = (client.book.settings.get("reader", {}).get("model") if client.book else None) \
        or lcfg.role("reader").model or ""
    reader = Reader(kcfg.open_store(embedder), tree, kcfg.build_tagger(tree, embedder, client), client,
                    experiences=kcfg.open_experiences(embedder),
                    screen=kcfg.screen_mode(reader_model), screen_threshold=kcfg.screen_threshold,
                    max_method_chars=kcfg.max_method_chars, max_ideas=kcfg.max_ideas,
                    dedup_threshold=kcfg.dedup_threshold)
    return Ingest(reader, client, out, paths, lcfg.backend)


def run_ingest(settings: dict[str, Any], paths: list[Path], out: Path | None = None, *,
               progress: bool = False, echo: Callable[[str], None] | None = None,
               read: Callable[[Ingest], IngestReport] | None = None) -> tuple[Ingest, dict[str, Any]]:
    """Read `paths` (the built-in corpus if empty); `read` lets the flow fan out per file;
    `progress` (a bar) and `echo` (periodic lines) as `Reader.ingest`."""
    job = prepare(settings, paths, out)
    report = read(job) if read else job.reader.ingest(job.paths, progress=progress, echo=echo)
    return job, job.summary(report)
