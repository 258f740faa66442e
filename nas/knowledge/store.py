"""Qdrant-backed memory of the agents: design ideas and the papers they came
from (KnowledgeStore), and lessons from failed or degraded designs
(ExperienceStore).

Local mode (a folder, default `$NASFLOW_HOME/knowledge/qdrant`) needs no
server but admits one client per folder, across processes too: a store opens
the folder for a read or write and closes it a second after the last (`using`),
so a long search never keeps `nas knowledge search` out; a process that finds it
held waits, then names the holder (the holder file beside the folder).
Many concurrent writers should share a Qdrant server (`knowledge.url=http://...`)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
import time
import uuid
import warnings
import weakref
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException
from threadpoolctl import ThreadpoolController

from nas.errors import NasError
from nas.home import home
from nas.io import atomic_write_json
from nas.knowledge.embed import Embedder, default_embedder
from nas.knowledge.idea import Idea, normalise
from nas.terminal import clipped, printable

FILTER_KEYS = ("target", "granularity", "main", "sub", "source")
_PAGE = 256
_NS = uuid.UUID("0c9e4b7a-3d2f-4e61-8a5b-7f1d2c3b4a50")  # paper and experience point ids
LOCK_WAIT_S = 30.0  # another process's uses take a second or two; a longer hold is a pinned client
# Opening a folder loads every point (~1.4 s for 5,400 ideas on 2 busy cores): a burst of calls
# (a scroll's pages, a retrieval then a write) shares one opening, closed this long after the last.
IDLE_S = 1.0

_clients: dict[str, QdrantClient] = {}  # pinned by open_client, or open for the current burst of uses
_transient: set[str] = set()            # the keys of the latter: closed when idle
_idle: dict[str, threading.Timer] = {}  # the pending close of each transient client
_clients_lock = threading.Lock()
# Local mode is not thread-safe (numpy arrays grow in place on upsert), and Prefect may run
# agents in worker threads: one lock per folder (or given client) serialises its uses.
_key_locks: dict[str, threading.RLock] = {}
_call_locks: weakref.WeakKeyDictionary[QdrantClient, threading.RLock] = weakref.WeakKeyDictionary()


def default_path() -> Path:
    return home() / "knowledge" / "qdrant"


def _key(path: Path | None, url: str | None) -> str:
    return url if url else str(Path(path or default_path()).expanduser().resolve())


def _key_lock(key: str) -> threading.RLock:
    with _clients_lock:
        return _key_locks.setdefault(key, threading.RLock())


def open_client(path: Path | None = None, url: str | None = None) -> QdrantClient:
    """The process's pinned client for a local folder (or a server URL), opened once so that
    every store in the process shares it; a folder's lock is then held until `close_client`."""
    key = _key(path, url)
    with _key_lock(key):
        _keep(key)
        _transient.discard(key)
        client = _clients.get(key)
        if client is None:
            # No version check: on a server that does not answer it warns (from a thread) before our one line.
            client = QdrantClient(url=url, check_compatibility=False) if url else _open_local(Path(key))
            _clients[key] = client
        return client


@contextmanager
def using(path: Path | None = None, url: str | None = None) -> Iterator[QdrantClient]:
    """The client for one read or write: the pinned one if any (always, for a server), else
    the local folder, opened if it is not and closed IDLE_S after the last use, so that its
    lock is held only around uses."""
    if url:
        yield open_client(url=url)
        return
    key = _key(path, None)
    with _key_lock(key):  # re-entrant: a use nested in this thread's finds the client open
        _keep(key)
        if key not in _clients:
            _clients[key] = _open_local(Path(key))
            _transient.add(key)
        try:
            yield _clients[key]
        finally:
            if key in _transient:
                _close_later(key)


def _keep(key: str) -> None:
    """Cancel a pending close (the caller holds the key's lock)."""
    timer = _idle.pop(key, None)
    if timer is not None:
        timer.cancel()


def _close_later(key: str) -> None:
    _keep(key)
    if IDLE_S <= 0:
        _close_transient(key)
        return
    timer = threading.Timer(IDLE_S, _close_idle, args=(key,))
    timer.daemon = True
    _idle[key] = timer
    timer.start()


def _close_idle(key: str) -> None:
    with _key_lock(key):
        if _idle.get(key) is threading.current_thread():  # not cancelled nor replaced meanwhile
            del _idle[key]
            _close_transient(key)


def _close_transient(key: str) -> None:
    _transient.discard(key)
    _release(Path(key), _clients.pop(key))


