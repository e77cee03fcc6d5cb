"""distfact: group-aware matrix factorisation at scale, on Dask."""

from ._version import __version__
from .estimators import NMF, SSNMF, FairerNMF, MultigroupSVD, SSNMFClassifier, StratifiedNMF, WeightedL1NMF
from .estimators.persistence import load
from .store import GroupedMatrix, from_arrays
from .store import from_corpus, from_table
from .store import open_store as open

__all__ = ["NMF", "FairerNMF", "StratifiedNMF", "WeightedL1NMF", "SSNMF", "MultigroupSVD", "SSNMFClassifier", "GroupedMatrix", "from_arrays", "open", "__version__"]
__all__ += ["from_table", "from_corpus", "load"]
