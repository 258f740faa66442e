"""Design knowledge: the attribute tree, papers -> tagged ideas (the Reader),
and the Qdrant stores of ideas and experiences the design agents retrieve from.

The prompts of its agents (the Reader, the Tagger, the tree analyst) are files in `prompts/`."""
