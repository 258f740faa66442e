"""`python -m nas.cli.main`."""

from nas.cli.main.main import main

main()
