"""The search loop (ask → evaluate → tell), its run directory, constraints and builders.

Submodules are imported where used (`nas.search.loop`, `nas.search.spec`, ...):
strategies import `nas.core.constraint`, which must not pull in the loop."""
