"""Design knowledge: the attribute tree, papers -> tagged ideas (the Reader),
and the Qdrant stores of ideas and experiences the design agents retrieve from."""
