"""Base models for source-code search (FairNAD): PyTorch files defining `Network(num_classes)`.

The files are package data for the LLM to read and mutate; they are read as
text here, never imported (a search runs them only in `nas.sandbox`).
"""

from __future__ import annotations

from importlib import resources

from nas.errors import ConfigError

BASE_MODELS = ("resnet32", "mobilenetv2_050", "shufflenetv2_050")


def base_source(name: str) -> str:
    """The source text of base model `name` (one of `BASE_MODELS`)."""
    if name not in BASE_MODELS:
        raise ConfigError(f"unknown base model {name!r}; valid: {', '.join(BASE_MODELS)}")
    return (resources.files(__name__) / f"{name}.py").read_text(encoding="utf-8")
