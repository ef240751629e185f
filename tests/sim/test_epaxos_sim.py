"""EPaxos in the simulator: safe and live under every fault class, checked per conflict key
(it orders only conflicting commands), its WAN latency at the nearest fast quorum, and a
simulator that catches it executing too early."""

from __future__ import annotations

import dataclasses
import statistics

import pytest

from consensus.sim.cli import parse_faults, sweep
from consensus.sim.simulator import SimOptions, Simulation

#: the RTT to the nearest majority with the site itself (DESIGN §7); with three replicas the
#: fast quorum (F + floor((F+1)/2) = 2) is that majority
NEAREST_MAJORITY_MS = {"CA": 20, "OR": 20, "OH": 52}


@pytest.mark.parametrize(("replicas", "seeds"), [(3, range(1, 9)), (5, range(1, 4))])
def test_every_fault_class_is_survived(replicas: int, seeds: range) -> None:
    options = SimOptions(protocol="epaxos", replicas=replicas, faults=parse_faults("all"),
                         ops=120)
    report = sweep(options, seeds)
    assert report["violations"] == [], report["violations"][:1]
    assert report["liveness_failures"] == [], report["liveness_failures"][:1]
    # every operation ends: completed, or failed for good (settled as never applied)
    assert report["ops_completed"] + report["ops_failed"] == len(seeds) * 120


def test_snapshots_and_keyless_commands_under_faults() -> None:
    # commands naming no keys conflict with everything; replicas behind a compaction point
    # install a peer's snapshot only when it covers everything they executed
    options = SimOptions(protocol="epaxos", faults=parse_faults("all"), network="lan",
                         ops=150, keyless=0.2, snapshot_every=15)
    report = sweep(options, range(1, 6))
    assert report["violations"] == [], report["violations"][:1]
    assert report["liveness_failures"] == [], report["liveness_failures"][:1]


def test_same_seed_replays_exactly() -> None:
    options = SimOptions(protocol="epaxos", faults=parse_faults("all"), network="lan", ops=80)
    first, second = Simulation(options, 5).run(), Simulation(options, 5).run()
    assert first.history == second.history and first.messages == second.messages
    assert Simulation(options, 6).run().history != first.history


def test_fast_path_latency_is_the_nearest_majority_on_the_wan() -> None:
    # one client per site and a write-only workload on keys of its own: no conflicts, so
    # every command commits on the fast path, one round trip to the nearest replica
    options = SimOptions(protocol="epaxos", replicas=3, concurrency=1, ops=90,
                         workload="writes")
    result = Simulation(options, 3).run()
    assert result.ok, result.violation or result.liveness
    p50 = {site: statistics.median(v) / 1000 for site, v in result.ready_latency_us.items()}
    for site, bound in NEAREST_MAJORITY_MS.items():
        assert bound <= p50[site] <= 2 * bound, (site, p50)
    assert p50["CA"] == NEAREST_MAJORITY_MS["CA"]


# (Found by ``sdpaxos sim --protocol epaxos --unsafe epaxos_exec_uncommitted``: the run
# replays exactly, so it stays caught while the checker has teeth.)
def test_executing_before_a_dependency_commits_is_caught() -> None:
    options = SimOptions(protocol="epaxos", replicas=3, ops=60)
    unsafe = dataclasses.replace(options, unsafe=frozenset({"epaxos_exec_uncommitted"}))
    caught = Simulation(unsafe, 1).run()
    assert caught.violation is not None and "on key" in caught.violation
    assert Simulation(options, 1).run().ok


# The optimized fast quorum (3 of 5) is safe only with TryPreAccept's conflict checks: a
# recovery that pre-accepts the owner's attributes at replicas knowing a conflicting command
# outside them, or that ignores the replicas that pre-accepted them, changes or orders
# differently a command that may have committed on the fast path. (Seeds found by
# ``sdpaxos sim --protocol epaxos --replicas 5 --faults all --unsafe VARIANT``.)
@pytest.mark.parametrize(("variant", "seed"), [
    ("epaxos_try_ignores_conflicts", 32),
    ("epaxos_recovery_ignores_preaccepted", 5),
])
def test_a_recovery_that_skips_try_pre_accept_checks_is_caught(variant: str, seed: int) -> None:
    options = SimOptions(protocol="epaxos", replicas=5, faults=parse_faults("all"))
    caught = Simulation(dataclasses.replace(options, unsafe=frozenset({variant})), seed).run()
    assert caught.violation is not None and "on key" in caught.violation
    assert Simulation(options, seed).run().ok
