"""`python -m kvsim` is the `kvsim` command."""

from kvsim.cli import main

main()
