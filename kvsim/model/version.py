"""kvsim's version, in one place: pyproject.toml reads it (`dynamic = ["version"]`), `kvsim --version`
prints it (`VERSION_LINE`) and run outputs record it. A leaf module, importable from every layer."""

__version__ = "0.1.0"
VERSION_LINE = f"kvsim {__version__}"  # what `kvsim --version` prints: the CLI's option and the entry's fast path
