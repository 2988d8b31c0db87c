"""The `kvsim` command and `python -m kvsim`: `kvsim.cli` run inside Ctrl-C handling.

The console script imports this module, which imports nothing heavy (nor does `import kvsim`),
so a Ctrl-C while the CLI's dependencies load (typer, pandas, pydantic: about a second) is
handled too. A Ctrl-C prints one line saying what was interrupted and what is intact, and exits
with status 130 (128 + SIGINT), as shells expect (a SIGTERM once the CLI has loaded likewise, with 143, and a
SIGHUP, the terminal closed, with 129);
never a traceback. kvsim's outputs are swapped into place only when complete
(`kvsim.results.output_dir`), so an interrupted one was not written and whatever was at its path
before is intact; the writer records that path on the interrupt
(`KeyboardInterrupt.kvsim_output`), and whether the output was in place when it came (`kvsim_output_written`).

It also starts numpy's OpenBLAS with one thread (`single_blas_thread`): kvsim does no linear
algebra worth a thread pool, and starting the pool costs ~0.03 CPU s in every command. And when the
command is done it freezes every object left (`gc.freeze`), so that the interpreter's exit does not
walk them all in one last cyclic collection (~0.055 CPU s after a `kvsim run`, whatever its length:
most of them are the imported modules' objects): the process is ending, nothing it holds needs
collecting. Exit handlers still run, and the files a command writes are closed before it returns.
Likewise it has pydantic look for no plugins (`no_pydantic_plugins`).

`kvsim --version` alone is answered here, with the line the CLI's `--version` prints
(`kvsim.model.version.VERSION_LINE`), without importing the CLI (typer, pydantic, numpy and every
command's modules: callgrind counts 678 M instructions for it then, 105 M now, the bare interpreter 89 M);
a standard output that is closed (`>&-`) or refuses the line (`> /dev/full`) is left to the CLI, which says so
in one line, exit 2, as for every command (`kvsim.cli.stdout.unwritable_stdout`).
"""

import gc
import os
import sys
from collections.abc import Callable

INTERRUPTED_EXIT = 130
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")  # OpenBLAS reads these


def single_blas_thread() -> None:
    """Have numpy's OpenBLAS start one thread instead of a pool of one per core, unless the user chose
    (any of `BLAS_THREAD_VARIABLES` set) or numpy is already loaded (its pool exists: nothing changes).

    OpenBLAS reads the variable when numpy loads it, and the pool's threads cost ~0.03 CPU s to
    start (measured: `import numpy` 0.110 → 0.083 CPU s on 2 cores) though kvsim never uses them:
    its only BLAS call is the fit's dot product over a profile's samples (`kvsim.latency.fitting`),
    the same bits on one thread as on the pool for vectors of up to 20,000 elements (checked: OpenBLAS
    0.3.31, 2 cores); longer ones differ in the last bits, and one thread gives the same bits on every
    machine where a pool's depend on its size.
    Processes the command starts (a plan's dask workers) inherit the setting.
    """
    if "numpy" not in sys.modules and not any(name in os.environ for name in BLAS_THREAD_VARIABLES):
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


def no_pydantic_plugins() -> None:
    """Have pydantic load no plugins, unless the user chose (`PYDANTIC_DISABLE_PLUGINS` set: an empty value
    loads them all) or pydantic is already loaded. kvsim uses none, and finding them costs every command a scan
    of each installed distribution's entry points at its first validator (~20 M instructions, 1 % of a
    1-request `kvsim run`). Processes the command starts (a plan's dask workers) inherit the setting."""
    if "pydantic" not in sys.modules and "PYDANTIC_DISABLE_PLUGINS" not in os.environ:
        os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"


def interrupted_message(argv: list[str], output: str | None, written: bool = False) -> str:
    """The line a Ctrl-C prints: the command, the output it was writing (if any), what is intact; or that the
    output was `written`, where the Ctrl-C came once it was in place."""
    command = " ".join(["kvsim", *argv[:1]])
    if output is not None and written:
        return f"kvsim: interrupted ({command}) once it had written {output}, which is complete"
    if output is not None:
        return f"kvsim: interrupted ({command}): {output} was not written; what was there before is intact"
    if argv[:1] == ["plan"]:
        return (f"kvsim: interrupted ({command}): the points finished so far are kept in the plan's "
                "points.jsonl; run the same command again to resume")
    return f"kvsim: interrupted ({command}) before it wrote any output; no file was changed"


def _interrupt_behind(error: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt an exit was raised for (typer turns one into `Exit(130)`), if any: of a chain of them,
    the one that names the output it stopped (`kvsim_output`). A second Ctrl-C or SIGTERM that lands while the
    first one's output is cleaned up raises in that cleanup, on top of the first: it said "before it wrote any
    output" of a run stopped writing its output."""
    seen: BaseException | None = error
    first = None
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            if hasattr(seen, "kvsim_output"):
                return seen
            first = first or seen
        seen = seen.__cause__ or seen.__context__
    return first


def import_cli() -> Callable[[], None]:
    """`kvsim.cli.main`, imported with the cyclic garbage collector off and its objects then frozen (`gc.freeze`),
    the collector left on or off as it was: an import makes objects that live as long as the process (modules,
    classes, functions), so the collections during it (and the first ones after, over all of them) walked them
    for nothing. Callgrind, a one-request run of the bench's Mooncake scenario: 1882 -> 1860 M instructions."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        from kvsim.cli import main as cli_main
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    return cli_main


def print_version() -> bool:
    """Print the CLI's `--version` line (`VERSION_LINE`) without loading the CLI (see the module docstring); False,
    having written nothing, where standard output cannot take it (closed: `sys.stdout` is None; a full disk, a
    closed pipe: the flush fails): the CLI then answers as it does for every command (`kvsim.cli.stdout.
    unwritable_stdout`: one line, exit 2; a closed pipe left to click), not a traceback or a silent exit 0."""
    from kvsim.model.version import VERSION_LINE

    if sys.stdout is None:
        return False
    line = (VERSION_LINE + "\n").encode()
    try:  # to the descriptor itself: a failed write leaves no line in a buffer for the CLI's stdout to flush
        sys.stdout.flush()
        return os.write(sys.stdout.fileno(), line) == len(line)
    except (OSError, ValueError):  # refused; no descriptor (io.UnsupportedOperation), or closed
        return False


def main() -> None:
    if sys.argv[1:] == ["--version"] and print_version():
        return
    single_blas_thread()
    no_pydantic_plugins()
    try:
        import_cli()()
    except (KeyboardInterrupt, SystemExit) as stop:
        interrupt = _interrupt_behind(stop)
        if interrupt is None:
            raise
        print(interrupted_message(sys.argv[1:], getattr(interrupt, "kvsim_output", None),
                                  getattr(interrupt, "kvsim_output_written", False)), file=sys.stderr)
        sys.exit(getattr(interrupt, "kvsim_exit_status", INTERRUPTED_EXIT))  # 143 for a SIGTERM, 129 a SIGHUP
    finally:
        gc.freeze()  # the process ends now: no last collection over everything (see the module docstring)


if __name__ == "__main__":
    main()
