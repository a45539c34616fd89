"""The package version, in a leaf module so that no layer imports the package root for it."""

__version__ = "0.1.0"
