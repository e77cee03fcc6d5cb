"""The public scikit-learn style estimators (thin: plumbing around the methods and the engine)."""

from .fairer_nmf import FairerNMF
from .multigroup_svd import MultigroupSVD
from .nmf import NMF
from .stratified_nmf import StratifiedNMF
from .ssnmf import SSNMF, SSNMFClassifier
from .wl1_nmf import WeightedL1NMF
from .persistence import register_estimators

register_estimators(NMF, FairerNMF, StratifiedNMF, WeightedL1NMF, SSNMF, SSNMFClassifier, MultigroupSVD)

__all__ = ["FairerNMF", "MultigroupSVD", "NMF", "SSNMF", "SSNMFClassifier", "StratifiedNMF", "WeightedL1NMF"]
