"""The tool's version, in the lowest layer: what a result file or a cache key records
(``quantscope.__version__`` is this name)."""

__version__ = "0.1.0"
