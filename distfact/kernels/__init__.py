"""Per-block numeric kernels (numpy, scipy, numba). No Dask here."""
