"""SPOS ShuffleNetV2: choice encoding (arch), space, supernet (and the standalone subnet)."""
