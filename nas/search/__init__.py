"""The search loop (ask → evaluate → tell), its run directory and builders."""

from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.spec import SearchSpec

__all__ = ["LocalExecutor", "SearchLoop", "SearchSpec"]
