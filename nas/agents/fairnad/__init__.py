"""FairNAD: agents that edit PyTorch model source, the strategy with its feedback loop."""
