"""`engine.kv_offload` through scenarios and the CLI: a tier of size 0 is no tier (byte for byte), and a
multi-turn workload whose earlier turns fall out of a small GPU pool loads them from the CPU tier."""

import json

import pytest
from typer.testing import CliRunner

import kvsim
from kvsim.cli import app
from kvsim.engine.simulate import simulate
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import make_scenario

runner = CliRunner()


def multi_turn(kv_offload=None, num_requests=120):
    """Conversations of 4 turns (1,000-token turns, 50 tokens out, 5 s apart) on 1,500 GPU blocks: a
    conversation's earlier turns are often evicted from the GPU before its next turn arrives."""
    engine = {"max_model_len": 8192, "num_gpu_blocks_override": 1500, "max_num_seqs": 16}
    if kv_offload is not None:
        engine["kv_offload"] = kv_offload
    return make_scenario({
        "name": "mt", "model": "llama-3.1-8b", "gpu": "h200", "engine": engine,
        "workload": {"num_requests": num_requests, "arrival": {"process": "poisson", "rate": 4.0},
                     "prompt_len": {"dist": "fixed", "value": 1000}, "output_len": {"dist": "fixed", "value": 50},
                     "multi_turn": {"turns": 4, "think_time_s": 5.0}},
        "seed": 3})


@pytest.mark.parametrize("zero", ["cpu_bytes: 0", "num_cpu_blocks: 0"])  # under one block is refused (test_bad_input_sweep5)
def test_a_tier_of_size_zero_writes_the_same_bytes_as_no_tier(tmp_path, zero):
    base = ["run", "scenarios/lab-5-system-prompt-caching.yaml", "--set", "workload.num_requests=40",
            "--steps-format", "csv"]
    assert runner.invoke(app, [*base, "-o", str(tmp_path / "none")]).exit_code == 0
    result = runner.invoke(app, [*base, "--set", f"engine.kv_offload={{{zero}}}", "-o", str(tmp_path / "zero")])
    assert result.exit_code == 0, result.output
    for name in ("requests.csv", "steps.csv", "summary.json"):
        assert (tmp_path / "none" / name).read_bytes() == (tmp_path / "zero" / name).read_bytes(), name


def test_multi_turn_hits_the_cpu_tier_and_counts_the_loaded_tokens_as_cached():
    # (every tier's books are checked at every step in tests/test_offload_connector.py's tiny worlds)
    without = simulate(multi_turn())
    with_cpu = simulate(multi_turn({"cpu_bytes": "6GiB"}))  # 3,072 blocks: twice the GPU pool
    offload = with_cpu.summary["kv_offload"]
    assert offload["recompute_avoided_tokens"] > 0 and offload["num_loads"] > 0
    assert offload["bytes_loaded"] == offload["tiers"]["cpu"]["num_hit_blocks"] * 16 * 131072
    assert with_cpu.summary["num_preemptions"] == 0  # so every load is a first admission's
    requests = with_cpu.requests
    assert (requests["status"] == "finished").all()
    # a request's prefix hit = its GPU hit + the tokens it loaded; the GPU counters hold the GPU part only
    assert requests["prefix_hit_tokens"].sum() == (with_cpu.summary["num_prefix_cache_hit_tokens"]
                                                   + offload["recompute_avoided_tokens"])
    assert requests["prefix_hit_tokens"].sum() > without.requests["prefix_hit_tokens"].sum()
    assert with_cpu.summary["ttft_s"]["mean"] < without.summary["ttft_s"]["mean"]


