"""The public scikit-learn style estimators (thin: plumbing around the methods and the engine)."""

from .nmf import NMF

__all__ = ["NMF"]
