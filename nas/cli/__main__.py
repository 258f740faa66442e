"""`python -m nas.cli`."""

from nas.cli.main import entry

entry()