def holder_file(path: Path) -> Path:
    """Beside the folder, not in it: who holds the folder now (pid and command line)."""
    return path.with_name(path.name + ".holder.json")


def _open_local(path: Path) -> QdrantClient:
    """Open the folder, waiting up to LOCK_WAIT_S for another process's use to end;
    then record this process as its holder."""
    path.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + LOCK_WAIT_S
    pause = 0.01
    while True:
        try:
            client = QdrantClient(path=str(path))
            break
        except RuntimeError as err:
            if "already accessed by another instance" not in str(err):
                raise
            if time.monotonic() >= deadline:
                raise NasError(f"knowledge store {path} is held by {_holder(path)} (Qdrant local mode allows "
                               "one process at a time); stop it, or run a Qdrant server and set "
                               "knowledge.url=http://localhost:6333") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.25)
    atomic_write_json(holder_file(path), {"pid": os.getpid(), "command": " ".join(sys.argv)})
    return client


def _holder(path: Path) -> str:
    """The holder file's pid and command, or why they are unknown."""
    try:
        info = json.loads(holder_file(path).read_text(encoding="utf-8"))
        return f"pid {int(info['pid'])} ({printable(str(info['command'])[:200])})"  # anyone may write the file
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it wrote no holder file)"


def _release(path: Path, client: QdrantClient) -> None:
    """Remove this process's holder file, then let the folder go."""
    try:
        if json.loads(holder_file(path).read_text(encoding="utf-8")).get("pid") == os.getpid():
            holder_file(path).unlink()
    except (OSError, ValueError, AttributeError):
        pass
    client.close()


def close_client(path: Path | None = None, url: str | None = None) -> None:
    """Release the folder's client now, pinned or idle (and its lock), or a server's."""
    key = _key(path, url)
    with _key_lock(key):
        _keep(key)
        _transient.discard(key)
        client = _clients.pop(key, None)
        if client is not None:
            _release(Path(key), client) if not url else client.close()


@atexit.register
def _close_all() -> None:
    # A local client left to __del__ at interpreter shutdown prints an ImportError traceback.
    for key in list(_clients):
        close_client(url=key) if "://" in key else close_client(Path(key))


@functools.cache
def _blas() -> ThreadpoolController:
    return ThreadpoolController()


def _filter(**values: str | None) -> models.Filter | None:
    unknown = set(values) - set(FILTER_KEYS)
    if unknown:
        raise NasError(f"unknown knowledge filter {sorted(unknown)}; use {', '.join(FILTER_KEYS)}")
    must: list[models.Condition] = [
        models.FieldCondition(key=k, match=models.MatchValue(value=v))
        for k, v in values.items() if v is not None]
    return models.Filter(must=must) if must else None


