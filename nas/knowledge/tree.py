"""FairNAD's attribute tree of model-design ideas (its Tables 9-10): the fixed
vocabulary the tagger files ideas under and the design agents sample from."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

from nas.core.registry import check_keys
from nas.errors import ConfigError
from nas.io import atomic_write_json
from nas.knowledge.idea import GRANULARITIES, TARGETS, Tag

FILE_NAME = "attribute_tree.json"
VERSION = 1
SEP = "*"  # FairNAD's reply format: target*granularity*main*sub

TagLike = Tag | dict[str, Any] | str


def _key(text: str) -> str:
    """Comparison key: LLM replies vary in case and spacing."""
    return " ".join(text.split()).lower()


def _choices(names: list[str]) -> str:
    return ", ".join(names) or "none"


@dataclass(frozen=True)
class SubCategory:
    name: str
    description: str = ""  # may be empty: subs an LLM finds in reference models come without one


@dataclass(frozen=True)
class MainCategory:
    target: str
    granularity: str
    name: str
    description: str
    subs: tuple[SubCategory, ...] = ()


@dataclass(frozen=True)
class AttributeTree:
    """Immutable, so the builtin tree can be shared; `merge` returns a new tree.
    Main-category names are unique across the whole tree."""

    categories: tuple[MainCategory, ...]
    granularity_names: tuple[tuple[str, str], ...]  # (key, display name), in GRANULARITIES order
    source: str = ""

    # --- loading and saving -------------------------------------------------------

    @classmethod
    def builtin(cls) -> AttributeTree:
        return _builtin()

    @classmethod
    def load(cls, path: str | Path) -> AttributeTree:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: attribute tree file not found") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: invalid JSON at line {err.lineno} col {err.colno}: {err.msg}") from None
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason})") from None
        return cls.from_dict(data, where=str(path))

    def save(self, path: str | Path) -> None:
        atomic_write_json(Path(path), self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "source": self.source,
            "granularities": dict(self.granularity_names),
            "targets": {
                t: [{"granularity": m.granularity, "main": m.name, "description": m.description,
                     "subs": [{"name": s.name, "description": s.description} for s in m.subs]}
                    for m in self.categories if m.target == t]
                for t in self.targets
            },
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = FILE_NAME) -> AttributeTree:
        """Validate everything, so a hand-edited or LLM-built tree fails here with the
        place named rather than later as a puzzling mis-tag."""

        def fail(place: str, msg: str) -> NoReturn:
            raise ConfigError(f"{where}: {place}: {msg}" if place else f"{where}: {msg}")

        def obj(value: Any, place: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
            if not isinstance(value, dict):
                fail(place, f"expected an object, got {type(value).__name__}")
            for k in required:
                if k not in value:
                    fail(place, f"missing {k!r}")
            check_keys(f"{where}: {place}" if place else where, value, required + optional)
            return value

        def text(value: Any, place: str, name: bool = False) -> str:
            if not isinstance(value, str) or not value.strip():
                fail(place, f"expected a non-empty string, got {value!r}")
            if name and SEP in value:
                fail(place, f"{value!r} contains {SEP!r}, the tag separator")
            return value

        top = obj(data, "", ("version", "granularities", "targets"), ("source",))
        if top["version"] != VERSION:
            fail("version", f"unsupported version {top['version']!r} (expected {VERSION})")
        source = top.get("source", "")
        if not isinstance(source, str):
            fail("source", f"expected a string, got {source!r}")

        names = obj(top["granularities"], "granularities", GRANULARITIES)
        granularity_names = tuple((g, text(names[g], f"granularities.{g}")) for g in GRANULARITIES)

        targets = top["targets"]
        if not isinstance(targets, dict) or not targets:
            fail("targets", f"expected a non-empty object, got {targets!r}")
        for t in targets:
            if t not in TARGETS:
                fail("targets", f"unknown target {t!r} (valid: {_choices(list(TARGETS))})")

        categories: list[MainCategory] = []
        seen: dict[str, str] = {}
        for t in (t for t in TARGETS if t in targets):
            entries = targets[t]
            if not isinstance(entries, list) or not entries:
                fail(f"targets.{t}", "expected a non-empty list of main categories")
            for i, entry in enumerate(entries):
                place = f"targets.{t}[{i}]"
                obj(entry, place, ("granularity", "main", "description"), ("subs",))
                if entry["granularity"] not in GRANULARITIES:
                    fail(place, f"unknown granularity {entry['granularity']!r} "
                                f"(valid: {_choices(list(GRANULARITIES))})")
                main = text(entry["main"], f"{place}.main", name=True)
                if _key(main) in seen:
                    fail(f"{place}.main", f"duplicate main category {main!r} (first at {seen[_key(main)]})")
                seen[_key(main)] = place
                raw_subs = entry.get("subs", [])
                if not isinstance(raw_subs, list):
                    fail(f"{place}.subs", f"expected a list, got {type(raw_subs).__name__}")
                subs: list[SubCategory] = []
                for j, raw in enumerate(raw_subs):
                    sub_place = f"{place}.subs[{j}]"
                    obj(raw, sub_place, ("name",), ("description",))
                    name = text(raw["name"], f"{sub_place}.name", name=True)
                    if any(_key(s.name) == _key(name) for s in subs):
                        fail(f"{sub_place}.name", f"duplicate sub-category {name!r} under {main!r}")
                    description = raw.get("description", "")
                    if not isinstance(description, str):
                        fail(f"{sub_place}.description", f"expected a string, got {description!r}")
                    subs.append(SubCategory(name, description))
                categories.append(MainCategory(t, entry["granularity"], main,
                                               text(entry["description"], f"{place}.description"), tuple(subs)))
        return cls(tuple(categories), granularity_names, source)

    # --- queries ------------------------------------------------------------------

    @property
    def targets(self) -> list[str]:
        return [t for t in TARGETS if any(m.target == t for m in self.categories)]

    def mains(self, target: str | None = None, granularity: str | None = None) -> list[str]:
        return [m.name for m in self._select(target, granularity)]

    def subs(self, main: str) -> list[str]:
        return [s.name for s in self._main(main).subs]

    def tags(self, target: str | None = None) -> list[Tag]:
        """Every leaf; a main without sub-categories is itself a leaf (sub "")."""
        return [Tag(m.target, m.granularity, m.name, s.name)
                for m in self._select(target, None) for s in (m.subs or (SubCategory(""),))]

    def main_tag(self, main: str) -> Tag:
        m = self._main(main)
        return Tag(m.target, m.granularity, m.name, "")

    def granularity_display(self, granularity: str) -> str:
        return dict(self.granularity_names)[self._granularity(granularity)]

    def size(self) -> tuple[int, int]:
        """(main categories, sub-categories); a sub under two mains counts twice."""
        return len(self.categories), sum(len(m.subs) for m in self.categories)

    def check(self, tag_like: TagLike) -> Tag:
        """The canonical Tag for a Tag, a dict or FairNAD's "target*granularity*main[*sub]"
        reply; ValueError names the first part that does not fit and the valid choices."""
        if isinstance(tag_like, Tag):
            parts = [tag_like.target, tag_like.granularity, tag_like.main, tag_like.sub]
        elif isinstance(tag_like, dict):
            missing = [k for k in ("target", "granularity", "main") if not isinstance(tag_like.get(k), str)]
            if missing:
                raise ValueError(f"tag {tag_like!r} lacks string field(s): {', '.join(missing)}")
            parts = [tag_like["target"], tag_like["granularity"], tag_like["main"], tag_like.get("sub") or ""]
        elif isinstance(tag_like, str):
            parts = tag_like.strip().strip("`'\"").split(SEP)
            if len(parts) not in (3, 4):
                raise ValueError(f"expected 'target{SEP}granularity{SEP}main category[{SEP}sub-category]', "
                                 f"got {len(parts)} part(s) in {tag_like!r}")
            parts += [""] * (4 - len(parts))
        else:
            raise TypeError(f"cannot read a tag from {type(tag_like).__name__}")
        target, granularity = self._target(parts[0]), self._granularity(parts[1])
        candidates = self._select(target, granularity)
        main = next((m for m in candidates if _key(m.name) == _key(parts[2])), None)
        if main is None:
            raise ValueError(f"unknown main category {parts[2].strip()!r} under {target}/{granularity} "
                             f"(valid: {_choices([m.name for m in candidates])})")
        if not _key(parts[3]):
            return Tag(target, granularity, main.name, "")
        sub = next((s for s in main.subs if _key(s.name) == _key(parts[3])), None)
        if sub is None:
            valid = f"valid: {_choices([s.name for s in main.subs])}" if main.subs else "it has no sub-categories"
            raise ValueError(f"unknown sub-category {parts[3].strip()!r} under {main.name} ({valid})")
        return Tag(target, granularity, main.name, sub.name)

    # --- text for prompts and embeddings ------------------------------------------

    def render(self, target: str) -> str:
        """The tree as FairNAD's prompts show it: granularity, then `main: [subs]`."""
        target = self._target(target)
        lines: list[str] = []
        for g, display in self.granularity_names:
            mains = self._select(target, g)
            if mains:
                lines.append(f"{display}:")
                lines += [f"  {m.name}: [{', '.join(s.name for s in m.subs)}]" for m in mains]
        return "\n".join(lines)

    def describe(self, tag: TagLike) -> str:
        """Text embedded for a leaf, so similarity search matches meaning, not just names."""
        tag = self.check(tag)
        main = self._main(tag.main)
        if not tag.sub:
            return f"{main.name} — {main.description}"
        sub = next(s for s in main.subs if s.name == tag.sub)
        middle = f" — {sub.description}" if sub.description else ""
        return f"{main.name}: {sub.name}{middle} ({main.description})"

    # --- lookups ------------------------------------------------------------------

    def _target(self, target: str) -> str:
        for t in self.targets:
            if _key(t) == _key(target):
                return t
        raise ValueError(f"unknown target {target.strip()!r} (valid: {_choices(self.targets)})")

    def _granularity(self, granularity: str) -> str:
        for g, display in self.granularity_names:
            if _key(granularity) in (_key(g), _key(display)):
                return g
        valid = [g for g, _ in self.granularity_names] + [d for _, d in self.granularity_names]
        raise ValueError(f"unknown granularity {granularity.strip()!r} (valid: {_choices(valid)})")

    def _select(self, target: str | None, granularity: str | None) -> list[MainCategory]:
        t = self._target(target) if target is not None else None
        g = self._granularity(granularity) if granularity is not None else None
        return [m for m in self.categories if t in (None, m.target) and g in (None, m.granularity)]

    def _main(self, main: str) -> MainCategory:
        for m in self.categories:
            if _key(m.name) == _key(main):
                return m
        valid = _choices([m.name for m in self.categories])
        raise ValueError(f"unknown main category {main.strip()!r} (valid: {valid})")


@functools.cache
def _builtin() -> AttributeTree:
    """Parsed once per process; safe to share because the tree is immutable."""
    data = resources.files("nas.knowledge") / "data" / FILE_NAME
    return AttributeTree.from_dict(json.loads(data.read_text(encoding="utf-8")), where=FILE_NAME)
