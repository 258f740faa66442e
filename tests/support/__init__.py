"""Test-only helpers shared by tests and benchmarks, kept out of the wheel (it holds `nas` alone):
the scripted OpenAI-compatible server, the cross-check against NADER's published counts, the
stand-in supernet trainer (supernet_training.py) and the rest below.
Tests import them as `support.<module>` (pytest puts tests/ on sys.path); benchmarks add tests/."""
