"""`python -m nas.cli.main`."""

from nas.cli.main import main

main()
