"""Model source (FairNAD): PyTorch files as architectures (arch), their space, and the packaged base models (bases/)."""
