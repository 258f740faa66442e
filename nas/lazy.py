"""A module imported on first use, declared once at the top of the module that needs it.

    network = LazyImport("nas.spaces.nader.network")  # loads torch: only `arch show` needs it

A module that must import fast, or without torch (the core, `nas --help`, a config error), keeps
an expensive import waiting this way instead of burying `import` statements in its functions: the
dependency stays one line at the top, where a reader (and tests/test_layering.py) sees it. Each
attribute read goes to the real module in `sys.modules`, so a test that patches the module's
attribute patches it for every user (the proxy copies nothing)."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class LazyImport(types.ModuleType):
    """Stands for the module `name`; the first attribute read imports it (an ImportError then, not at start-up)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)

    def __getattr__(self, attr: str) -> Any:
        module = sys.modules.get(self.__name__) or importlib.import_module(self.__name__)
        return getattr(module, attr)

    def __repr__(self) -> str:
        state = "loaded" if self.__name__ in sys.modules else "not loaded yet"
        return f"<lazy module {self.__name__!r} ({state})>"
