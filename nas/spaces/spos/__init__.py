"""SPOS ShuffleNetV2: choice encoding (arch), space, supernet."""
