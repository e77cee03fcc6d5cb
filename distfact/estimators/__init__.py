"""The public scikit-learn style estimators (thin: plumbing around the methods and the engine)."""

from .fairer_nmf import FairerNMF
from .nmf import NMF
from .stratified_nmf import StratifiedNMF
from .wl1_nmf import WeightedL1NMF

__all__ = ["FairerNMF", "NMF", "StratifiedNMF", "WeightedL1NMF"]
