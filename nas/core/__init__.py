"""The torch-free core: architectures, spaces, costs, constraints, registries (tests/test_layering.py enforces it)."""
