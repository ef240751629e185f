"""The simulator's public hooks (``schedule``, ``run_until``, ``on_ready``) and its typed
events: what ``bench.sim_failover`` drives it with."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import get_args

import pytest

from consensus.messages import Command
from consensus.sim import events
from consensus.sim.events import FaultCrash, Tick
from consensus.sim.simulator import SimOptions, Simulation

LAN = SimOptions(replicas=3, network="lan", ops=60, concurrency=1, think_us=1_000)
SEED = 11
#: long enough (simulated) for every one of LAN's operations to complete
PLENTY_US = 2_000_000


def test_run_until_stops_at_the_condition_or_the_deadline() -> None:
    sim = Simulation(LAN, SEED)
    sim.start()
    crash_at = 40_000
    sim.schedule(crash_at, FaultCrash(1))
    assert sim.run_until(lambda: not sim.replicas[1].alive, deadline_us=PLENTY_US)
    assert sim.now == crash_at  # stopped right after the event that made it hold
    assert sim.run_until(lambda: True, deadline_us=0)  # holds already: nothing played
    assert sim.now == crash_at
    deadline = crash_at + 10_000
    assert not sim.run_until(lambda: False, deadline_us=deadline)
    assert crash_at < sim.now <= deadline  # timers ran, nothing past the deadline
    stopped = sim.now
    assert not sim.run_until(lambda: False, deadline_us=deadline)
    assert sim.now == stopped  # the events after the deadline are still there ...
    assert not sim.run_until(lambda: False, deadline_us=deadline + 10_000)
    assert sim.now > deadline  # ... and play later


def test_on_ready_reports_each_client_command_once_it_may_be_acknowledged() -> None:
    sim = Simulation(LAN, SEED)
    seen: list[tuple[int, Command, int, int]] = []
    sim.on_ready = lambda replica, command, called: seen.append(
        (replica, command, called, sim.now))
    sim.start()
    sim.run_until(lambda: sim.result.ops_completed >= LAN.ops, deadline_us=PLENTY_US)
    assert sim.result.ops_completed == LAN.ops
    assert all(0 < called <= now and 0 <= replica < LAN.replicas
               for replica, _, called, now in seen)
    first = {(c.client_id, c.seq) for _, c, _, _ in seen}
    # every operation's first readiness is a latency sample, and each was reported
    assert len(first) == sum(len(v) for v in sim.result.ready_latency_us.values())
    blind = [op for op in sim.result.history if op.op == "write"]
    assert blind and len(first) >= len(blind)


def test_the_same_seed_replays_through_the_hooks_as_through_run() -> None:
    # run() and start() + run_until() play the same events: the same history
    whole = Simulation(LAN, SEED).run()
    assert whole.ok and len(whole.history) == LAN.ops
    sim = Simulation(LAN, SEED)
    sim.start()
    sim.run_until(lambda: sim.result.ops_completed >= LAN.ops, deadline_us=PLENTY_US)
    assert [(o.client, o.call, o.ret, o.output) for o in sim.result.history] == [
        (o.client, o.call, o.ret, o.output) for o in whole.history]


def test_events_are_small_frozen_values() -> None:
    tick = Tick(2)
    assert tick == Tick(2) and tick != Tick(1)
    assert not hasattr(tick, "__dict__")  # slotted
    with pytest.raises(FrozenInstanceError):
        tick.rid = 3  # type: ignore[misc]
    kinds = set(get_args(events.Event))
    assert {cls.__name__ for cls in kinds} == set(events.__all__) - {"Event", "InboxEvent"}
    # every kind of event has its handler: none is dropped, none falls through
    assert set(Simulation(LAN, SEED)._handlers) == kinds
