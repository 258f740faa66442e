"""Search spaces: sampling, mutation and decoding of one representation."""

from nas.spaces.base import SPACES, SearchSpace
from nas.spaces import nb201, open_ended, spos, autoformer, ofa_mbv3  # noqa: F401  (registers)

__all__ = ["SPACES", "SearchSpace"]
