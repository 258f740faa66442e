"""Weight-sharing supernets: the protocol (`base`) and its trainer (`train`).
Each family's supernet lives in its folder (`nas/spaces/<family>/supernet.py`)
and registers in `SUPERNETS` when first asked for."""

from nas.supernets.base import SUPERNETS, Supernet

__all__ = ["SUPERNETS", "Supernet"]
