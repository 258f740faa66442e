"""Text from untrusted places (a sandbox child, a model file, an LLM reply) made safe to show.

A string a model's code wrote can hold terminal escapes (ANSI colours, cursor moves, OSC
title and clipboard sequences) or a line break that prints a second, fake line ("model.py:
valid model ..."); once on a console, in a log, a prompt or a kept verdict, it rewrites what
a person reads. So such text is escaped where it enters: C0 and C1 control characters and
DEL become `\\xNN`, and the Unicode line and paragraph separators (line breaks to
`str.splitlines` and many viewers) `\\u2028`/`\\u2029`; newlines stay only where a field
holds several lines (a traceback).
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(match: re.Match[str]) -> str:
    char = ord(match.group())
    return f"\\x{char:02x}" if char < 0x100 else f"\\u{char:04x}"


def printable(text: str, lines: bool = False) -> str:
    """`text` with its control characters escaped; `lines`: newlines kept (a multi-line field)."""
    return (_CONTROL_BUT_NEWLINE if lines else _CONTROL).sub(_escape, text)


def clipped(text: str, n: int) -> str:
    """`text` in at most `n` characters, an ellipsis marking a cut (a table cell, a quoted name)."""
    return text if len(text) <= n else text[: n - 1] + "…"
