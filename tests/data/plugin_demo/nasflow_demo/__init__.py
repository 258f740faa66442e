"""A nasflow plugin: the `ordered` strategy."""
