"""Design-quality metrics of LLM design strategies (NADER's Table: E, Q, SR),
from the history records: a design is a record whose strategy info says
`valid`; its parent is the record whose `node` it names."""

from __future__ import annotations

from typing import Any

from nas.core.trial import TrialRecord


def design_metrics(designs: list[TrialRecord], history: list[TrialRecord] | None = None) -> dict[str, Any]:
    """Proposals, valid designs (pass rate), executability (valid designs that
    trained without failing), success rate (beat the parent), tokens per valid
    design. `designs` may be a subset (one stage) of `history`, where parents are looked up."""
    designs = [r for r in designs if "valid" in r.strategy]
    by_node = {r.strategy.get("node"): r for r in (history if history is not None else designs)}
    valid = [r for r in designs if r.strategy["valid"]]
    executed = [r for r in valid if r.accuracy is not None]
    beat = [r for r in executed
            if (p := by_node.get(r.strategy.get("parent"))) is not None and p.accuracy is not None
            and r.accuracy is not None and r.accuracy > p.accuracy]
    tokens = sum(int(r.strategy.get("tokens") or 0) for r in designs)
    n = len(designs)
    return {"proposals": n, "valid": len(valid), "pass_rate": len(valid) / n if n else 0.0,
            "duplicates": sum(1 for r in designs if r.strategy.get("duplicate")),
            "executability": len(executed) / len(valid) if valid else 0.0,
            "success_rate": len(beat) / len(executed) if executed else 0.0,
            "tokens_per_valid_design": tokens / len(valid) if valid else None}