def test_kv_offload_summary_through_the_cli(tmp_path):
    out = tmp_path / "run"
    result = runner.invoke(app, ["run", "--set", "workload.num_requests=20", "--set",
                                 "engine.kv_offload={cpu_bytes: 1GiB, bandwidth_bytes_per_s: 32e9}", "-o", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    cpu = summary["kv_offload"]["tiers"]["cpu"]
    assert cpu["num_blocks"] == 2**30 // (16 * 131072)  # Llama-3.1-8B, TP 1: 2 MiB per block
    assert cpu["load_bandwidth_bytes_per_s"] == 32e9


def test_a_loaded_request_stuck_behind_a_higher_priority_head_is_vllms_deadlock_said_in_one_line():
    """A pool that holds one 64-token request (9 usable blocks of 8), a 16-token budget, priority classes. A
    low-priority request loads its evicted prefix back from the CPU tier, taking its prompt's blocks, while a
    high-priority one that was preempted heads the queue: the head cannot fit while the loaded request holds
    its blocks, nothing runs to free any, and admission stops at the head. vLLM's scheduler waits forever
    there (its priority queue takes the higher-priority head first); kvsim ended with a RuntimeError traceback
    ("scheduler stalled"). Under FCFS, loaded requests are admitted first and all 5 finish; so they do under
    the priority policy with room for both requests."""
    raw = {"model": "llama-3.1-8b", "seed": 1, "latency": {"model": "constant"},
           "engine": {"block_size": 8, "max_model_len": 64, "num_gpu_blocks_override": 10,
                      "max_num_seqs": 16, "max_num_batched_tokens": 16, "scheduling_policy": "priority",
                      "kv_offload": {"num_cpu_blocks": 39}},
           "workload": {"num_requests": 5, "arrival": {"process": "poisson", "rate": 1e4},
                        "prompt_len": {"dist": "uniform", "low": 26, "high": 31},
                        "output_len": {"dist": "fixed", "value": 14},
                        "priority": {"classes": [{"name": "hi", "priority": 0, "weight": 1},
                                                 {"name": "lo", "priority": 1, "weight": 2}]}}}
    with pytest.raises(KvsimError) as stalled:
        kvsim.simulate(raw, check=True)
    message = str(stalled.value)
    assert "\n" not in message and message.startswith("engine.scheduling_policy=priority: request ")
    assert "engine.kv_offload's tiers" in message and "vLLM's scheduler waits forever there" in message
    assert kvsim.simulate(raw, check=True, engine__scheduling_policy="fcfs").summary["num_finished"] == 5
    assert kvsim.simulate(raw, check=True, engine__num_gpu_blocks_override=20).summary["num_finished"] == 5


def test_under_fcfs_requests_holding_loaded_kv_are_admitted_before_a_preempted_one():
    """vLLM keeps a request loading its KV in its skipped queue, which FCFS admission takes before the waiting
    queue. kvsim put a preempted request back at the front, ahead of a loaded one: here the preempted one could
    not fit while the loaded one held its blocks, nothing was left running, and the run stalled (RuntimeError
    "scheduler stalled", 17 waiting). The loaded request now goes first and every request finishes. (Its loads are
    of decoded tokens' blocks, which vLLM stores only with offload_prompt_only false.)"""
    raw = {"model": "opt-13b", "seed": 5, "latency": {"model": "constant"},
           "engine": {"block_size": 8, "max_model_len": 128, "num_gpu_blocks_override": 17, "max_num_seqs": 2,
                      "kv_offload": {"num_cpu_blocks": 6, "offload_prompt_only": False}},
           "workload": {"num_requests": 24, "arrival": {"process": "poisson", "rate": 1000},
                        "prompt_len": {"dist": "fixed", "value": 30},
                        "output_len": {"dist": "uniform", "low": 28, "high": 48},
                        "shared_prefix": {"tokens": 12, "fraction": 0.5, "num_prefixes": 2}}}
    result = kvsim.simulate(raw, check=True)
    assert result.summary["num_finished"] == 24 and result.summary["kv_offload"]["num_loads"] > 0


def test_loaded_first_moves_every_loaded_request_ahead_of_a_victim_between_them():
    """Queue by hand: C (its load ended last, so prepended last), B (preempted after A's load ended), A (loaded).
    vLLM's FCFS admission takes its skipped queue (A, C) before the waiting queue (B): both loaded requests go
    ahead of B, keeping their order, though the head C is already a loaded one."""
    from types import SimpleNamespace

    from kvsim.sched.offload import OffloadScheduling
    from kvsim.sched.request_queue import make_request_queue
    from tests.conftest import make_request

    a, b, c, d = (make_request(rid, 0.0, 10, 5) for rid in range(4))
    waiting = make_request_queue("fcfs")
    for req in (d, a):
        waiting.add(req)
    waiting.prepend(b)
    waiting.prepend(c)  # C, B, A, D
    engine = SimpleNamespace(waiting=waiting, held_kv_tokens={a.request_id: 10, c.request_id: 10}, load_waiters=set())
    OffloadScheduling.loaded_first(engine)  # type: ignore[arg-type]
    assert [req.request_id for req in waiting] == [c.request_id, a.request_id, b.request_id, d.request_id]
    OffloadScheduling.loaded_first(engine)  # type: ignore[arg-type]  # already in front: nothing moves
    assert [req.request_id for req in waiting] == [c.request_id, a.request_id, b.request_id, d.request_id]


def test_a_request_waiting_for_another_s_load_stays_ahead_of_a_later_victim():
    """Review 27. D sat a step out for C's load of its hit (`waits_for_a_transfer`) and went back to the front, ahead
    of E; the next step preempted B, which a preemption puts at the very front: B, D, E. vLLM puts D in its skipped
    queue (`step_skipped_waiting`, then `skipped_waiting`) and B in the waiting queue, and FCFS admission takes the
    skipped queue first (`_select_waiting_queue_for_scheduling`: `self.skipped_waiting or self.waiting`): D, B, E.
    kvsim admitted B first."""
    from types import SimpleNamespace

    from kvsim.sched.offload import OffloadScheduling
    from kvsim.sched.request_queue import make_request_queue
    from tests.conftest import make_request

    b, d, e = (make_request(rid, 0.0, 10, 5) for rid in (1, 3, 4))
    waiting = make_request_queue("fcfs")
    waiting.add(e)
    waiting.prepend(d)
    waiting.prepend(b)  # B, D, E
    engine = SimpleNamespace(waiting=waiting, held_kv_tokens={}, load_waiters={d.request_id})
    OffloadScheduling.loaded_first(engine)  # type: ignore[arg-type]
    assert [req.request_id for req in waiting] == [d.request_id, b.request_id, e.request_id]


def test_the_v1_admission_keeps_a_load_waiter_until_it_is_admitted():
    """The world of test_offload_connector's two loads of one prefix (A 64 tokens, B 256 evicting it, C and D =
    A + 16 new at 2 s): D waits for C's load in the 2 s step (a load waiter), and is admitted at 2.01 s, no longer
    one; the run ends with none."""
    from kvsim.engine.loop import run_engine
    from kvsim.kv import PagedAllocator, TokenContent
    from kvsim.latency.base import ConstantLatency
    from kvsim.sched import SchedulerLimits, make_scheduler
    from kvsim.workload.request import Request
    from tests.test_offload_connector import STEP_S, connector

    a, b = list(range(64)), list(range(1000, 1256))
    tokens = [a, b, a + list(range(5000, 5016)), a + list(range(6000, 6016))]
    requests = [Request(i, t, len(ts), 1, TokenContent(ts)) for i, (t, ts) in enumerate(zip((0.0, 1.0, 2.0, 2.0),
                                                                                           tokens, strict=True))]
    scheduler = make_scheduler("v1", PagedAllocator(17, 16), SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=64,
                                                                            max_model_len=1024))
    scheduler.offload = connector()
    seen = []
    admit = scheduler._admit

    def admit_and_look(plan, budget, now):
        admit(plan, budget, now)
        seen.append((round(now, 6), sorted(scheduler.load_waiters)))

    scheduler._admit = admit_and_look
    run_engine(scheduler, ConstantLatency(STEP_S), requests, check=True)
    assert (2.0, [3]) in seen and (2.01, []) in seen and seen[-1][1] == []


def test_a_store_link_too_slow_for_its_writes_is_busy_from_the_first_store_to_the_end_and_no_more():
    """A 1 MB/s write link: the first step's blocks (MBs each) are still draining when later steps add more, so
    once the first step ends and stores, the link never idles until the run ends: busy (end − first step's end)
    ÷ the run. The bytes written ÷ the bandwidth are hundreds of times the run (the old figure, far over 1)."""
    result = kvsim.simulate(None, workload__num_requests=20,
                            engine__kv_offload={"num_cpu_blocks": 5000, "bandwidth_bytes_per_s": 1e6})
    summary, steps = result.summary, result.steps
    offload = summary["kv_offload"]
    start_s = float(result.requests["arrival_s"].min())
    first_store_s = float(steps["time_s"].iloc[0] + steps["duration_s"].iloc[0])
    assert offload["bytes_stored"] / 1e6 > 100 * summary["duration_s"]
    assert offload["store_link_busy_fraction"] == pytest.approx(
        (start_s + summary["duration_s"] - first_store_s) / summary["duration_s"], rel=1e-9)


def test_radix_beside_an_offload_tier_with_caching_off_is_unread_and_runs_as_the_hash_chain():
    """With `enable_prefix_caching: false` no GPU prefix cache is built (`make_allocator`: a radix tree only where
    caching is on), so `prefix_cache: radix` is unread and the engine is the hash chain's: same requests table,
    same tier counts. It was refused, `kv_offload needs prefix_cache=hash_chain (got radix)`, though nothing read
    it. With caching on the radix tree would be the GPU cache, whose blocks the tiers do not hold: still refused."""
    def scenario(prefix_cache, caching):
        raw = multi_turn({"cpu_bytes": "6GiB"}, num_requests=12).model_dump(mode="json")
        raw["engine"].update(prefix_cache=prefix_cache, enable_prefix_caching=caching)
        return make_scenario(raw)

    radix, chain = simulate(scenario("radix", False)), simulate(scenario("hash_chain", False))
    assert radix.summary["kv_offload"]["num_loads"] > 0  # the tier serves: a conversation's turns load from it
    assert radix.requests.equals(chain.requests) and radix.summary["kv_offload"] == chain.summary["kv_offload"]
    with pytest.raises(KvsimError, match=r"kv_offload with enable_prefix_caching needs prefix_cache=hash_chain "
                                         r"\(got radix\)"):
        scenario("radix", True)
