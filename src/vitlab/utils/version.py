"""The one version string of the package (pyproject.toml reads it from this file's text; `vitlab.__version__`)."""

__version__ = "0.1.0"
