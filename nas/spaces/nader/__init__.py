"""NADER block files: the DAG language (dag/), block-set encoding (arch), macro network."""
