"""NAS-Bench-201: the cell encoding (arch), space, network, cost model (cost), standalone source (source), supernet."""
