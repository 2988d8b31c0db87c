"""A shared KV-transfer link: times derived by hand (latency + bytes ÷ bandwidth, bandwidth split equally), and
work conservation against a single FIFO server, which has the same busy periods as processor sharing."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.kv.link import LinkSpec, SharedLink
from kvsim.model.errors import KvsimError

GB = 1e9


def drain(link: SharedLink) -> dict[int, float]:
    ends = {}
    while (nxt := link.next_end()) is not None:
        for transfer_id in link.advance(nxt[0]):
            ends[transfer_id] = nxt[0]
    return ends


def test_one_transfer_takes_latency_plus_bytes_over_bandwidth():
    link = SharedLink(LinkSpec(bandwidth_bytes_per_s=25 * GB, latency_s=20e-6))
    link.start(7, 512 * 2**20, now_s=1.0)  # 512 MiB of KV over a 25 GB/s NIC
    assert drain(link) == {7: pytest.approx(1.0 + 20e-6 + 512 * 2**20 / 25e9)}
    assert link.bytes_moved == 512 * 2**20 and link.num_in_flight == 0


def test_two_equal_transfers_take_twice_as_long():
    link = SharedLink(LinkSpec(bandwidth_bytes_per_s=10 * GB, latency_s=1e-3))
    link.start(0, 10**9, now_s=0.0)
    link.start(1, 10**9, now_s=0.0)
    ends = drain(link)
    assert ends == {0: pytest.approx(1e-3 + 0.2), 1: pytest.approx(1e-3 + 0.2)}


def test_a_later_transfer_shares_the_rest():
    """A (1 GB) alone at 1 GB/s for 0.5 s, then A and B share: A's last 0.5 GB at 0.5 GB/s ends at 1.5 s;
    B has moved 0.5 GB by then and its last 0.5 GB alone ends at 2.0 s."""
    link = SharedLink(LinkSpec(bandwidth_bytes_per_s=GB))
    link.start(0, 10**9, now_s=0.0)
    assert link.advance(0.5) == []
    link.start(1, 10**9, now_s=0.5)
    assert drain(link) == {0: pytest.approx(1.5), 1: pytest.approx(2.0)}


def test_latency_is_not_shared():
    """A drains from 0.25 s; B starts at 0.25 s and drains from 0.5 s, its latency running while A drains alone.
    A: 0.25 GB alone by 0.5 s, then 0.75 GB at half rate → 2.0 s; B: 0.75 GB moved by then, 0.25 GB alone →
    2.25 s (work conserving: 2 GB at 1 GB/s after the first 0.25 s)."""
    link = SharedLink(LinkSpec(bandwidth_bytes_per_s=GB, latency_s=0.25))
    link.start(0, 10**9, now_s=0.0)
    link.start(1, 10**9, now_s=0.25)
    assert drain(link) == {0: pytest.approx(2.0), 1: pytest.approx(2.25)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.integers(1, 10**9)), min_size=1, max_size=12))
def test_last_end_is_the_fifo_servers_makespan(transfers):
    transfers.sort()
    link = SharedLink(LinkSpec(bandwidth_bytes_per_s=GB))
    ends: dict[int, float] = {}
    for i, (start_s, num_bytes) in enumerate(transfers):
        for nxt in iter(link.next_end, None):
            if nxt[0] > start_s:
                break
            ends.update((t, nxt[0]) for t in link.advance(nxt[0]))
        link.start(i, num_bytes, start_s)
    ends.update(drain(link))
    free_s = 0.0  # one FIFO server: the same busy periods, so the same last instant
    for start_s, num_bytes in transfers:
        free_s = max(free_s, start_s) + num_bytes / GB
    assert sorted(ends) == list(range(len(transfers)))
    assert max(ends.values()) == pytest.approx(free_s, rel=1e-9, abs=1e-9)
    assert link.bytes_moved == sum(b for _, b in transfers)


@pytest.mark.parametrize(("field", "kwargs"), [("bandwidth_bytes_per_s", {"bandwidth_bytes_per_s": 0}),
                                               ("bandwidth_bytes_per_s", {"bandwidth_bytes_per_s": float("inf")}),
                                               ("latency_s", {"bandwidth_bytes_per_s": 1.0, "latency_s": -1.0})])
def test_bad_link_is_one_error_naming_the_field(field, kwargs):
    with pytest.raises(KvsimError, match=f"^{field}="):
        LinkSpec(**kwargs)
