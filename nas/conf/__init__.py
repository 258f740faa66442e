"""Hydra config groups, shipped as package data (`pkg://nas.conf`)."""
