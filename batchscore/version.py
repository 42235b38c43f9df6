"""The package version, in a module of its own so that any module may import it without
importing the package root (which re-exports the Python API, lazily)."""

__version__ = "0.1.0"
