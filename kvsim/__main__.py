"""The `kvsim` command and `python -m kvsim`: `kvsim.cli` run inside Ctrl-C handling.

The console script imports this module, which imports nothing heavy (nor does `import kvsim`),
so a Ctrl-C while the CLI's dependencies load (typer, pandas, pydantic: about a second) is
handled too. A Ctrl-C prints one line saying what was interrupted and what is intact, and exits
with status 130 (128 + SIGINT), as shells expect; never a traceback. kvsim's outputs are swapped
into place only when complete (`kvsim.results.output_dir`), so an interrupted one was not written
and whatever was at its path before is intact; the writer records that path on the interrupt
(`KeyboardInterrupt.kvsim_output`).
"""

import sys

INTERRUPTED_EXIT = 130


def interrupted_message(argv: list[str], output: str | None) -> str:
    """The line a Ctrl-C prints: the command, the output it was writing (if any), what is intact."""
    command = " ".join(["kvsim", *argv[:1]])
    if output is not None:
        return f"kvsim: interrupted ({command}): {output} was not written; what was there before is intact"
    if argv[:1] == ["plan"]:
        return (f"kvsim: interrupted ({command}): the points finished so far are kept in the plan's "
                "points.jsonl; run the same command again to resume")
    return f"kvsim: interrupted ({command}) before it wrote any output; no file was changed"


def _interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt an exit was raised for (typer turns one into `Exit(130)`), if any."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, KeyboardInterrupt):
        seen = seen.__cause__ or seen.__context__
    return seen


def main() -> None:
    try:
        from kvsim.cli import main as cli_main

        cli_main()
    except (KeyboardInterrupt, SystemExit) as stop:
        interrupt = _interrupt_behind(stop)
        if interrupt is None:
            raise
        print(interrupted_message(sys.argv[1:], getattr(interrupt, "kvsim_output", None)), file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)


if __name__ == "__main__":
    main()
