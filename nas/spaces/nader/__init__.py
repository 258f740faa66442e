"""NADER block files: the DAG language (dag/), block-set encoding (arch), space (sizing + build), macro network."""