class _Collections:
    """Collections created on demand; reads of a missing collection are empty,
    so read-only commands never need the embedding model."""

    def __init__(self, client: QdrantClient | None, path: Path | None, url: str | None,
                 embedder: Embedder | None, prefix: str) -> None:
        self._client = client
        self.path = path
        self.url = url
        self._embedder = embedder
        self.prefix = prefix
        if client is not None:
            with _clients_lock:
                self._lock = _call_locks.setdefault(client, threading.RLock())

    @property
    def client(self) -> QdrantClient:
        """The given client, else the process's pinned one (`open_client`: it keeps a local folder)."""
        return self._client if self._client is not None else open_client(self.path, self.url)

    @contextmanager
    def _call(self) -> Iterator[QdrantClient]:
        """The client for one call, serialised, with BLAS on one thread: local mode
        searches by numpy brute force, and right after an embedding torch's
        OpenMP workers are still spinning and fight OpenBLAS's for the cores
        (5,411 ideas, 2 cores: search p95 115 ms -> 16 ms)."""

        with self._use() as client, _blas().limit(limits=1, user_api="blas"):
            try:
                yield client
            except ResponseHandlingException as err:  # a server that does not answer (refused, timed out)
                raise NasError(f"knowledge server {self.url}: no answer ({err}); start it, or leave knowledge.url "
                               "unset for the local store") from None

    @contextmanager
    def _use(self) -> Iterator[QdrantClient]:
        if self._client is None:
            with using(self.path, self.url) as client:
                yield client
        else:
            with self._lock:
                yield self._client

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = default_embedder()
        return self._embedder

    def _exists(self, name: str) -> bool:
        with self._call() as client:
            return client.collection_exists(name)

    def _ensure(self, name: str, indexed: Sequence[str] = ()) -> None:
        dim = self.embedder.dim  # the model loads (seconds) before the store is held
        with self._call() as client:
            if client.collection_exists(name):
                size = client.get_collection(name).config.params.vectors.size  # type: ignore[union-attr]
                if size != dim:
                    raise NasError(f"collection {name} holds {size}-d vectors but the embedder makes "
                                   f"{dim}-d ones; use another knowledge prefix")
                return
            client.create_collection(name, vectors_config=models.VectorParams(
                size=dim, distance=models.Distance.COSINE))
            with warnings.catch_warnings():  # local mode: "payload indexes have no effect"
                warnings.simplefilter("ignore", UserWarning)
                for key in indexed:
                    client.create_payload_index(name, key, models.PayloadSchemaType.KEYWORD)

    def _drop(self, *names: str) -> None:
        with self._call() as client:
            for name in names:
                if client.collection_exists(name):
                    client.delete_collection(name)

    def _count(self, name: str, flt: models.Filter | None = None) -> int:
        with self._call() as client:
            return client.count(name, count_filter=flt, exact=True).count if client.collection_exists(name) else 0

    def _scroll(self, name: str, flt: models.Filter | None = None, limit: int | None = None,
                fields: Sequence[str] | bool = True) -> Iterator[dict[str, Any]]:
        """Payloads of all matching points, page by page (the store is held for each page, not between)."""
        offset = None
        left = limit
        while left is None or left > 0:
            page = _PAGE if left is None else min(_PAGE, left)
            with self._call() as client:
                if not client.collection_exists(name):
                    return
                points, offset = client.scroll(
                    name, scroll_filter=flt, limit=page, offset=offset,
                    with_payload=list(fields) if not isinstance(fields, bool) else fields,
                    with_vectors=False)
            for p in points:
                yield p.payload or {}
            if left is not None:
                left -= len(points)
            if offset is None:
                return

    def _query(self, name: str, vec: np.ndarray | Sequence[float], k: int,
               flt: models.Filter | None = None) -> list[models.ScoredPoint]:
        with self._call() as client:
            if not client.collection_exists(name):
                return []
            return client.query_points(
                name, query=np.asarray(vec, dtype=np.float32).tolist(), limit=k,
                query_filter=flt, with_payload=True).points

    def _upsert(self, name: str, ids: list[str], vecs: np.ndarray,
                payloads: list[dict[str, Any]]) -> None:
        points = [models.PointStruct(id=i, vector=v.tolist(), payload=p)
                  for i, v, p in zip(ids, vecs, payloads)]
        with self._call() as client:
            client.upsert(name, points=points, wait=True)


@dataclass
class Hit:
    idea: Idea
    score: float


@dataclass
class AddReport:
    added: int = 0
    duplicates: int = 0
    duplicate_of: list[tuple[str, str]] = field(default_factory=list)  # (new text, kept text)


