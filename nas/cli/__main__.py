"""`python -m nas.cli`."""

from nas.cli.main import main

main()
