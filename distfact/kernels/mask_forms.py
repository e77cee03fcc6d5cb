"""The names of a block's two sparse mask forms (``kernels/masked.py``): what a store records and reads, in a
module of its own so that opening a store does not import numba (``distfact info``)."""

OBSERVED = "mask_observed"
COMPLEMENT = "mask_complement"
FORMS = (OBSERVED, COMPLEMENT)
