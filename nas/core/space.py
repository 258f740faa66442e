"""Archai-style search-space API: what strategies may ask of any space."""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, Protocol, TypeVar

import numpy as np

from nas.core.arch import Architecture
from nas.core.registry import Registry
from nas.errors import ConfigError, EvaluationError

if TYPE_CHECKING:  # a space builds torch networks, but only inside `build`: the core imports no torch
    from torch import nn

# The space's own architecture class: each family's methods take only its architectures.
A = TypeVar("A", bound=Architecture)
A_in = TypeVar("A_in", bound=Architecture, contravariant=True)  # a benchmark's: it only takes them


@dataclass(frozen=True)
class Cost:
    """What an architecture costs, known without evaluating it (cheap constraints)."""

    params: int
    flops: int


class Benchmark(Protocol[A_in]):
    """A table of trained results for every architecture of a space (NB201's analog-nasbench), which
    evaluator=table scores by lookup; the space gives it (`SearchSpace.benchmark`)."""

    def score(self, arch: A_in) -> float:
        """The table's value for `arch` (percent); `EvaluationError` when it has none."""
        ...

    def cost(self, arch: A_in) -> Cost:
        """Params and FLOPs of `arch`'s network at the table's settings."""
        ...

    def fingerprint(self) -> str:
        """Identity of the table's contents and metric (part of cache keys)."""
        ...


