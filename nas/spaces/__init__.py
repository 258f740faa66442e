"""Search spaces: sampling, mutation and decoding of one representation."""

from nas.core.space import SPACES, SearchSpace  # each space's module is imported on first use (SPACES.get)

__all__ = ["SPACES", "SearchSpace"]
