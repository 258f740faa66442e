"""Text from untrusted places (a sandbox child, a model file, an LLM reply) made safe to show.

A string a model's code wrote can hold terminal escapes (ANSI colours, cursor moves, OSC
title and clipboard sequences), a line break that prints a second, fake line ("model.py:
valid model ..."), a bidi override or isolate that shows the line's end first, zero-width
characters that hide text, a lone surrogate that no encoder takes (printing it raises), or a
private-use character a font draws as anything. Once on a console, in a log, a prompt, a
report or a kept verdict, it rewrites what a person reads. So such text is escaped where it
enters: every character of the Unicode categories in `UNSAFE` (controls, format characters,
surrogates, private use, line and paragraph separators) becomes its Python escape (`\\xNN`,
`\\uNNNN`, `\\UNNNNNNNN`); newlines stay only where a field holds several lines (a traceback).
`safe_streams` makes printing the rest (any letter) on a terminal of any encoding never raise.
"""

from __future__ import annotations

import re
import sys
import unicodedata

# Cc: C0, DEL, C1 (escapes, carriage returns); Cf: bidi overrides and isolates, zero-width and
# joiner characters, the BOM, tags; Cs: lone surrogates; Co: private use; Zl, Zp: U+2028, U+2029.
UNSAFE = frozenset({"Cc", "Cf", "Cs", "Co", "Zl", "Zp"})
_SUSPECT = re.compile("[^\x20-\x7e]")  # all but printable ASCII: the few characters worth a look


def _spelled(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _spelled(char) if unicodedata.category(char) in UNSAFE else char


def _escape_but_newline(match: re.Match[str]) -> str:
    char = match.group()
    return char if char == "\n" else _escape(match)


def printable(text: str, lines: bool = False) -> str:
    """`text` with every character of the `UNSAFE` categories escaped; `lines`: newlines kept (a
    multi-line field). Escaping what is escaped already changes nothing."""
    if _SUSPECT.search(text) is None:
        return text
    return _SUSPECT.sub(_escape_but_newline if lines else _escape, text)


def clipped(text: str, n: int, *, tail: bool = False) -> str:
    """`text` in at most `n` characters, an ellipsis marking a cut (a table cell, a quoted name);
    `tail`: its end kept (a traceback, whose last line says what failed)."""
    if len(text) <= n:
        return text
    return "…" + text[len(text) - n + 1:] if tail else text[: n - 1] + "…"


def safe_streams() -> None:
    """Make stdout and stderr write what their encoding lacks as backslash escapes instead of
    raising (a latin-1 or ASCII terminal, `PYTHONIOENCODING=ascii`): the CLI's own prints, its
    logs and its progress bars all go through them."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # None: replaced by a non-text stream
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
