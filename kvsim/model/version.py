"""kvsim's version, in one place: pyproject.toml reads it (`dynamic = ["version"]`), `kvsim --version`
prints it and run outputs record it. A leaf module, importable from every layer."""

__version__ = "0.1.0"
