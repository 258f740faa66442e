"""NADER's representation as an `Architecture`: a block file (base, stem, downsample).

The key is isomorphism-aware (`nas.spaces.nader.dag.canon`) and spelling-aware
(``C*4`` equals ``4*C``), so a re-proposal of a known block is recognised by a
set lookup however its nodes are numbered or its lines ordered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from nas.core.arch import Architecture, stable_hash
from nas.errors import EncodingError
from nas.spaces.nader.dag.canon import canonical_form
from nas.spaces.nader.dag.expr import normal_form
from nas.spaces.nader.dag.macro import BlockSet, Plan, Skeleton, plan, search_width
from nas.spaces.nader.dag.shapes import ROLES

if TYPE_CHECKING:
    from nas.core.constraint import Constraint


class BlockArch(Architecture):
    space: ClassVar[str] = "nader"

    def __init__(self, blocks: BlockSet):
        self.blocks = blocks
        self._forms: dict[str, str] | None = None

    @classmethod
    def from_text(cls, text: str, source: str = "<string>", fallback: BlockSet | None = None) -> "BlockArch":
        return cls(BlockSet.from_text(text, source, fallback))

    def forms(self) -> dict[str, str]:
        if self._forms is None:
            self._forms = {
                role: canonical_form(getattr(self.blocks, role), normalise=normal_form) for role in ROLES
            }
        return self._forms

    def canonical(self) -> str:
        return "".join(f"##{role}##\n{form}\n" for role, form in self.forms().items())

    def section_keys(self) -> dict[str, str]:
        """Per-role keys: a new base block with the parent's stem shares those."""
        return {role: stable_hash(self.space, role, form) for role, form in self.forms().items()}

    def to_text(self) -> str:
        return "".join(getattr(self.blocks, role).to_text() for role in ROLES)

    def encode(self) -> str:
        return self.to_text()

    @classmethod
    def decode(cls, data: Any) -> "BlockArch":
        if not isinstance(data, str):
            raise EncodingError(f"a NADER block encoding must be the block file text, not {type(data).__name__}")
        return cls.from_text(data)

    def plan(self, skeleton: Skeleton | None = None, budget: Constraint | None = None, width: int | None = None) -> Plan:
        """Validate and cost the network at `width`, or at the widest that fits `budget`."""
        skeleton = skeleton or Skeleton.nb201()
        if width is None:
            width = search_width(self.blocks, skeleton, budget).width
        return plan(self.blocks, skeleton, width)
