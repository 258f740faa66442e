"""Sandboxed verification and training of untrusted, LLM-written model source
(FairNAD's execution and structural verifiers, then the evaluation itself):
the code runs only in a resource-limited child isolated by the OS, never in
the caller, which measures and trains the graph the child exports. Other
sandboxed jobs (export) use the same child API: `verify.run_child` and
`verify.conclude` in the parent, `worker.answer` and `worker.Job` in the child."""

from nas.sandbox.limits import Limits
from nas.sandbox.verify import STAGES, Verdict, train_model_source, verify_model_source

__all__ = ["STAGES", "Limits", "Verdict", "train_model_source", "verify_model_source"]
