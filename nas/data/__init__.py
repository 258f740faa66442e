"""Datasets (standard on-disk formats) and their Lightning data modules."""
