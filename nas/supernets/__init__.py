"""Weight-sharing supernets, one per categorical space (OFA MobileNetV3 via
`ofa`, SPOS ShuffleNetV2, AutoFormer, NB201), and their training."""

from nas.supernets.base import SUPERNETS, Supernet
import nas.spaces.spos.supernet  # noqa: F401  (registers)
import nas.spaces.autoformer.supernet  # noqa: F401  (registers)
import nas.spaces.ofa_mbv3.supernet  # noqa: F401  (registers)
import nas.spaces.nb201.supernet  # noqa: F401  (registers)

__all__ = ["SUPERNETS", "Supernet"]
