"""Prefect result records that cannot run code: written as plain JSON, and
checked without Prefect before Prefect may read one.

A record file names its own serializer, so choosing JSON for our tasks does not
protect the reader: a record rewritten by anyone who can write to the cache
(`$NASFLOW_HOME/cache`) could name pickle, or Prefect's JSON serializer with an
importable decoder, and Prefect would run it in the main process. So every
cached task read is gated: the file must be JSON, name `nasflow-json`, and
hold a payload of the task's shape; otherwise it is reported in one line,
removed, and the task runs again with `refresh_cache` (Prefect then never reads
the file)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect.serializers import Serializer
from prefect.settings import get_current_settings
from pydantic import Field

from nas.io import dumps_line
from nas.secrets import scrub_data

log = logging.getLogger(__name__)
SERIALIZER_TYPE = "nasflow-json"
# Fields of Prefect's ResultRecord and ResultRecordMetadata; anything else is not ours.
RECORD_KEYS = {"metadata", "result"}
METADATA_KEYS = {"storage_key", "expiration", "serializer", "prefect_version", "storage_block_id"}
Shape = Callable[[Any], "str | None"]  # the payload's problem, or None when it has the task's shape


class PlainJSONSerializer(Serializer):
    """JSON with no object hooks: a record decodes to dicts, lists and scalars, never objects."""

    type: str = Field(default=SERIALIZER_TYPE, frozen=True)

    def dumps(self, obj: Any) -> bytes:
        return dumps_line(scrub_data(obj)).encode("utf-8")

    def loads(self, blob: bytes) -> Any:
        return json.loads(blob)


SERIALIZER = PlainJSONSerializer()


def record_path(key: str) -> Path:
    """Where Prefect's default local result storage keeps the record of cache key `key`
    (its settings as Prefect resolved them, which is where it reads)."""
    return Path(get_current_settings().results.local_storage_path).expanduser() / key


def read_record(key: str, shape: Shape, what: str, redo: str) -> tuple[Any, bool]:
    """(payload, rejected) of the record for `key`: (payload, False) for a safe record,
    (None, False) when there is none, (None, True) when one was refused; a refused record
    is reported (`corrupt cache entry PATH for WHAT (why); REDO`) and removed."""
    path = record_path(key)
    problem: str | None
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, False
    except OSError as err:
        problem = f"unreadable: {err.strerror}"
    else:
        payload, problem = _payload(raw, shape)
        if problem is None:
            return payload, False
    log.warning("corrupt cache entry %s for %s (%s); %s", path, what, problem, redo)
    with contextlib.suppress(OSError):  # refresh_cache keeps Prefect from reading it anyway
        path.unlink()
    return None, True


def _payload(raw: bytes, shape: Shape) -> tuple[Any, str | None]:
    try:
        record = json.loads(raw)
    except (ValueError, RecursionError) as err:  # bad JSON, not UTF-8, nested too deep
        return None, f"not JSON: {(str(err).splitlines() or [type(err).__name__])[0][:120]}"
    if not isinstance(record, dict) or set(record) != RECORD_KEYS:
        return None, "not a result record"
    metadata, result = record["metadata"], record["result"]
    if not isinstance(metadata, dict) or not set(metadata) <= METADATA_KEYS:
        return None, "not a result record"
    serializer = metadata.get("serializer")
    if not isinstance(serializer, dict):
        return None, "no serializer named (Prefect would unpickle it); refusing to load it"
    if serializer.get("type") != SERIALIZER_TYPE:
        return None, f"serializer {str(serializer.get('type'))[:40]!r} is not {SERIALIZER_TYPE}; refusing to load it"
    if set(serializer) != {"type"}:
        return None, f"serializer options {', '.join(sorted(set(serializer) - {'type'}))[:60]} are not ours; " \
                     "refusing to load it"
    if not isinstance(result, str):
        return None, "payload is not JSON text"
    try:
        payload = json.loads(result)
    except (ValueError, RecursionError) as err:
        return None, f"payload is not JSON: {(str(err).splitlines() or [type(err).__name__])[0][:120]}"
    problem = shape(payload)
    return payload, (None if problem is None else f"unexpected payload: {problem}")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_fields(data: Any, checks: dict[str, Callable[[Any], bool]], *, exact: bool) -> str | None:
    """The first problem of a JSON object against per-field checks (all required;
    `exact`: no other fields)."""
    if not isinstance(data, dict):
        return f"expected an object, got {type(data).__name__}"
    missing = sorted(set(checks) - set(data))
    if missing:
        return f"missing {', '.join(missing)}"
    extra = sorted(set(data) - set(checks)) if exact else []
    if extra:
        return f"unknown field {extra[0][:40]!r}"
    for name, check in checks.items():
        if not check(data[name]):
            return f"bad {name}"
    return None
