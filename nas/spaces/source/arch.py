"""FairNAD's representation: a whole PyTorch model file defining `Network(num_classes)`.

The text is untrusted. This process only parses it (`ast.parse` runs nothing):
the key comes from the syntax tree without docstrings, so reformatting,
comments and docstring edits do not make a "new" architecture. Building and
training happen in the sandbox (`nas.sandbox`), never here.
"""

from __future__ import annotations

import ast
import hashlib
from typing import Any, ClassVar

from nas.core.arch import Architecture
from nas.errors import EncodingError

MAX_SOURCE = 1 << 20  # the sandbox's limit too


class SourceArch(Architecture):
    space: ClassVar[str] = "source"

    def __init__(self, source: str, filename: str = "model.py"):
        if not isinstance(source, str):
            raise EncodingError(f"{filename}: model source must be text, not {type(source).__name__}")
        if len(source.encode("utf-8", "replace")) > MAX_SOURCE:
            raise EncodingError(f"{filename}: model source is over {MAX_SOURCE >> 20} MB")
        self.source, self.filename = source, filename
        self._canonical: str | None = None
        # The graph hash of the verdict a design check kept (`Verdict.graph`): training refuses any other graph.
        self.checked: str | None = None

    def canonical(self) -> str:
        if self._canonical is None:
            try:
                tree = ast.parse(self.source, self.filename)
            except SyntaxError as err:
                raise EncodingError(f"{self.filename}:{err.lineno}: {err.msg}") from None
            except (ValueError, RecursionError, MemoryError) as err:
                raise EncodingError(f"{self.filename}: cannot parse ({type(err).__name__}: {err})") from None
            for node in ast.walk(tree):
                body = getattr(node, "body", None)
                if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                        and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                    node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]  # an ast.AST with a body
            self._canonical = ast.dump(tree, annotate_fields=False)
        return self._canonical

    def encode(self) -> str:
        return self.source

    @classmethod
    def decode(cls, data: Any) -> "SourceArch":
        return cls(data)

    def __repr__(self) -> str:
        digest = hashlib.sha256(self.source.encode("utf-8", "replace")).hexdigest()[:8]
        return f"SourceArch({self.filename}, {len(self.source.splitlines())} lines, sha256 {digest})"
