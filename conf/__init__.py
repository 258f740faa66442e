"""Hydra config groups, shipped as package data (`pkg://conf`)."""
