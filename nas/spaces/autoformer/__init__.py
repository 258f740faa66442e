"""AutoFormer: ViT encoding (arch), space, supernet."""
