"""Training: the recipe, the Lightning module, early termination and the fit loop."""
