"""Supernet definitions and their training (OFA MobileNetV3 via `ofa`, SPOS
ShuffleNet, AutoFormer); populated by the two-stage NAS work."""
