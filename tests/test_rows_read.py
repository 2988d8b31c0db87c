"""`read_rows` parses a trace once per content: the rows it returns are the reader's, exactly, at the shipped size,
and a file rewritten (even keeping its size and time stamp) is parsed anew."""

import os

import pytest

from kvsim.model.errors import KvsimError
from kvsim.workload.rows_read import read_rows
from kvsim.workload.scenario import load_scenario
from kvsim.workload.traces import NO_COLUMNS, ROW_READERS, TraceColumns, read_mooncake

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_the_shipped_mooncake_slice_reads_as_its_reader_reads_it_each_call_its_own_list():
    """The report's Mooncake slice (its 1,500 rows, prefix hashes and all): equal to `read_mooncake`'s rows, record
    by record, on the first read and on the kept one; a caller's list is its own (emptying it leaves the next)."""
    path = load_scenario(None).resolve_path("builtin:mooncake_conversation_head", "workload.trace.path")
    plain = read_mooncake(path)
    first = read_rows(path, "mooncake", NO_COLUMNS)
    first.clear()
    again = read_rows(path, "mooncake", TraceColumns())
    assert len(plain) == 1500 and again == plain and again[1].segments == plain[1].segments


def test_a_rewritten_file_is_parsed_anew_even_with_its_size_and_time_stamp_kept(tmp_path, monkeypatch):
    """Kept by content: the second read of the same bytes does not parse (one reader call), and the file rewritten
    with other lengths of the same width and its old time stamp gives the new rows (2,000 → 3,000 tokens)."""
    calls = []

    def counted(path, columns):
        calls.append(path)
        return reader(path, columns)

    reader = ROW_READERS["azure"]
    monkeypatch.setitem(ROW_READERS, "azure", counted)
    trace = tmp_path / "t.csv"
    trace.write_text(AZURE_HEAD + "2023-11-16 18:00:00.0000000,2000,17\n")
    stamp = os.stat(trace).st_mtime_ns
    assert [r.prompt_len for r in read_rows(trace, "azure", NO_COLUMNS)] == [2000]
    assert [r.prompt_len for r in read_rows(trace, "azure", NO_COLUMNS)] == [2000] and len(calls) == 1
    trace.write_text(AZURE_HEAD + "2023-11-16 18:00:00.0000000,3000,17\n")
    os.utime(trace, ns=(stamp, stamp))
    assert [r.prompt_len for r in read_rows(trace, "azure", NO_COLUMNS)] == [3000] and len(calls) == 2


def test_a_file_that_fails_to_parse_fails_on_every_read(tmp_path):
    """Nothing is kept for a bad file: its error again on the next read, its rows once it is fixed."""
    trace = tmp_path / "t.csv"
    trace.write_text(AZURE_HEAD + "2023-11-16 18:00:00.0000000,-5,17\n")
    for _ in range(2):
        with pytest.raises(KvsimError, match="ContextTokens=-5"):
            read_rows(trace, "azure", NO_COLUMNS)
    trace.write_text(AZURE_HEAD + "2023-11-16 18:00:00.0000000,5,17\n")
    assert [r.prompt_len for r in read_rows(trace, "azure", NO_COLUMNS)] == [5]
