"""Name → class registries (timm-style decorators) with one factory each.

Adding a space, strategy or evaluator is one `@REGISTRY.register("name")` class, an entry
point naming its module in the registry's group (`nasflow.<group>` in pyproject.toml's
`[project.entry-points]`, or in any installed package's: that is a plugin), plus one YAML
file in `conf/<group>/name.yaml`. Entry points let a registry list every name while
importing only the module of the name asked for: naming a strategy must not pay for every
other strategy's torch, LLM or Prefect imports, and a layer never names a module above it.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

from nas.errors import ConfigError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

T = TypeVar("T")

_SCALARS = (bool, int, float, str)


@cache
def _entry_points() -> Any:  # SelectableGroups on Python 3.11, EntryPoints later: both `.select(group=)`
    """Every installed distribution's entry points, read once (each group read alone would read them all)."""
    from importlib.metadata import entry_points  # lazy: ~13 ms that `nas --help` need not pay

    return entry_points()


@cache
def plugins(group: str) -> dict[str, EntryPoint]:
    """The entry points of `group` in every installed distribution, read once per process."""
    return {ep.name: ep for ep in _entry_points().select(group=group)}


class Registry(Generic[T]):
    def __init__(self, kind: str, group: str) -> None:
        self.kind = kind
        self.group = group  # entry-point group: name -> the module that registers it, imported by `get`
        self._entries: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        def deco(cls: type[T]) -> type[T]:
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            cls.name = name  # type: ignore[attr-defined]
            self._entries[name] = cls
            return cls

        return deco

    def names(self) -> list[str]:
        return sorted({*self._entries, *plugins(self.group)})

    def get(self, name: str) -> type[T]:
        if name not in self._entries and name in plugins(self.group):
            plugins(self.group)[name].load()
            if name not in self._entries:
                raise ConfigError(f"{self.kind} '{name}': entry point '{plugins(self.group)[name].value}' "
                                  f"(group {self.group}) registered no {self.kind} of that name")
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(self.names()) or "none registered"
            raise ConfigError(f"unknown {self.kind} '{name}' (valid: {valid})") from None

    def create(self, name: str, params: dict[str, Any], **context: Any) -> T:
        """Instantiate `name` with config `params` checked against its signature."""
        cls = self.get(name)
        check_params(f"{self.kind} '{name}'", cls.__init__, params, skip=set(context))
        return cls(**context, **params)


def check_params(where: str, fn: Callable, params: dict[str, Any], skip: set[str]) -> None:
    """Reject unknown keys and scalar type mismatches with a one-line error; a `**rest` parameter
    takes the other keys, for `fn` to check (evaluator=train's sizing settings: the spaces')."""
    sig = inspect.signature(fn)
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    accepted = {
        n: p for n, p in sig.parameters.items()
        if n != "self" and n not in skip and p.kind in kinds
    }
    rest = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    for key, value in params.items():
        if key not in accepted and rest:
            continue
        if key not in accepted:
            names = ", ".join(sorted(accepted)) or "none"
            raise ConfigError(f"{where}: unknown parameter '{key}' (accepted: {names})")
        ann = accepted[key].annotation
        expected = _scalar_type(ann)
        if expected is None or value is None:
            continue
        ok = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ConfigError(
                f"{where}: parameter '{key}' must be {expected.__name__}, got {value!r}"
            )


def check_count(where: str, value: Any) -> None:
    """A count setting (a width, a depth, a multiple): an integer >= 1, bools refused."""
    if type(value) is not int or value < 1:
        raise ConfigError(f"{where} must be an integer >= 1, got {value!r}")


def check_keys(where: str, data: Mapping[Any, Any], valid: Iterable[str], *, what: str = "key",
               error: type[Exception] = ConfigError) -> None:
    """The one unknown-key check, for mappings that are not constructor calls (recipe, engine,
    data, runner=local, screen, a constraint, an encoding, prefect.yaml): one line naming `where`,
    every unknown `what` and every valid one, in `valid`'s order. `error`: the exception to raise
    (an encoding's is EncodingError)."""
    names = list(valid)
    unknown = sorted(str(k) for k in set(data) - set(names))
    if unknown:
        keys = ", ".join(f"'{k}'" for k in unknown)
        plural = "s" if len(unknown) > 1 else ""
        raise error(f"{where}: unknown {what}{plural} {keys} (valid: {', '.join(names) or 'none'})")


def _scalar_type(annotation: Any) -> type | None:
    if isinstance(annotation, str):
        annotation = {"int": int, "float": float, "bool": bool, "str": str}.get(annotation)
    return annotation if annotation in _SCALARS else None
