"""Weight-sharing supernets: the protocol and its registry (`base`), the trainer (`train`) and
its settings (`settings`, torch-free, so `nas train-supernet` checks them before torch loads).
Each family's supernet lives in its folder (`nas/spaces/<family>/supernet.py`) and registers
in `base.SUPERNETS` when first asked for. Nothing is imported here: that would load torch."""