class SearchSpace(ABC, Generic[A]):
    """What strategies may ask of a space, and the networks of its architectures.

    `build` and `source` are the only way evaluators, training and export turn
    an architecture into a network, so a new space is one folder: nothing else
    switches on its name or type. Torch is imported inside the family's
    network modules, never here."""

    name: str  # set by the registry
    # Open-ended spaces (block files, model source) have a base design but no
    # random moves: their moves come from LLM design strategies.
    open_ended: ClassVar[bool] = False
    # False: the architectures are untrusted code (model source); they build, train and export only in
    # the sandbox, never through `build`.
    trusted: ClassVar[bool] = True
    # False: `source` is generated code that export checks in the sandbox (block files compile to it).
    source_trusted: ClassVar[bool] = True
    # What `source` gives, as export's manifest says it.
    source_kind: ClassVar[str] = "nasflow rebuild (no standalone generator for this space: imports nas.spaces)"
    # Whether evaluator=train trains its networks: `build` sizes them to any dataset (or the sandbox
    # trains them); supernet spaces' networks are fixed to their own input size and train as a supernet.
    trainable: ClassVar[bool] = False
    # Whether it has a benchmark table (`benchmark`) that evaluator=table scores by lookup.
    tabular: ClassVar[bool] = False
    # The settings evaluator=train passes to `build` and `source` (their `options`): a frozen dataclass
    # beside the space whose construction checks each in one line (NB201's width and depth, a block
    # file's skeleton and budget); None: its networks take none.
    sizing: ClassVar[type[Any] | None] = None
    # The suffix of a file holding one architecture (`nas train FILE`), read by `read`; None: its
    # architectures are given as their encoding string (an NB201 cell string).
    file_suffix: ClassVar[str | None] = None

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> A:
        """A uniformly random architecture."""

    @abstractmethod
    def mutate(self, arch: A, rng: np.random.Generator) -> A:
        """A random neighbour that differs from `arch` in one decision."""

    @abstractmethod
    def decode(self, encoding: Any) -> A:
        """Encoding → architecture; raises `EncodingError` on malformed input."""

    def read(self, text: str, filename: str) -> A:
        """The architecture in `text` (a `file_suffix` file's contents, else an encoding string),
        errors naming `filename`."""
        return self.decode(text)

    def size(self) -> int | None:
        """Number of distinct architectures, when finite and known."""
        return None

    def cost(self, arch: A) -> Cost | None:
        """Params and FLOPs of `arch` at the space's input size; None when unknown
        (then FLOPs/params constraints cannot be checked before evaluation)."""
        return None

    def cost_mismatch(self, evaluator: Mapping[str, Any]) -> str | None:
        """Why `cost`, what constraints filter on, prices another network than the one an evaluator
        with these parameters scores (its `data` and sizing settings), in one line; None when it is
        the same network or unknown."""
        return None

    def describe(self) -> str:
        """The space and its encoding format in words, for LLM prompts."""
        return f"search space '{self.name}'"

    def input_size(self, arch: A) -> int | None:
        """The input resolution `arch`'s network runs at (OFA's r, a ViT's image size); None: any size
        (the data's own). Data of another size is resized to it."""
        return None

    def params(self) -> dict[str, Any]:
        """The constructor settings, kept in attributes of the same name (the spaces' convention):
        what rebuilds this space elsewhere (checkpoints, exported rebuild modules)."""
        names = [n for n in inspect.signature(type(self).__init__).parameters if n not in ("self", "args", "kwargs")]
        return {n: getattr(self, n) for n in names if hasattr(self, n)}

    @classmethod
    def build_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The `sizing` settings among `options`, checked and with their defaults filled: what
        `build` and `source` read (the other keys are other spaces' settings, ignored)."""
        if cls.sizing is None:
            return {}
        names = {f.name for f in fields(cls.sizing)}
        return asdict(cls.sizing(**{k: v for k, v in options.items() if k in names}))

    @classmethod
    def sizing_options(cls, options: Mapping[str, Any], where: str, takes: Callable[..., Any], *,
                       every_space: bool = False) -> dict[str, Any]:
        """The one check of the sizing settings that a component building networks takes as
        `**sizing` (evaluator=train and proxy, screen.scorer=proxy): a key that is neither a sizing
        setting nor a named parameter of `takes` (the component's class) fails in one line naming
        `where` and every accepted key. `every_space`: the settings of every trainable space are
        accepted, each value checked by every space that reads it, so a bad value fails whichever
        space the run has (evaluator=train's config serves them all); otherwise this space's alone.
        Returns this space's (`build_options`)."""
        readers = [s for s in map(SPACES.get, SPACES.names()) if s.trainable] \
            if every_space else [cls]
        known = {f.name for reader in readers if reader.sizing is not None for f in fields(reader.sizing)}
        unknown = sorted(set(options) - known)
        if unknown:
            named = [n for n in inspect.signature(takes).parameters if n not in ("self", "space", "sizing")]
            raise ConfigError(f"{where}: unknown parameter '{unknown[0]}' "
                              f"(accepted: {', '.join(sorted({*named, *known}))})")
        for reader in readers if every_space else []:  # each checks the values it reads
            reader.build_options(options)
        return cls.build_options(options)

    def build(self, arch: A, num_classes: int, in_channels: int = 3, input_size: int = 32,
              options: Mapping[str, Any] | None = None) -> "nn.Module":
        """The trainable network of `arch` for `num_classes` classes and `in_channels` x `input_size`^2
        inputs, freshly initialised (seed torch first for reproducible weights). `options` are its
        `sizing` settings (`build_options`); None: the space's own."""
        raise self.unbuildable(arch)

    def unbuildable(self, arch: Architecture) -> EvaluationError:
        """Why this space builds no network of `arch` in-process: model source (an untrusted space's)
        runs only in the sandbox, which evaluator=train starts for it."""
        if not self.trusted or not SPACES.get(arch.space).trusted:
            return EvaluationError(f"model source runs only in the sandbox, never in-process (space '{self.name}'): "
                                   "use space=source with evaluator=train, which trains each model file in its sandbox")
        return EvaluationError(f"space '{self.name}' builds no network of a {arch.space} architecture "
                               f"({type(arch).__name__} {arch.key()})")

    def benchmark(self, path: str | None, metric: str, num_classes: int, resolution: int) -> Benchmark[A]:
        """The space's benchmark table (`path`: its file, None: the installed one) giving `metric`, its
        costs for `num_classes` classes at `resolution`² inputs; only `tabular` spaces have one."""
        raise ConfigError(f"space '{self.name}' has no benchmark table (evaluator=table needs one)")

    def source(self, arch: A, num_classes: int, in_channels: int = 3, input_size: int = 32,
               options: Mapping[str, Any] | None = None) -> str:
        """Python source defining `Network(num_classes=...)`, the network `build` gives (its state dict
        loads into it). This default rebuilds it through nasflow for spaces with no standalone generator."""
        return ("# Exported by nasflow: rebuilds the network with nasflow's classes (needs nasflow).\n"
                "from nas.spaces import SPACES\n\n"
                f"SPACE = {self.name!r}\nPARAMS = {self.params()!r}\nENCODING = {arch.encode()!r}\n\n\n"
                f"def Network(num_classes={num_classes}, in_channels={in_channels}, input_size={input_size}):\n"
                "    space = SPACES.create(SPACE, PARAMS)\n"
                "    return space.build(space.decode(ENCODING), num_classes, in_channels, input_size)\n")


@dataclass(frozen=True)
class Decision:
    """One categorical choice of a space: its name (as prompts and errors say it) and legal values."""

    name: str
    choices: tuple[Any, ...]


class CategoricalSpace(SearchSpace[A]):
    """A space whose architectures are one value per decision (NB201's edges,
    OFA's r/d/ks/e, SPOS's 20 blocks, AutoFormer's per-layer choices).
    Sampling, mutation, REINFORCE's policy and the LLM's grammar all work on
    `decisions()`; a space with inactive decisions (OFA's depth) makes them
    canonical in `from_values` so equal networks get equal keys."""

    @abstractmethod
    def decisions(self) -> list[Decision]:
        """Every decision, in a fixed order."""

    @abstractmethod
    def from_values(self, values: list[Any]) -> A:
        """One value per decision → architecture; `EncodingError` names the bad decision."""

    @abstractmethod
    def to_values(self, arch: A) -> list[Any]:
        """Inverse of `from_values`."""

    def from_indices(self, indices: list[int]) -> A:
        return self.from_values([d.choices[i] for d, i in zip(self.decisions(), indices, strict=True)])

    def to_indices(self, arch: A) -> list[int]:
        return [d.choices.index(v) for d, v in zip(self.decisions(), self.to_values(arch), strict=True)]

    def features(self, arch: A) -> list[float]:
        """A fixed-length vector for learned predictors: one-hot per decision."""
        out: list[float] = []
        for d, i in zip(self.decisions(), self.to_indices(arch), strict=True):
            out.extend(1.0 if j == i else 0.0 for j in range(len(d.choices)))
        return out

    def sample(self, rng: np.random.Generator) -> A:
        return self.from_values([d.choices[int(rng.integers(len(d.choices)))] for d in self.decisions()])

    def mutate(self, arch: A, rng: np.random.Generator) -> A:
        """Change one decision; decisions that leave the network unchanged (inactive ones) are redrawn
        (up to 100 times, then a random sample)."""
        decisions, values = self.decisions(), self.to_values(arch)
        for _ in range(100):
            i = int(rng.integers(len(decisions)))
            others = [c for c in decisions[i].choices if c != values[i]]
            if not others:
                continue
            child = self.from_values([*values[:i], others[int(rng.integers(len(others)))], *values[i + 1:]])
            if child != arch:
                return child
        return self.sample(rng)

    def size(self) -> int | None:
        return math.prod(len(d.choices) for d in self.decisions())


class OpenEndedSpace(SearchSpace[A]):
    """A space with a base design (`base`, the root of the search) and decoding, but no uniform
    sample or random neighbour: only LLM design strategies search it."""

    open_ended = True
    base: A

    def sample(self, rng: np.random.Generator) -> A:
        raise ConfigError(f"space '{self.name}' has no random samples; use an LLM design strategy")

    def mutate(self, arch: A, rng: np.random.Generator) -> A:
        raise ConfigError(f"space '{self.name}' has no random moves; use an LLM design strategy")

    @staticmethod
    def read_base(base: str, packaged: tuple[str, ...], loader: Callable[[str], str], kind: str) -> str:
        """A packaged base by name, or a user's file by path."""
        if base in packaged:
            return loader(base)
        path = Path(base).expanduser()
        if not path.is_file():
            raise ConfigError(f"{kind} base {base!r}: not a packaged one ({', '.join(packaged)}) nor an existing file")
        return path.read_text(encoding="utf-8")


# A family registers its space under its folder's name (`nas/spaces/<family>/space.py`), by
# entry point: naming one space loads no other family.
SPACES: Registry[SearchSpace] = Registry("space", "nasflow.spaces")