class KnowledgeStore(_Collections):
    """Ideas (tagged or not) and the papers they were read from."""

    def __init__(self, client: QdrantClient | None = None, *, path: Path | None = None,
                 url: str | None = None, embedder: Embedder | None = None,
                 prefix: str = "nasflow_") -> None:
        super().__init__(client, path, url, embedder, prefix)
        self.ideas_collection = f"{prefix}ideas"
        self.papers_collection = f"{prefix}papers"

    # -- ideas -------------------------------------------------------------

    def add_ideas(self, ideas: list[Idea], dedup_threshold: float = 0.95, batch_size: int = 256,
                  vectors: np.ndarray | None = None) -> AddReport:
        """Store ideas, skipping any whose text is (near-)identical, cosine >=
        `dedup_threshold`, to one stored or earlier in `ideas`. `vectors`
        (one row per idea) skips the embedding, for benchmarks."""
        if vectors is not None and len(vectors) != len(ideas):
            raise ValueError(f"{len(vectors)} vectors for {len(ideas)} ideas")
        report = AddReport()
        if not ideas:
            return report
        self._ensure(self.ideas_collection, FILTER_KEYS)
        for start in range(0, len(ideas), batch_size):
            chunk = ideas[start:start + batch_size]
            vecs = (self.embedder.encode([i.vector_text() for i in chunk]) if vectors is None
                    else np.asarray(vectors[start:start + batch_size], dtype=np.float32))
            keep = self._novel(chunk, vecs, dedup_threshold, report)
            if keep:
                self._upsert(self.ideas_collection, [chunk[j].id for j in keep], vecs[keep],
                             [chunk[j].payload() for j in keep])
                report.added += len(keep)
        return report

    def _novel(self, chunk: list[Idea], vecs: np.ndarray, threshold: float,
               report: AddReport) -> list[int]:
        """Indices of `chunk` to store; the others are recorded in `report`.
        Earlier chunks are already stored, so the store query covers them."""
        with self._call() as client:
            stored = {str(p.id): (p.payload or {}).get("text", "") for p in client.retrieve(
                self.ideas_collection, ids=[i.id for i in chunk], with_payload=["text"])}
            nearest = client.query_batch_points(self.ideas_collection, [
                models.QueryRequest(query=v.tolist(), limit=1, score_threshold=threshold,
                                    with_payload=["text"]) for v in vecs])
        keep: list[int] = []
        kept_ids: dict[str, int] = {}
        for j, idea in enumerate(chunk):
            twin: str | None = stored.get(idea.id)
            if twin is None and idea.id in kept_ids:
                twin = chunk[kept_ids[idea.id]].text
            if twin is None and nearest[j].points:
                twin = (nearest[j].points[0].payload or {}).get("text", "")
            if twin is None and keep:
                sims = vecs[keep] @ vecs[j]
                best = int(np.argmax(sims))
                if sims[best] >= threshold:
                    twin = chunk[keep[best]].text
            if twin is None:
                kept_ids[idea.id] = j
                keep.append(j)
            else:
                report.duplicates += 1
                report.duplicate_of.append((idea.text, twin))
        return keep

    def search(self, query: str, k: int = 5, *, target: str | None = None,
               granularity: str | None = None, main: str | None = None, sub: str | None = None,
               source: str | None = None) -> list[Hit]:
        """The k ideas nearest to `query` among those matching every given tag value."""
        if not self._exists(self.ideas_collection):
            return []
        vec = self.embedder.encode([query])[0]
        return self.search_vector(vec, k, target=target, granularity=granularity, main=main,
                                  sub=sub, source=source)

    def search_vector(self, vec: np.ndarray | Sequence[float], k: int = 5,
                      **filters: str | None) -> list[Hit]:
        points = self._query(self.ideas_collection, vec, k, _filter(**filters))
        return [Hit(Idea.from_payload(p.payload or {}), float(p.score)) for p in points]

    def ideas(self, limit: int | None = None, **filters: str | None) -> list[Idea]:
        return [Idea.from_payload(p) for p in
                self._scroll(self.ideas_collection, _filter(**filters), limit)]

    def count(self, **filters: str | None) -> int:
        return self._count(self.ideas_collection, _filter(**filters))

    def category_counts(self) -> dict[str, dict[str, int]]:
        """{main: {sub: n}}; untagged ideas count under main "" (sub "")."""
        out: dict[str, dict[str, int]] = {}
        for p in self._scroll(self.ideas_collection, fields=["main", "sub"]):
            subs = out.setdefault(p.get("main", ""), {})
            subs[p.get("sub", "")] = subs.get(p.get("sub", ""), 0) + 1
        return out

    def tag_counts(self) -> dict[str, dict[str, int]]:
        """Ideas per value of each tag field ("" = untagged), e.g. {"target": {"efficiency": 12}}."""
        counts: dict[str, Counter[str]] = {k: Counter() for k in FILTER_KEYS}
        for p in self._scroll(self.ideas_collection, fields=list(FILTER_KEYS)):
            for k in FILTER_KEYS:
                counts[k][p.get(k, "")] += 1
        return {k: dict(c.most_common()) for k, c in counts.items()}

    # -- papers ------------------------------------------------------------

    @staticmethod
    def paper_id(paper_hash: str) -> str:
        return str(uuid.uuid5(_NS, f"paper:{paper_hash}"))

    def has_paper(self, paper_hash: str) -> bool:
        with self._call() as client:
            return client.collection_exists(self.papers_collection) and bool(client.retrieve(
                self.papers_collection, ids=[self.paper_id(paper_hash)], with_payload=False))

    def add_paper(self, paper_hash: str, title: str, payload: dict[str, Any],
                  vector_text: str) -> None:
        """Record a read paper (so it is not read twice); `vector_text` is its title and abstract."""
        self._ensure(self.papers_collection)
        vec = self.embedder.encode([vector_text])
        self._upsert(self.papers_collection, [self.paper_id(paper_hash)], vec,
                     [{**payload, "hash": paper_hash, "title": title}])

    def papers(self) -> list[dict[str, Any]]:
        return list(self._scroll(self.papers_collection))

    def count_papers(self) -> int:
        return self._count(self.papers_collection)

    def clear(self) -> None:
        self._drop(self.ideas_collection, self.papers_collection)


# -- experiences ---------------------------------------------------------------

