"""NAS-Bench-201: the cell encoding (arch), space, network, supernet."""
