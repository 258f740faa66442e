"""Weight-sharing supernets: the protocol and its registry (`base`), the trainer (`train`) and
its settings (`settings`, torch-free, so `nas train-supernet` checks them before torch loads).
the supernet evaluator (`evaluator`) and one module per family (`ofa_mbv3`, `spos`, `autoformer`,
`nb201`), each registered in `base.SUPERNETS` by entry point and imported when first asked for. Nothing is imported here: that would load torch."""