EXPERIENCE_KINDS = ("tip", "suggestion")


@dataclass
class Experience:
    """A lesson: a "tip" learnt from a failed build, a "suggestion" from a degradation."""

    text: str
    kind: str
    error: str = ""
    idea: str = ""
    context: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    @property
    def id(self) -> str:
        return str(uuid.uuid5(_NS, f"{self.kind}:{normalise(self.text)}"))

    def matched_text(self) -> str:
        """What retrieval compares the query with: the situation and the lesson."""
        return "\n".join(p for p in (self.error, self.idea, self.text) if p)


class ExperienceStore(_Collections):
    def __init__(self, client: QdrantClient | None = None, *, path: Path | None = None,
                 url: str | None = None, embedder: Embedder | None = None,
                 prefix: str = "nasflow_") -> None:
        super().__init__(client, path, url, embedder, prefix)
        self.collection = f"{prefix}experiences"

    def add(self, exp: Experience) -> str:
        return self.add_many([exp])[0]

    def add_many(self, exps: list[Experience], batch_size: int = 256) -> list[str]:
        """Store experiences; one with the kind and text of a stored one replaces it."""
        for exp in exps:
            if exp.kind not in EXPERIENCE_KINDS:
                raise NasError(f"experience kind {exp.kind!r} is not one of {EXPERIENCE_KINDS}")
        if exps:
            self._ensure(self.collection, ("kind", "source"))
        for start in range(0, len(exps), batch_size):
            chunk = exps[start:start + batch_size]
            vecs = self.embedder.encode([e.matched_text() for e in chunk])
            self._upsert(self.collection, [e.id for e in chunk], vecs, [asdict(e) for e in chunk])
        return [e.id for e in exps]

    def retrieve(self, query: str, k: int = 5, kind: str | None = None) -> list[tuple[Experience, float]]:
        if not self._exists(self.collection):
            return []
        flt = (models.Filter(must=[models.FieldCondition(key="kind", match=models.MatchValue(value=kind))])
               if kind else None)
        points = self._query(self.collection, self.embedder.encode([query])[0], k, flt)
        return [(Experience(**(p.payload or {})), float(p.score)) for p in points]

    def count(self) -> int:
        return self._count(self.collection)

    def all(self) -> list[Experience]:
        return [Experience(**p) for p in self._scroll(self.collection)]

    def clear(self) -> None:
        self._drop(self.collection)


def import_nader_experiences(path: Path | str) -> list[Experience]:
    """Read a NADER experience file. Two layouts exist: the developer's
    {name: {"inspiration": str, "base"|"stem"|"downsample": [{"error", "experience"}]}}
    gives tips; the researcher's {inspiration: [suggestion, ...]} gives suggestions."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NasError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise NasError(f"{path}: not a JSON file ({err})") from None
    if not isinstance(data, dict):
        raise NasError(f"{path}: expected an object of entries, got {type(data).__name__}")
    out: list[Experience] = []
    for name, entry in data.items():
        where = f"{path}: entry {clipped(name, 60)!r}"
        if isinstance(entry, dict):
            out.extend(_nader_tips(where, name, entry))
        elif isinstance(entry, list):
            for i, text in enumerate(entry):
                if not isinstance(text, str) or not text.strip():
                    raise NasError(f"{where}[{i}]: expected a non-empty string")
                out.append(Experience(text=text, kind="suggestion", idea=name, source="nader"))
        else:
            raise NasError(f"{where}: expected an object or a list, got {type(entry).__name__}")
    return out


def _nader_tips(where: str, name: str, entry: dict[str, Any]) -> Iterator[Experience]:
    inspiration = entry.get("inspiration", "")
    if not isinstance(inspiration, str):
        raise NasError(f"{where}.inspiration: expected a string")
    for section, items in entry.items():
        if section == "inspiration":
            continue
        if not isinstance(items, list):
            raise NasError(f"{where}.{section}: expected a list of {{error, experience}}")
        for i, item in enumerate(items):
            at = f"{where}.{section}[{i}]"
            if not isinstance(item, dict):
                raise NasError(f"{at}: expected an object with 'error' and 'experience'")
            text, error = item.get("experience"), item.get("error", "")
            if text is None:
                raise NasError(f"{at}: missing 'experience'")
            if not isinstance(text, str) or not text.strip() or not isinstance(error, str):
                raise NasError(f"{at}: 'experience' and 'error' must be strings, 'experience' non-empty")
            yield Experience(text=text, kind="tip", error=error, idea=inspiration,
                             context={"section": section, "name": name}, source="nader")


