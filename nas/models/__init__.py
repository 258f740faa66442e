"""Plain `nn.Module` definitions (no training logic lives here)."""
