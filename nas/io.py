"""Crash-safe file helpers: atomic replace for documents, torn-line-aware JSONL.
Every text and JSON writer scrubs secrets (`nas.secrets`) on the way out."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable

from nas.errors import InputError, OutputPathError, RunDirError
from nas.secrets import scrub, scrub_data


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc), as files made
    by mkstemp are 0600 whatever the umask: results are to be read by others, as `open` would."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def atomic_write_bytes(path: Path, data: bytes, sync_also: Path | None = None, sync: bool = True) -> None:
    """Write to a temp file in the same directory, fsync, then rename over `path` (with the
    mode `open` would give it: the umask's, not mkstemp's 0600). `sync_also`: a file written
    without its fsync (`append_jsonl(sync=False)`), fsynced at the same time as the temp file
    and so before the rename (`fsync_together`). `sync=False`: no fsync (a killed process still
    leaves the old file or the new one whole; a lost machine may not), and `sync_also` is ignored."""
    path = check_output(path)
    make_dir(path.parent)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise OutputPathError(f"{path}: cannot write ({err.strerror})") from None
    try:
        os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if sync and sync_also is not None:
                fsync_together(fh.fileno(), sync_also)
            elif sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def fsync_together(fd: int, other: Path) -> None:
    """fsync `fd` and the file at `other` at once, `other` from a second thread (an fsync waits
    for the disk without the GIL): the journal commits both in one go, in about the time of one
    (a search's trial appends its history line and replaces its state, 3-4 ms each here). Both
    are on disk when this returns; the first error is raised."""
    errors: list[OSError] = []

    def sync_other() -> None:
        try:
            other_fd = os.open(other, os.O_RDONLY)
            try:
                os.fsync(other_fd)
            finally:
                os.close(other_fd)
        except OSError as err:
            errors.append(err)

    thread = threading.Thread(target=sync_other, name="fsync", daemon=True)
    thread.start()
    try:
        os.fsync(fd)
    finally:
        thread.join()
    if errors:
        raise errors[0]


def check_output(path: Path, directory: bool = False) -> Path:
    """`path`, when it can be written as a file (or with `directory`, a directory): else an
    OutputPathError naming what is in the way. Creates nothing."""
    path = Path(path)
    if path.exists() and path.is_dir() != directory:
        raise OutputPathError(f"{path}: is a {'file' if directory else 'directory'}, "
                              f"expected {'a directory' if directory else 'a file path'}")
    blocker = next((p for p in path.parents if p.exists() or p.is_symlink()), None)
    if blocker is not None and not blocker.is_dir():
        raise OutputPathError(f"{blocker}: is a file, cannot hold {path}")
    return path


def make_dir(path: Path) -> Path:
    """Create the directory `path` (and its parents): a file in the way or a read-only
    parent is an OutputPathError naming the path."""
    path = check_output(path, directory=True)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"{path}: cannot create directory ({err.strerror})") from None
    return path


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, scrub(text).encode("utf-8"))


def atomic_write_json(path: Path, obj: Any, sync_also: Path | None = None, sync: bool = True) -> None:
    text = json.dumps(scrub_data(obj), indent=2, sort_keys=True, default=_json_default) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), sync_also, sync)


class KeyedFiles:
    """Records shared by runs and processes, one JSON file per key (`root/<2 chars>/<key>.json`),
    written atomically; read as untrusted, since anyone with the folder may have written one."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def read(self, key: str) -> tuple[Any, str | None]:
        """(the parsed file, None); (None, None) if there is none; (None, why) if it does not parse."""
        try:
            return json.loads(self.path(key).read_text(encoding="utf-8")), None
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError, RecursionError) as err:  # bad JSON, not UTF-8, nested too deep
            return None, (str(err).splitlines() or [type(err).__name__])[0][:120]

    def write(self, key: str, record: Any) -> None:
        atomic_write_json(self.path(key), record)


def read_input_text(path: Path) -> str:
    """A UTF-8 text file named on the command line, or one line saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RunDirError(f"{path}: corrupt JSON at line {err.lineno} col {err.colno}: {err.msg}") from None
    except UnicodeDecodeError as err:
        raise RunDirError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
    except RecursionError:
        raise RunDirError(f"{path}: JSON nested too deeply") from None


def read_json_object(path: Path) -> dict[str, Any]:
    """`read_json` for a file that must hold a JSON object (a summary, a manifest)."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: expected a JSON object, found {type(data).__name__} "
                          f"({json.dumps(data)[:40]})")
    return data


def dumps_line(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)


def append_jsonl(path: Path, records: Iterable[dict], sync: bool = True) -> None:
    """Append whole lines and fsync, so a kill leaves at most one torn last line. `sync=False`:
    no fsync here (what is written survives a killed process, not a lost machine): the caller's
    next `atomic_write_bytes(..., sync_also=path)` fsyncs it before its rename."""
    payload = "".join(dumps_line(scrub_data(r)) + "\n" for r in records)
    if not payload:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(payload)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())


def read_jsonl(path: Path, *, repair: bool = False, numbered: bool = False) -> list[dict]:
    """Read a JSONL file. A torn final line (no newline) and empty lines at the end are
    dropped, and with `repair` cut from the file (so an append cannot strand them between
    records); a corrupt line elsewhere is an error. Empty lines between records are skipped,
    or with `numbered` (a record's line is its number, as in history.jsonl) an error."""
    path = Path(path)
    if not path.exists():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    lines.pop()  # text after the last newline: empty unless torn
    records = []
    offset = end = 0  # end: the bytes up to the last record's newline
    blank = 0  # the first empty line since the last record
    for i, line in enumerate(lines, start=1):
        offset += len(line) + 1
        if not line.strip():
            blank = blank or i
            continue
        if blank and numbered:
            raise RunDirError(f"{path}:{blank}: empty line between records")
        blank, end = 0, offset
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise RunDirError(f"{path}:{i}: corrupt JSON line: {err.msg}") from None
        except UnicodeDecodeError as err:
            raise RunDirError(f"{path}:{i}: not UTF-8 text ({err.reason})") from None
        except RecursionError:
            raise RunDirError(f"{path}:{i}: JSON nested too deeply") from None
    if repair and end < len(raw):
        truncate_bytes(path, end)
    return records


def truncate_bytes(path: Path, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(size)
        fh.flush()
        os.fsync(fh.fileno())


def rewrite_jsonl(path: Path, records: list[dict]) -> None:
    atomic_write_bytes(path, "".join(dumps_line(scrub_data(r)) + "\n" for r in records).encode("utf-8"))


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
