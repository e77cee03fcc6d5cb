"""The public scikit-learn style estimators (thin: plumbing around the methods and the engine)."""

from .fairer_nmf import FairerNMF
from .nmf import NMF

__all__ = ["FairerNMF", "NMF"]
