"""Weight-sharing supernets, one per categorical space (OFA MobileNetV3 via
`ofa`, SPOS ShuffleNetV2, AutoFormer, NB201), and their training."""

from supernets.base import SUPERNETS, Supernet
from supernets import spos  # noqa: F401  (registers)
from supernets import autoformer  # noqa: F401  (registers)
from supernets import ofa_mbv3  # noqa: F401  (registers)
from supernets import nb201  # noqa: F401  (registers)

__all__ = ["SUPERNETS", "Supernet"]
