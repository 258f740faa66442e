"""Sandbox verdicts kept across runs, so a design checked once is not checked again.

A FairNAD search that is run again or replayed from its transcripts (`llm=replay`) meets
the same model files; each check is a sandboxed child that imports torch and exports the
model (seconds). The verdict is a function of the file, the parent file, the input and
class count, the limits and the checker's own code, which together make the key. Only
verdicts that would come out the same again are kept: not a limit hit or a crash (the
machine's load decides those) and not a model's own numbers (`self_reported`). Training
does not read this cache: the evaluator checks and exports the model again in its own child.

Files live in `$NASFLOW_HOME/checks`, which sandboxed model code cannot see; a file that
does not hold a well-formed verdict for its key is ignored with a warning and replaced.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from nas.core.arch import stable_hash
from nas.io import KeyedFiles
from nas.sandbox.limits import Limits
from nas.sandbox.verify import Verdict

UNCACHED_STAGES = ("limits", "crash")
_CHECKER = Path(__file__).resolve().parents[1]
log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def checker_fingerprint() -> str:
    """The sandbox's and the measuring code's sources, torch's and Python's versions: a change to
    any of them may change a verdict, so it starts a fresh set of keys."""
    import torch  # lazy: loads torch (start-up time)

    digest = hashlib.sha256(f"{torch.__version__} {sys.version}".encode())
    for path in sorted([*(_CHECKER / "sandbox").glob("*.py"), _CHECKER / "measure.py"]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def verdict_key(source: str, parent_source: str | None, num_classes: int, input_shape: tuple[int, ...],
                limits: Limits) -> str:
    return stable_hash({"source": source, "parent": parent_source, "num_classes": num_classes,
                        "input_shape": list(input_shape), "limits": asdict(limits),
                        "checker": checker_fingerprint()}, length=32)


def cacheable(verdict: Verdict) -> bool:
    return not verdict.self_reported and verdict.stage not in UNCACHED_STAGES


class VerdictCache(KeyedFiles):
    """One JSON file per key under `root` (`$NASFLOW_HOME/checks` by default)."""

    def get(self, key: str) -> Verdict | None:
        record, problem = self.read(key)
        if record is None and problem is None:
            return None
        if problem is None:
            try:
                if not isinstance(record, dict) or record.get("key") != key:
                    raise ValueError("not a record of this key")
                verdict = Verdict.from_child(record.get("verdict"))
                if not cacheable(verdict):
                    raise ValueError(f"a verdict that is never kept (stage {verdict.stage})")
                return verdict
            except ValueError as err:  # wrong fields or values
                problem = str(err)[:120]
        log.warning("ignoring the cached check %s (%s); checking the design again", self.path(key), problem)
        return None

    def put(self, key: str, verdict: Verdict) -> None:
        if cacheable(verdict):
            self.write(key, {"key": key, "verdict": verdict.to_dict()})

    def verdict(self, key: str, check: Callable[[], Verdict]) -> tuple[Verdict, bool]:
        """The verdict kept for `key`, else `check()`'s (kept if it may be); and whether it was kept."""
        kept = self.get(key)
        if kept is not None:
            return kept, True
        verdict = check()
        self.put(key, verdict)
        return verdict, False
