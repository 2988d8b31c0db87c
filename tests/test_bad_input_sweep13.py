"""Bad input found by the thirteenth sweep: each exits 2 with one line naming the field and the value, and
writes nothing, never a traceback, a hang, or a value read as another without a word."""

import pytest
from conftest import one_line_exit_2

RUN = ["run", "--set", "workload.num_requests=3", "--set", "steps=none"]


def _files(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.mark.parametrize("output", [None, "a/b/run"])
def test_a_run_refused_mid_way_leaves_no_folder_it_made(tmp_path, monkeypatch, output):
    """A run stopped after its output folder was opened (a bad trace row is read there) removed its temporary
    folder but left the folders it had made above it: `-o a/b/run` left `a/b/`, the default `runs/default`
    an empty `runs/`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,10,10\n"
                                    "2023-11-16 18:17:04.1,10,x\n")
    (tmp_path / "s.yaml").write_text("workload:\n  num_requests: 5\n  arrival: {process: trace}\n"
                                     "  trace: {format: azure, path: t.csv}\n")
    argv = ["run", "s.yaml", *([] if output is None else ["-o", output])]
    assert one_line_exit_2(argv) == "t.csv:3: GeneratedTokens='x' is not an integer"
    assert _files(tmp_path) == ["s.yaml", "t.csv"]


def test_a_run_over_its_memory_limit_leaves_no_runs_folder(tmp_path, monkeypatch):
    """The memory estimate is checked as the run starts, inside its output folder: `runs/` stayed."""
    monkeypatch.chdir(tmp_path)
    message = one_line_exit_2([*RUN, "--memory-limit", "1B"])
    assert message.endswith("more than the limit of 1 B; make it smaller or raise --memory-limit")
    assert _files(tmp_path) == []


def test_a_failed_write_keeps_the_folders_that_were_there(tmp_path, monkeypatch):
    """Only the folders the failed run made are removed: an existing (empty) parent stays."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    one_line_exit_2([*RUN, "--memory-limit", "1B", "-o", "runs/deep/er"])
    assert _files(tmp_path) == ["runs"]
