"""Prompt templates are files beside the code that sends them (the knowledge agents' in
`nas/knowledge/prompts/`, each LLM method's in `nas/agents/<method>/prompts/`), versioned, and
part of the LLM cache key (by name, version and content, not by path: moving a file keeps its
key), so editing a prompt never replays a stale reply.

File format: a header block, then `[system]` and `[user]` sections; fields are
`{{name}}` (JSON examples keep their single braces)::

    ---
    name: reader_filter
    version: 1
    role: reader
    ---
    [system]
    ...
    [user]
    Title: {{title}}
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from nas.core.registry import check_keys
from nas.errors import ConfigError

_FIELD = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_SECTION = re.compile(r"^\[(system|user)\]\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Prompt:
    name: str
    version: int
    role: str
    system: str
    user: str
    digest: str

    @property
    def template_id(self) -> str:
        """`name@version:digest` — the version says intent, the digest catches unbumped edits."""
        return f"{self.name}@{self.version}:{self.digest}"

    def fields(self) -> set[str]:
        return set(_FIELD.findall(self.system)) | set(_FIELD.findall(self.user))

    def render(self, **values: object) -> list[dict[str, str]]:
        missing = sorted(self.fields() - set(values))
        if missing:
            raise ConfigError(f"prompt {self.name}: no value for field '{missing[0]}'")
        check_keys(f"prompt {self.name}", values, sorted(self.fields()), what="field")

        def fill(text: str) -> str:
            return _FIELD.sub(lambda m: str(values[m.group(1)]), text)

        messages = [{"role": "system", "content": fill(self.system)}] if self.system else []
        return messages + [{"role": "user", "content": fill(self.user)}]


def parse_prompt(text: str, where: str) -> Prompt:
    if not text.startswith("---\n"):
        raise ConfigError(f"{where}: a prompt file starts with a '---' header")
    head, sep, body = text[4:].partition("\n---\n")
    if not sep:
        raise ConfigError(f"{where}: the '---' header is not closed")
    meta: dict[str, str] = {}
    for n, line in enumerate(head.splitlines(), start=2):
        key, colon, value = line.partition(":")
        if not colon:
            raise ConfigError(f"{where}:{n}: header line needs 'key: value'")
        meta[key.strip()] = value.strip()
    for key in ("name", "version", "role"):
        if key not in meta:
            raise ConfigError(f"{where}: header has no '{key}'")
    parts = _SECTION.split(body)
    sections = {parts[i]: parts[i + 1].strip("\n") for i in range(1, len(parts) - 1, 2)}
    if "user" not in sections:
        raise ConfigError(f"{where}: no [user] section")
    try:
        version = int(meta["version"])
    except ValueError:
        raise ConfigError(f"{where}: version must be an integer, got {meta['version']!r}") from None
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return Prompt(meta["name"], version, meta["role"], sections.get("system", ""), sections["user"], digest)


@cache
def load_prompt(name: str) -> Prompt:
    """A packaged prompt by name, or a path to a user's prompt file."""
    if name.endswith(".md") and Path(name).is_file():
        return parse_prompt(Path(name).read_text(encoding="utf-8"), name)
    files = packaged_prompts()
    if name not in files:
        raise ConfigError(f"unknown prompt '{name}' (valid: {', '.join(sorted(files))})")
    where, file = files[name]
    return parse_prompt(file.read_text(encoding="utf-8"), where)


@cache
def packaged_prompts() -> dict[str, tuple[str, Traversable]]:
    """name -> (where, file) for the knowledge agents' prompts and every LLM method's."""
    root = resources.files("nas")
    folders = [("nas/knowledge/prompts", root / "knowledge" / "prompts")]
    folders += [(f"nas/agents/{d.name}/prompts", d / "prompts") for d in sorted(
        (root / "agents").iterdir(), key=lambda d: d.name) if (d / "prompts").is_dir()]
    return {f.name[:-3]: (f"{where}/{f.name}", f) for where, folder in folders for f in folder.iterdir()
            if f.name.endswith(".md")}
