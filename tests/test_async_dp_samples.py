"""A data-parallel group's parallel sampling under async scheduling: a finishing child preempted after a sibling
on another rank wrote the parent's row.

vLLM's front end fans a request with n > 1 out into children that DP ranks serve apart
(`kvsim.sched.v1.data_parallel_fan_out`: the ranks share one `SampleGroups`, the rank whose child ends last writes
the parent's row). Under async scheduling a child that finished keeps its KV until its rank's next plan, which may
preempt it (vLLM's `running` still lists it: `AsyncSteps.finishing_victim`); that preemption counts on the parent's
row. Found by a random search (EAGLE, n = 4, DP 2): the rank looked for the row only in its own records, and the
run ended with `KeyError: 'request 2 has no row'`.
"""

from kvsim.kv import PagedAllocator
from kvsim.sched import SchedulerLimits, make_scheduler
from kvsim.sched.v1 import data_parallel_fan_out
from tests.conftest import make_request


def rank(num_blocks):
    sched = make_scheduler("v1", PagedAllocator(num_blocks, 4, enable_caching=False), SchedulerLimits(8, 64, 64))
    sched.async_scheduling = True
    return sched


def test_a_finishing_child_preempted_after_its_sibling_wrote_the_row_counts_on_that_row():
    # Blocks of 4. Rank A: 2 usable blocks (3 with the null block); rank B: plenty. X (id 0: prompt 4, 3 out)
    # goes to A, then P (id 1: prompt 4, 1 out, n = 2) fans out: child 0 to A, child 1 to B. Step 1 (lockstep):
    # A prefills X and child 0 (a block each: A is full), B child 1; both children sample their one token and
    # finish. A completes first (child 0: 1 of 2 ended), then B (child 1: the last: B writes P's row). A's next
    # plan: X's 5th token needs a second block, none is free, and the last admitted of A's running and finishing
    # requests is child 0, which has finished: it is preempted (its KV freed), one preemption on P's row, in B's
    # records; X decodes.
    a, b = rank(3), rank(64)
    fan_out = data_parallel_fan_out([a, b])
    x, parent = make_request(0, 0.0, 4, 3), make_request(1, 0.0, 4, 1, n=2)
    assert a.add(x)
    child0, child1 = fan_out(parent)
    assert a.add(child0) and b.add(child1)
    plans = [a.schedule(0.0), b.schedule(0.0)]
    assert [[(r.request_id, n) for r, n in p.scheduled] for p in plans] == [[(0, 4), (child0.request_id, 4)],
                                                                           [(child1.request_id, 4)]]
    a.complete(plans[0], 1.0)
    b.complete(plans[1], 1.0)
    assert len(a.records) == 0 and len(b.records) == 1  # P's row, written by B
    plan = a.schedule(1.0)
    assert plan.preempted == [child0] and [(r.request_id, n) for r, n in plan.scheduled] == [(0, 1)]
    assert a.num_preemptions == 1
    row = b.records.columns()
    assert (list(row["request_id"]), list(row["num_preemptions"])) == ([1], [1])
    a.check_invariants()
    b.check_invariants()
