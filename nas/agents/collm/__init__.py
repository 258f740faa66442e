"""CoLLM-NAS: a stateful Navigator and a stateless Generator over supernet encodings."""
