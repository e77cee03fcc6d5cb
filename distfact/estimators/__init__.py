"""The public scikit-learn style estimators (thin: plumbing around the methods and the engine), and each
method's declaration for the command line, pipeline specs and reports (``contract.py``)."""

from . import fairer_nmf, multigroup_svd, nmf, ssnmf, stratified_nmf, wl1_nmf
from .fairer_nmf import FairerNMF
from .multigroup_svd import MultigroupSVD
from .nmf import NMF
from .stratified_nmf import StratifiedNMF
from .ssnmf import SSNMF, SSNMFClassifier
from .wl1_nmf import WeightedL1NMF
from .persistence import register_estimators

register_estimators(NMF, FairerNMF, StratifiedNMF, WeightedL1NMF, SSNMF, SSNMFClassifier, MultigroupSVD)

#: distfact's methods, in the order the command line lists them
DECLARATIONS = tuple(module.DECLARATION for module in (nmf, fairer_nmf, stratified_nmf, wl1_nmf, ssnmf,
                                                      multigroup_svd))

__all__ = ["FairerNMF", "MultigroupSVD", "NMF", "SSNMF", "SSNMFClassifier", "StratifiedNMF", "WeightedL1NMF"]
