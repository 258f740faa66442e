"""Open-ended spaces: NADER's block files and FairNAD's model source. Each has
a base design (the root of the search) and decodes encodings; there is no
uniform sample or random neighbour, so only LLM design strategies use them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from nas.spaces.nader.arch import BlockArch
from nas.spaces.source.arch import SourceArch
from nas.errors import ConfigError
from nas.core.space import SPACES, SearchSpace

BASE_BLOCKS = ("resnet_basic",)


class _OpenEnded(SearchSpace):
    open_ended = True

    def sample(self, rng: np.random.Generator):
        raise ConfigError(f"space '{self.name}' has no random samples; use an LLM design strategy")

    def mutate(self, arch, rng: np.random.Generator):
        raise ConfigError(f"space '{self.name}' has no random moves; use an LLM design strategy")


def _read_base(base: str, packaged: tuple[str, ...], loader, kind: str) -> str:
    """A packaged base by name, or a user's file by path."""
    if base in packaged:
        return loader(base)
    path = Path(base).expanduser()
    if not path.is_file():
        raise ConfigError(f"{kind} base {base!r}: not a packaged one ({', '.join(packaged)}) nor an existing file")
    return path.read_text(encoding="utf-8")


@SPACES.register("nader")
class BlockSpace(_OpenEnded):
    """Block files; the root is `base` (default: a ResNet basic block, as NADER's NB201 setting)."""

    def __init__(self, base: str = "resnet_basic") -> None:
        text = _read_base(base, BASE_BLOCKS,
                          lambda n: (resources.files("nas.spaces.nader.dag") / "bases" / f"{n}.txt").read_text("utf-8"),
                          "block")
        self.base = BlockArch.from_text(text, source=base)

    def decode(self, encoding: Any) -> BlockArch:
        return BlockArch.decode(encoding)


@SPACES.register("source")
class SourceSpace(_OpenEnded):
    """Model source files; the root is `base` (default: CIFAR ResNet-32, FairNAD's)."""

    def __init__(self, base: str = "resnet32") -> None:
        from nas.spaces.source.bases import BASE_MODELS, base_source

        self.base = SourceArch(_read_base(base, BASE_MODELS, base_source, "model"), filename=f"{Path(base).stem}.py")
        self.base.key()  # a base that does not parse fails here, with its line

    def decode(self, encoding: Any) -> SourceArch:
        return SourceArch.decode(encoding)
