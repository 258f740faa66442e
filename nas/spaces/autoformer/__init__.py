"""AutoFormer: ViT encoding (arch), space, supernet (and the ViT network)."""
