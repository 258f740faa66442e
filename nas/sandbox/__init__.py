"""Sandboxed verification of untrusted, LLM-written model source (FairNAD's
execution and structural verifiers): the code runs only in a resource-limited
child process, never in the caller."""

from nas.sandbox.limits import Limits
from nas.sandbox.verify import STAGES, Verdict, verify_model_source

__all__ = ["STAGES", "Limits", "Verdict", "verify_model_source"]
