"""OFA MobileNetV3: subnet encoding (arch), space, supernet (the `ofa` package)."""
