"""FairNAD's model source files: an open-ended space of untrusted code, which
builds, trains and exports only in the sandbox."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nas.core.space import SPACES, OpenEndedSpace
from nas.spaces.source.arch import SourceArch
from nas.spaces.source.bases import BASE_MODELS, base_source


@SPACES.register("source")
class SourceSpace(OpenEndedSpace[SourceArch]):
    """Model source files; the root is `base` (default: CIFAR ResNet-32, FairNAD's)."""

    trusted = False
    source_trusted = False
    trainable = True
    file_suffix = ".py"
    source_kind = "the model source itself (untrusted: built, trained and exported only in the sandbox)"

    def __init__(self, base: str = "resnet32") -> None:
        self.base = SourceArch(self.read_base(base, BASE_MODELS, base_source, "model"),
                               filename=f"{Path(base).stem}.py")
        self.base.key()  # a base that does not parse fails here, with its line

    def decode(self, encoding: Any) -> SourceArch:
        return SourceArch.decode(encoding)

    def read(self, text: str, filename: str) -> SourceArch:
        return SourceArch(text, filename=Path(filename).name)

    def source(self, arch: SourceArch, num_classes: int, in_channels: int = 3, input_size: int = 32,
               options: Mapping[str, Any] | None = None) -> str:
        """The model file itself: it defines `Network(num_classes)`."""
        return arch.source
