"""Reading paper files into records: PDF (text extraction), markdown/text,
JSONL (`title`, `abstract`, optional `body`, `ideas`), and ready-made idea
lists such as NADER's `inspirations.json`. A bad file is reported, not fatal."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

from nas.core.arch import stable_hash
from nas.knowledge.idea import Idea, Tag

SUFFIXES = (".pdf", ".md", ".markdown", ".txt", ".jsonl", ".json")


@dataclass
class Paper:
    title: str
    abstract: str
    body: str = ""
    year: int | None = None
    venue: str = ""
    ideas: list[dict[str, Any]] = field(default_factory=list)  # ready-made ideas (text + optional tags)
    source: str = ""          # the file ("builtin" for the shipped corpus)
    line: int | None = None   # its line, for JSONL

    @property
    def hash(self) -> str:
        """Content hash: the Reader's cache key (a renamed file is not read twice)."""
        return stable_hash(self.title, self.abstract, self.body, self.ideas)


@dataclass
class BadFile:
    path: str
    reason: str


@dataclass
class IdeaList:
    """A list of ideas without papers (NADER's inspirations): tagged and stored as is."""

    ideas: list[dict[str, Any]]
    source: str


@dataclass
class ExperienceFile:
    """NADER's experience files (tips after failures, suggestions after degradations)."""

    path: str


def builtin_corpus() -> Path:
    return Path(str(resources.files("nas.knowledge") / "data" / "corpus.jsonl"))


def builtin_ideas() -> list[Idea]:
    """The shipped corpus's ready-made ideas with their tags (no LLM involved)."""
    out = []
    for paper in read_path(builtin_corpus()):
        if isinstance(paper, Paper):
            for d in paper.ideas:
                tag = Tag(d["target"], d["granularity"], d["main"], d.get("sub") or "") if d.get("main") else None
                out.append(Idea(d["text"], tag, source="builtin", paper_title=paper.title))
    return out


def files(path: Path) -> list[Path]:
    """`path` itself, or the readable files under a directory."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
    return [path]


def read_path(path: Path) -> Iterator[Paper | BadFile | IdeaList | ExperienceFile]:
    """Everything readable under `path` (a file or a directory, recursively)."""
    path = Path(path)
    label = "builtin" if path.resolve() == builtin_corpus().resolve() else str(path)
    if path.is_dir():
        for child in files(path):
            yield from read_path(child)
        return
    if not path.exists():
        yield BadFile(str(path), "no such file or directory")
        return
    suffix = path.suffix.lower()
    try:
        if suffix == ".pdf":
            yield _read_pdf(path)
        elif suffix in (".md", ".markdown", ".txt"):
            yield _read_text(path.read_text(encoding="utf-8"), str(path))
        elif suffix == ".jsonl":
            yield from _read_jsonl(path, label)
        elif suffix == ".json":
            yield _read_json(path)
        else:
            yield BadFile(str(path), f"unsupported file type '{suffix}' (valid: {', '.join(SUFFIXES)})")
    except _Bad as err:
        yield BadFile(str(path), str(err))
    except UnicodeDecodeError as err:
        yield BadFile(str(path), f"not UTF-8 text (byte {err.start})")


class _Bad(Exception):
    pass


def _read_pdf(path: Path) -> Paper:
    from pypdf import PdfReader  # lazy: loads pypdf (start-up time)
    from pypdf.errors import PdfReadError  # lazy: loads pypdf (start-up time)

    try:
        reader = PdfReader(str(path))
        text = "\n".join((page.extract_text() or "") for page in reader.pages)
    except (PdfReadError, ValueError, KeyError, OSError) as err:
        raise _Bad(f"unreadable PDF ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    if len(text.split()) < 30:
        raise _Bad("PDF has no extractable text (scanned images?)")
    meta_title = (reader.metadata.title if reader.metadata else None) or ""
    return _read_text(text, str(path), title_hint=meta_title.strip())


_ABSTRACT = re.compile(r"^\s*#*\s*abstract\s*[:.]?\s*$", re.IGNORECASE | re.MULTILINE)
_HEADING = re.compile(r"^\s*(#{1,6}\s+.+|(?:\d+(?:\.\d+)*\.?|[IVX]+\.)\s+[A-Z][^\n]{0,80})\s*$", re.MULTILINE)


def _read_text(text: str, source: str, title_hint: str = "") -> Paper:
    lines = [ln.strip() for ln in text.splitlines()]
    nonempty = [ln for ln in lines if ln]
    if not nonempty:
        raise _Bad("empty file")
    title = title_hint or nonempty[0].lstrip("#").strip()
    m = _ABSTRACT.search(text)
    if m:
        rest = text[m.end():]
        nxt = _HEADING.search(rest)
        abstract = rest[: nxt.start()] if nxt else rest[:2000]
        body = rest[nxt.start():] if nxt else rest[2000:]
    else:
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
        if len(paragraphs) > 1 and paragraphs[0].lstrip("#").strip() == title:
            paragraphs = paragraphs[1:]
        abstract = paragraphs[0] if paragraphs else ""
        body = "\n\n".join(paragraphs[1:])
    abstract = " ".join(abstract.split())
    if len(abstract.split()) < 5:
        raise _Bad("no abstract found (expected an 'Abstract' heading or a first paragraph)")
    return Paper(title=title[:300], abstract=abstract, body=body.strip(), source=source)


def _paper_from_record(record: Any, where: str, source: str, line: int | None = None) -> Paper:
    if not isinstance(record, dict):
        raise _Bad(f"{where}: expected an object with 'title' and 'abstract'")
    for key in ("title", "abstract"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise _Bad(f"{where}: missing '{key}'")
    ideas = record.get("ideas") or []
    if not isinstance(ideas, list) or not all(isinstance(i, dict) and isinstance(i.get("text"), str)
                                               for i in ideas):
        raise _Bad(f"{where}: 'ideas' must be a list of objects with 'text'")
    year = record.get("year")
    return Paper(title=record["title"].strip(), abstract=" ".join(record["abstract"].split()),
                 body=str(record.get("body") or ""), year=int(year) if isinstance(year, int) else None,
                 venue=str(record.get("venue") or ""), ideas=ideas, source=source, line=line)


def _read_jsonl(path: Path, label: str) -> Iterator[Paper | BadFile]:
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            yield _paper_from_record(json.loads(line), where, label, n)
        except json.JSONDecodeError as err:
            yield BadFile(where, f"corrupt JSON line: {err.msg} at col {err.colno}")
        except _Bad as err:
            yield BadFile(where, str(err).removeprefix(where + ": "))


def _read_json(path: Path) -> Paper | IdeaList | ExperienceFile:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise _Bad(f"corrupt JSON at line {err.lineno} col {err.colno}: {err.msg}") from None
    if isinstance(data, list) and data and all(isinstance(d, dict) and "inspiration" in d for d in data):
        ideas = []
        for i, d in enumerate(data):
            if not isinstance(d["inspiration"], str) or not d["inspiration"].strip():
                raise _Bad(f"item {i}: 'inspiration' must be non-empty text")
            ideas.append({"text": d["inspiration"].strip(), "paper_id": str(d.get("paper_id", "")),
                          "id": d.get("id")})
        return IdeaList(ideas, str(path))
    if isinstance(data, dict) and "title" not in data and data and all(
            isinstance(v, (dict, list)) for v in data.values()):
        return ExperienceFile(str(path))
    if isinstance(data, dict):
        return _paper_from_record(data, str(path), str(path))
    raise _Bad("expected a paper object, a list of {'inspiration': ...} ideas or a NADER experience file")
