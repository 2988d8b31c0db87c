"""Bad input found by the eleventh sweep (output paths, a plan folder written again, values of a field that
takes one of several types): each exits 2 with one line naming the field and the value, and writes nothing,
never a traceback, a field the user never wrote, or one plan's answers beside another's."""


import pytest
from conftest import one_line_exit_2
from typer.testing import CliRunner

runner = CliRunner()


@pytest.mark.parametrize("output", ["~kvsim-no-such-user/out", "~kvsim-no-such-user"])
def test_an_output_in_an_unknown_users_home_is_one_line(tmp_path, monkeypatch, output):
    """`-o ~name/out` for a user the machine has not: pathlib's expanduser raised RuntimeError("Could not
    determine home directory."), a traceback (os.path.expanduser leaves such a path as it is)."""
    monkeypatch.chdir(tmp_path)
    line = one_line_exit_2(["run", "--set", "workload.num_requests=2", "-o", output])
    assert line == (f"--output={output!r}: starts with '~kvsim-no-such-user', the home folder of a user this "
                    "machine does not know; kvsim only replaces output it wrote itself (choose a new path)")
    assert list(tmp_path.iterdir()) == []

