"""User-facing errors: each carries one precise line that says what and where."""


class NasError(Exception):
    """Base class; the CLI prints `str(err)` as a single line and exits 2."""


class ConfigError(NasError):
    """A configuration value is unknown, out of range or of the wrong type."""


class EncodingError(NasError):
    """An architecture encoding is malformed (names the offending part)."""


class EvaluationError(NasError):
    """An architecture could not be evaluated for a deterministic reason."""


class RunDirError(NasError):
    """A run directory is corrupt or belongs to a different search."""


class MissingDependencyError(NasError):
    """An optional package or data file is missing; says how to install it."""


class OutputPathError(NasError, OSError):
    """An output path cannot be written: a file where a directory is expected (or the
    reverse), or a read-only place. Also an OSError, for code that tolerates a failed write."""


class InputError(NasError):
    """A file or directory named as input is missing, unreadable or of the wrong kind."""
