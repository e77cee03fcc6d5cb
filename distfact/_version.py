"""distfact's version: here alone, so that no module inside the package imports the package root for it."""

__version__ = "0.1.0"
