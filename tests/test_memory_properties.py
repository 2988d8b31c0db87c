"""Random operation sequences against both allocators; books must balance after every step."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, precondition, rule

from kvsim.kv import PagedAllocator, SegmentContent, SlabAllocator, waste

BS = 4
SEGMENTS = st.sampled_from([("sys", 9), ("sys", 16), ("doc", 5), ("x", 3)])


class PagedMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(num_blocks=st.integers(3, 24), caching=st.booleans(), cpu=st.integers(0, 12))
    def setup(self, num_blocks, caching, cpu):
        self.a = PagedAllocator(num_blocks, BS, enable_caching=caching, num_cpu_blocks=cpu, bytes_per_block=8)
        self.next_id = 0
        self.lengths: dict[int, int] = {}

    def _new_id(self):
        self.next_id += 1
        return self.next_id

    @rule(target=seqs, prefix=st.lists(SEGMENTS, max_size=2), tail=st.integers(1, 12), extra=st.integers(0, 8))
    def admit(self, prefix, tail, extra):
        seq_id = self._new_id()
        content = SegmentContent([*prefix, (("own", seq_id), tail + extra)])
        n = sum(length for _, length in prefix) + tail
        hit = self.a.lookup_prefix(content, n)
        assert hit.num_tokens < n and hit.num_tokens % BS == 0
        if self.a.allocate(seq_id, n, final_num_tokens=n + extra, content=content, hit=hit):
            self.lengths[seq_id] = n
        return seq_id

    @rule(seq=seqs, k=st.integers(1, 6))
    def append(self, seq, k):
        if seq in self.a.seqs:
            before = self.a.seqs[seq].block_table[:]
            if self.a.allocate(seq, self.a.seqs[seq].num_tokens + k):
                assert self.a.seqs[seq].block_table[: len(before) - 1] == before[:-1]
            else:
                assert self.a.seqs[seq].block_table == before

    @rule(target=seqs, seq=seqs)
    def fork(self, seq):
        child = self._new_id()
        if seq in self.a.seqs:
            self.a.fork(seq, child)
        return child

    @rule(seq=consumes(seqs))
    def free(self, seq):
        if seq in self.a.seqs or seq in self.a.swapped:
            self.a.free(seq)

    @rule(seq=seqs)
    def swap_out(self, seq):
        if seq in self.a.seqs:
            held_before = self.a.pool.num_free_blocks
            if self.a.swap_out([seq]) is None:
                assert self.a.pool.num_free_blocks == held_before

    @rule(seq=seqs)
    def swap_in(self, seq):
        if seq in self.a.swapped:
            tokens = self.a.swapped[seq].num_tokens
            if self.a.swap_in([seq]) is not None:
                assert self.a.seqs[seq].num_tokens == tokens

    @precondition(lambda self: hasattr(self, "a"))
    @rule(n=st.integers(1, 30))
    def evict_by_pressure(self, n):
        """A big fresh allocation pops cached free blocks (lazy eviction) if it fits."""
        seq_id = self._new_id()
        if self.a.allocate(seq_id, n):
            self.a.free(seq_id)

    @invariant()
    def books_balance(self):
        if hasattr(self, "a"):
            self.a.check_invariants()
            w = waste(self.a)
            assert w.total == self.a.num_total_slots
            assert min(w.token_state, w.reserved, w.internal_frag, w.free) >= 0
            assert w.internal_frag <= (BS - 1) * len(self.a.seqs)  # at most one partial block each

    def teardown(self):
        if hasattr(self, "a"):
            for seq in list(self.a.seqs) + list(self.a.swapped):
                self.a.free(seq)
            self.a.check_invariants()
            assert self.a.pool.num_free_blocks == self.a.pool.num_usable_blocks
            assert self.a.num_filled_slots == 0 and self.a.num_reserved_slots == 0
            if self.a.cpu_pool:
                assert self.a.cpu_pool.num_free_blocks == self.a.cpu_pool.num_usable_blocks


class SlabMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(slots=st.integers(16, 200), policy=st.sampled_from(["max", "pow2", "oracle"]),
                cpu=st.integers(0, 100))
    def setup(self, slots, policy, cpu):
        self.s = SlabAllocator(slots, max_model_len=32, policy=policy, num_cpu_slots=cpu, bytes_per_token=2)
        self.next_id = 0

    @rule(target=seqs, prompt=st.integers(1, 20), output=st.integers(1, 12))
    def admit(self, prompt, output):
        self.next_id += 1
        self.s.allocate(self.next_id, prompt, final_num_tokens=prompt + output)
        return self.next_id

    @rule(seq=seqs, k=st.integers(1, 4))
    def append(self, seq, k):
        slab = self.s.seqs.get(seq)
        if slab is not None:
            self.s.allocate(seq, min(slab.num_tokens + k, slab.final_num_tokens))

    @rule(seq=consumes(seqs))
    def free(self, seq):
        if seq in self.s.seqs or seq in self.s.swapped:
            self.s.free(seq)

    @rule(seq=seqs)
    def swap_out(self, seq):
        if seq in self.s.seqs:
            self.s.swap_out([seq])

    @rule(seq=seqs)
    def swap_in(self, seq):
        if seq in self.s.swapped:
            self.s.swap_in([seq])

    @invariant()
    def books_balance(self):
        if hasattr(self, "s"):
            self.s.check_invariants()
            for need in (None, 8, 32):
                w = waste(self.s, need)
                assert w.total == self.s.num_total_slots and min(w.free, w.external_frag, w.reserved) >= 0

    def teardown(self):
        if hasattr(self, "s"):
            for seq in list(self.s.seqs) + list(self.s.swapped):
                self.s.free(seq)
            self.s.check_invariants()
            assert self.s.free_runs.lengths == {0: self.s.num_total_slots}


TestPaged = PagedMachine.TestCase
TestPaged.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestSlab = SlabMachine.TestCase
TestSlab.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
