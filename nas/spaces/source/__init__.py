"""Model source (FairNAD): PyTorch files as architectures (arch) and the packaged base models (bases/)."""
