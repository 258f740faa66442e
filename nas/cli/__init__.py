"""The `nas` command: `main` parses and dispatches; one module per subcommand."""
