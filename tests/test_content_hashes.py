"""Block identities of segment content (`kvsim.workload.content`): equal keys exactly when the prefixes are
equal, whatever the segmentation and however the hashing was split into calls.

The reference is naive: a token is (segment id, its offset in the segment), as the content's contract says
("token i of a segment is the same token wherever that segment appears"), and block i's prefix is the
tuple of the first (i + 1) · bs tokens. Prefix caching, the offload tier and the affinity router all rest on
this: a key shared by two different prefixes would hit wrong KV, two keys for one prefix would miss.
"""

import random
import sys
from itertools import accumulate
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

import kvsim.workload
from kvsim.workload.content import SegmentContent, TokenContent
from kvsim.workload.traces import read_mooncake

SEGMENT_IDS = ("sys", "a", "b", ("conv", 1), ("conv", 2))


def tokens_of(segments):
    """The content's tokens, one by one, by the contract: (segment id, offset within the segment)."""
    return [(seg_id, offset) for seg_id, length in segments for offset in range(length)]


def prefixes(segments, block_size):
    """Each full block's whole prefix, the identity its key must stand for."""
    tokens = tokens_of(segments)
    return [tuple(tokens[:(i + 1) * block_size]) for i in range(len(tokens) // block_size)]


segment_lists = st.lists(st.tuples(st.sampled_from(SEGMENT_IDS), st.integers(1, 70)), min_size=1, max_size=6)
block_sizes = st.sampled_from([1, 4, 16, 32])


@settings(max_examples=300, deadline=None)
@given(st.lists(segment_lists, min_size=2, max_size=5), block_sizes)
def test_keys_are_equal_exactly_when_the_prefixes_are(contents, block_size):
    key_of = {}  # key -> the prefix it stood for first
    prefix_of = {}  # prefix -> its key
    for segments in contents:
        content = SegmentContent(segments)
        expected = prefixes(segments, block_size)
        keys = content.block_hashes(block_size, len(expected))
        assert len(keys) == len(expected)
        for key, prefix in zip(keys, expected, strict=True):
            assert key_of.setdefault(key, prefix) == prefix, "one key for two different prefixes"
            assert prefix_of.setdefault(prefix, key) == key, "two keys for one prefix"


@settings(max_examples=300, deadline=None)
@given(segment_lists, block_sizes, st.lists(st.integers(0, 400), max_size=6))
def test_keys_do_not_depend_on_how_the_calls_were_split(segments, block_size, cuts):
    """A content hashed lazily, a few blocks per call as a sequence grows, gives the keys of one call."""
    num_blocks = sum(n for _, n in segments) // block_size
    whole = SegmentContent(segments).block_hashes(block_size, num_blocks)
    piecewise = SegmentContent(segments)
    for cut in sorted(min(c, num_blocks) for c in cuts):
        assert piecewise.block_hashes(block_size, cut) == whole[:cut]
    assert piecewise.block_hashes(block_size, num_blocks) == whole


def test_a_shared_system_prompt_hits_until_the_conversations_part():
    """By hand: two requests share a 40-token system prompt and then differ; with 16-token blocks the
    first two blocks lie inside the prompt (equal keys), the third crosses into each request's own turn."""
    a = SegmentContent([("sys", 40), (("conv", 1), 30)]).block_hashes(16, 4)
    b = SegmentContent([("sys", 40), (("conv", 2), 30)]).block_hashes(16, 4)
    assert a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]
    c = SegmentContent([("sys", 32), (("conv", 1), 38)]).block_hashes(16, 4)  # a shorter prompt: block 2 differs
    assert c[:2] == a[:2] and c[2] != a[2]


def test_token_content_keys_follow_the_token_ids():
    a = TokenContent(list(range(64))).block_hashes(16, 4)
    b = TokenContent([*range(40), 999, *range(41, 64)]).block_hashes(16, 4)
    assert a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]


def test_a_decoding_sequence_gets_the_keys_of_one_call_on_the_shipped_mooncake_trace():
    """Realistic size for the shortcut that continues the last block's run (`SegmentContent.block_hashes`): the
    1,500 requests of the shipped Mooncake trace, each its 512-token segments and an output segment of its
    own, hashed as the simulator does (the prompt's full blocks, then 1 to 3 blocks at a time as it decodes,
    past segment ends too) give the keys of one call, at the block sizes 16 and 32."""
    records = read_mooncake(Path(kvsim.workload.__file__).parent / "data" / "mooncake_conversation_head.jsonl")
    rng = random.Random(5)
    num_shortcuts = 0
    for block_size in (16, 32):
        for n, record in enumerate(records):
            segments = [*record.segments, (("out", n), record.output_len)]
            whole = SegmentContent(segments).block_hashes(block_size, sum(s for _, s in segments) // block_size)
            stepwise = SegmentContent(segments)
            num_blocks = record.prompt_len // block_size
            keys = stepwise.block_hashes(block_size, num_blocks)
            while num_blocks < len(whole):
                num_blocks = min(len(whole), num_blocks + rng.randint(1, 3))
                num_shortcuts += num_blocks * block_size <= stepwise._run_end
                keys = stepwise.block_hashes(block_size, num_blocks)
            assert keys == whole
    assert num_shortcuts > 20_000


def test_a_run_of_blocks_takes_consecutive_keys_that_fit_a_c_integer():
    """Speed contract (`SegmentContent.block_hashes`): the blocks inside one segment take consecutive integers
    from a 64-bit base, so `range` and int hashing stay on their C-integer fast paths. Checked on the first 200
    requests of the shipped Mooncake trace (512-token segments: runs of 32 blocks of 16 tokens); a key past
    sys.maxsize has probability about 32 / 2^64 a run."""
    records = read_mooncake(Path(kvsim.workload.__file__).parent / "data" / "mooncake_conversation_head.jsonl")
    for n, record in enumerate(records[:200]):
        segments = [*record.segments, (("out", n), record.output_len)]
        keys = SegmentContent(segments).block_hashes(16, sum(s for _, s in segments) // 16)
        assert all(-sys.maxsize - 1 <= key <= sys.maxsize for key in keys)
        starts = [0, *accumulate(s for _, s in segments)]
        for seg_start, seg_end in zip(starts, starts[1:], strict=False):
            first, end = -(-seg_start // 16), seg_end // 16  # the whole blocks inside the segment
            if end > first:
                assert keys[first:end] == [keys[first] + k for k in range(end - first)]
