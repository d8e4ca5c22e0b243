"""fastbert's version, defined once: the package re-exports it, pyproject.toml reads it."""

__version__ = "0.1.0"
