"""The `kvsim` command and `python -m kvsim`: `kvsim.cli` run inside Ctrl-C handling.

The console script imports this module, which imports nothing heavy (nor does `import kvsim`),
so a Ctrl-C while the CLI's dependencies load (typer, pandas, pydantic: about a second) ends the
command quietly with exit status 130 (128 + SIGINT), as shells expect, instead of a traceback.
"""

import sys


def main() -> None:
    try:
        from kvsim.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
