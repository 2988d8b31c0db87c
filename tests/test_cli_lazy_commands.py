"""The commands are built as they are asked for (`kvsim.cli.LazyCommands`): a command line builds the command it
runs alone, and every command, its help and its usage errors are what typer made of the app registering them all."""

import subprocess
import sys
from importlib import import_module

import pytest
import typer
from typer.testing import CliRunner

from kvsim.cli import COMMANDS, TYPER_SETTINGS, app
from kvsim.cli.shared import OneLineUsageErrors

runner = CliRunner()


def eager_app() -> typer.Typer:
    """The app as it was: every command of `COMMANDS` registered on it, in that order, all built at each start."""
    eager = typer.Typer(cls=OneLineUsageErrors, help=app.info.help, no_args_is_help=True, **TYPER_SETTINGS)
    eager.callback()(app.registered_callback.callback)
    for name, where in COMMANDS.items():
        module, _, function = where.partition(":")
        eager.command(name)(getattr(import_module(module), function))
    return eager


@pytest.mark.parametrize("args", [["--help"], [], ["runn"], ["plna", "x"], ["run", "--gpu", "h100"],
                                  ["plan", "--bogus"], ["capacity", "--block-size", "1_6"], ["import-profile"],
                                  *([name, "--help"] for name in COMMANDS)])
def test_every_command_help_and_usage_error_is_the_eager_apps(args):
    lazy, eager = (runner.invoke(a, args, env={"COLUMNS": "100"}) for a in (app, eager_app()))
    assert (lazy.exit_code, lazy.output) == (eager.exit_code, eager.output)
    assert lazy.exit_code in (0, 2) and lazy.output  # each case says something: help, or a one-line error


def test_help_lists_the_commands_in_their_order():
    lines = runner.invoke(app, ["--help"], env={"COLUMNS": "100"}).output.split("Commands:\n")[1].splitlines()
    assert [line.split()[0] for line in lines if line.strip()] == ["capacity", "run", "plan", "calibrate",
                                                             "import-profile", "report", "validate"]


def test_a_run_builds_and_imports_no_other_command():
    """Resolving `run` builds it alone: `kvsim plan`'s and the profile commands' modules stay unimported (a fresh
    interpreter: the suite's own has imported them)."""
    code = ("import sys, typer.main\nfrom kvsim.cli import app\ngroup = typer.main.get_command(app)\n"
            "group.get_command(None, 'run')\n"
            "print(sorted(m for m in sys.modules if m in ('kvsim.cli.plan_command', 'kvsim.cli.profiles')), "
            "list(group.commands._built))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "['run']"]
