"""Tolerant reply parsing for endpoints without constrained decoding: tags,
code fences, JSON somewhere in prose. Every failure is a `ParseError` whose one
line says what was expected and shows the start of what came back."""

from __future__ import annotations

import json
import re
from typing import Any

from nas.errors import NasError


class ParseError(NasError):
    """A reply could not be read as the structure the caller asked for."""


def snippet(text: str, n: int = 60) -> str:
    flat = " ".join(text.split())
    return repr(flat[:n] + ("..." if len(flat) > n else ""))


def find_tagged(text: str, tag: str) -> str | None:
    """Inside the last `<tag>...</tag>` (an unclosed tag runs to the end), or None."""
    m = list(re.finditer(rf"<{re.escape(tag)}>(.*?)(?:</{re.escape(tag)}>|$)", text, re.DOTALL | re.IGNORECASE))
    return m[-1].group(1) if m else None


def extract_tagged(text: str, tag: str) -> str:
    """The answer inside `<tag>...</tag>`, or after the last `##tag##` marker."""
    inner = find_tagged(text, tag)
    if inner is not None:
        return inner.strip()
    marker = f"##{tag}##"
    if marker in text:
        return text.rsplit(marker, 1)[1].strip()
    raise ParseError(f"no '{marker}' or <{tag}> in reply {snippet(text)}")


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def fences(text: str) -> list[tuple[str, str]]:
    """(lower-cased label, body) of every code fence; an unclosed one runs to the end."""
    return [(label.lower(), body) for label, body in _FENCE.findall(text)]


def extract_code(text: str, lang: str = "python") -> str:
    """The longest fenced block in `lang` (or unlabelled); bare code if there is no fence."""
    usable = [body for label, body in fences(text) if label in ("", lang, "py" if lang == "python" else lang)]
    if usable:
        return max(usable, key=len).strip("\n") + "\n"
    stripped = text.strip()
    if lang == "python" and re.match(r"(import |from |class |def |#)", stripped):
        return stripped + "\n"
    raise ParseError(f"no ```{lang} code block in reply {snippet(text)}")


def extract_json(text: str) -> Any:
    """A JSON value: the whole reply, a ```json fence, or the first balanced object/array."""
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    for label, body in fences(text):
        if label in ("json", ""):
            try:
                return json.loads(body)
            except json.JSONDecodeError:
                continue
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        raise ParseError(f"no JSON object in reply {snippet(text)}")
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
        return value
    except json.JSONDecodeError as err:
        raise ParseError(f"invalid JSON at char {start + err.pos}: {err.msg} in reply {snippet(text)}") from None


_ITEM = re.compile(r"^\s*(?:[-*•]|\(?\d+[.)]|idea\s*\d+\s*[:.)-])\s*(.+?)\s*$", re.IGNORECASE)


def extract_list(text: str) -> list[str]:
    """Items of a numbered or bulleted list (one per line); plain lines if there are no markers."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    items = [m.group(1) for ln in lines if (m := _ITEM.match(ln))]
    if not items:
        items = [ln.strip() for ln in lines]
    if not items:
        raise ParseError(f"no list items in reply {snippet(text)}")
    return items
