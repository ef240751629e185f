import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from cs_helpers import Driver, allocation_state, check_invariants, multi_chain_config

from cluster_state import (
    ClusterStore,
    EventsCompacted,
    SnapshotError,
    Topology,
    get_group,
    get_summary,
    get_vc,
    list_groups,
    release,
    set_node_health,
    submit,
    synthetic_config,
)
from consensus.messages import Command
from consensus.statemachine import StateMachine


def store() -> ClusterStore:
    return ClusterStore(multi_chain_config())


def test_store_is_a_state_machine() -> None:
    machine: StateMachine = store()  # checked by mypy; at run time just use it
    assert msgpack.unpackb(machine.query(get_summary()))[0] == "summary"


def test_retried_command_takes_effect_once() -> None:
    s = store()
    first = s.apply(1, Command(client_id=7, seq=1, op=submit("g", "VC1", 10, [(1, 8)])))
    s.apply(2, Command(client_id=8, seq=1, op=release("g")))
    # the same (client, seq) proposed again later: the first answer, and no new group
    again = s.apply(3, Command(client_id=7, seq=1, op=submit("g", "VC1", 10, [(1, 8)])))
    assert again == first
    assert msgpack.unpackb(s.query(get_group("g")))[2] is None
    assert s.revision == 2
    # a retried release does not fail the second time either
    assert s.apply(4, Command(client_id=8, seq=1, op=release("g"))) == msgpack.packb(
        ["released", "g", []]
    )


INVALID = [
    b"\xc1",
    msgpack.packb("submit"),
    msgpack.packb([]),
    msgpack.packb(["submit"]),
    msgpack.packb(["submit", ["g", "VC1", 1, [[1, 1]], "", ""]]),
    msgpack.packb(["nope", "x"]),
    msgpack.packb(["release", 5]),
    msgpack.packb(["node_health", "dgx-a0", "yes"]),
    msgpack.packb(["bind", ["g", "VC1", 1, [[1, 1]], "", "", False], [["dgx-a0", [-1]]], 0]),
    msgpack.packb(["bind", ["g", "VC1", 1, [[1, 1]], "", "", False], [["dgx-a0", [0]]], "0"]),
    submit("g", "NOPE", 1, [(1, 1)]),
    submit("g", "VC1", 1001, [(1, 1)]),
    submit("g", "VC1", -2, [(1, 1)]),
    msgpack.packb(["submit", ["g", "VC1", True, [[1, 1]], "", "", False]]),
    submit("g", "VC1", -1, [(1, 1)], pinned="VC1-PIN"),
    submit("g", "VC1", 1, [(1, 1)], pinned="NOPE"),
    submit("g", "VC1", 1, []),
    submit("g", "VC1", 1, [(0, 1)]),
    submit("g", "VC1", 1, [(1, 0)]),
    submit("g", "VC1", 1, [(5000, 1)]),
    msgpack.packb(["submit", ["g", "VC1", 1, [[1]], "", "", False]]),
    submit("g", "VC1", 1, [(1, 16)]),
    submit("g", "VC1", 1, [(1, 1)], leaf_type="P100"),
    submit("g", "VC3", 1, [(1, 1)], leaf_type="K80"),
    submit("", "VC1", 1, [(1, 1)]),
    submit("g" * 300, "VC1", 1, [(1, 1)]),
    msgpack.packb(["submit", ["g", "VC1", 1, [[1, 1]], "", "", 1]]),
]


@pytest.mark.parametrize("op", INVALID)
def test_invalid_requests_answer_an_error_and_change_nothing(op: bytes) -> None:
    s = store()
    driver = Driver(s)
    driver.apply(submit("a", "VC1", 10, [(1, 2)], leaf_type="V100"))
    driver.apply(submit("o", "VC3", -1, [(1, 8)]))
    before = s.snapshot()
    events = s.events_since(-1)
    result = driver.apply(op)
    assert result[0] == "error" and isinstance(result[1], str) and result[1]
    assert s.snapshot() == before  # not even a session entry: a retry gets the same answer
    assert s.events_since(-1) == events


@pytest.mark.parametrize(
    ("op", "reason"),
    [
        (release("nope"), "no group 'nope'"),
        (submit("a", "VC1", 11, [(1, 2)], leaf_type="V100"), "already exists with a different"),
    ],
)
def test_state_dependent_errors_change_no_allocation(op: bytes, reason: str) -> None:
    s = store()
    driver = Driver(s)
    driver.apply(submit("a", "VC1", 10, [(1, 2)], leaf_type="V100"))
    before = allocation_state(s)
    result = driver.apply(op)
    assert result[0] == "error" and reason in result[1]
    assert allocation_state(s) == before


def _random_ops(rng: random.Random, n: int, vcs: list[str], nodes: list[str]) -> list[bytes]:
    ops: list[bytes] = []
    names: list[str] = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.55 or not names:
            name = f"g{i}"
            names.append(name)
            members = rng.choice([[(1, 1)], [(1, 2)], [(1, 8)], [(2, 8), (1, 4)], [(2, 2)]])
            priority = rng.choice([-1, 0, 5, 10, 500, 1000])
            ops.append(submit(name, rng.choice(vcs), priority, members, lazy=rng.random() < 0.3))
        elif roll < 0.9:
            ops.append(release(names.pop(rng.randrange(len(names)))))
        else:
            ops.append(set_node_health(rng.choice(nodes), rng.random() < 0.6))
    return ops


def test_same_log_gives_byte_identical_snapshots_and_restore_continues_identically() -> None:
    config = synthetic_config(nodes=32, gpus_per_node=8, nodes_per_rack=4, vcs=3, pinned=1)
    topo = Topology(config)
    a, b = ClusterStore(config), ClusterStore(topo)
    ops = _random_ops(random.Random(5), 400, list(topo.vcs), sorted(topo.nodes))
    for position, op in enumerate(ops[:300]):
        command = Command(client_id=position % 3, seq=position, op=op)
        assert a.apply(position, command) == b.apply(position, command)
    check_invariants(a.allocator)
    snap = a.snapshot()
    assert snap == b.snapshot()
    c = ClusterStore(topo)
    c.restore(snap)
    assert c.snapshot() == snap
    assert allocation_state(c) == allocation_state(a)
    assert c.events_since(250) == a.events_since(250)
    for position, op in enumerate(ops[300:], start=300):
        command = Command(client_id=position % 3, seq=position, op=op)
        assert a.apply(position, command) == c.apply(position, command)
    assert a.snapshot() == c.snapshot()
    check_invariants(c.allocator)


def test_restore_rejects_foreign_or_broken_snapshots() -> None:
    s = store()
    other = ClusterStore(synthetic_config(nodes=8, nodes_per_rack=4, vcs=2))
    format_1 = msgpack.unpackb(other.snapshot())[:7]  # (nor the log's configurations)
    del format_1[2]  # format 1 carried no configuration
    format_1[0] = 1
    with pytest.raises(SnapshotError, match="different cluster configuration"):
        s.restore(msgpack.packb(format_1))
    lying = msgpack.unpackb(other.snapshot())
    lying[1] = b"\x00" * 32
    with pytest.raises(SnapshotError, match="does not match its digest"):
        s.restore(msgpack.packb(lying))
    with pytest.raises(SnapshotError):
        s.restore(b"\x00garbage")
    with pytest.raises(SnapshotError, match="format"):
        s.restore(msgpack.packb([99, b"", 0, [], [], []]))


def test_events_carry_revisions_and_compaction_is_reported() -> None:
    s = ClusterStore(multi_chain_config(), event_limit=3)
    driver = Driver(s)
    driver.apply(submit("a", "VC1", 10, [(1, 2)], leaf_type="V100"))  # position 1
    driver.apply(submit("b", "VC1", 10, [(1, 2)], leaf_type="V100"))  # 2
    events = s.events_since(0)
    assert [(e.revision, e.kind, e.subject) for e in events] == [
        (1, "placed", "a"),
        (2, "placed", "b"),
    ]
    assert events[0].data[2] == 1  # the fencing token
    assert s.events_since(2) == []
    driver.apply(release("a"))  # 3
    driver.apply(set_node_health("dgx-a0", False))  # 4: the 4th event drops the 1st
    assert [e.revision for e in s.events_since(1)] == [2, 3, 4]
    with pytest.raises(EventsCompacted) as info:
        s.events_since(0)
    assert info.value.oldest == 1
    assert s.events_since(3)[0].kind == "node_health"


def test_queries_read_without_changing_state() -> None:
    s = store()
    driver = Driver(s)
    driver.apply(submit("a", "VC1", 10, [(1, 2)], leaf_type="V100"))
    driver.apply(submit("b", "VC2", 10, [(1, 2)], leaf_type="K80"))
    before = s.snapshot()
    group = driver.query(get_group("a"))
    assert group[0] == "group" and group[1] == 2 and group[2]["pods"][0][1] == "dgx-b1"
    assert driver.query(get_group("zz")) == ["group", 2, None]
    vc = driver.query(get_vc("VC2"))[2]
    assert vc["leaves"] == {"total": 32 + 8, "used": 2, "reserved": 0, "bad_held": 0}
    names = [g["name"] for g in driver.query(list_groups(""))[2]]
    assert names == ["a", "b"]
    assert [g["name"] for g in driver.query(list_groups("VC2"))[2]] == ["b"]
    assert driver.query(list_groups("NOPE"))[0] == "error"
    assert driver.query(get_vc("NOPE")) == ["error", "unknown virtual cluster 'NOPE'"]
    assert driver.query(submit("x", "VC1", 1, [(1, 1)]))[0] == "error"
    assert driver.query(b"\xc1")[0] == "error"
    summary: dict[str, Any] = driver.query(get_summary())[2]
    v100 = next(c for c in summary["chains"] if c["name"] == "V100-RACK")
    assert (v100["leaves"], v100["guaranteed"], v100["free"]) == (64, 2, 62)
    assert min(v100["surplus"]) >= 0
    assert s.snapshot() == before


def test_fencing_tokens_are_log_positions() -> None:
    s = store()
    tokens = []
    for position, name in [(10, "a"), (25, "b"), (40, "c")]:
        op = submit(name, "VC1", 10, [(1, 1)], leaf_type="V100")
        out = msgpack.unpackb(s.apply(position, Command(client_id=1, seq=position, op=op)))
        tokens.append(out[4])
    assert tokens == [10, 25, 40]
    assert s.revision == 40


_REPLAY = """
import hashlib, random, sys
sys.path.insert(0, {tests!r})
from test_store import _random_ops
from cluster_state import ClusterStore, Topology, synthetic_config
from consensus.messages import Command
topo = Topology(synthetic_config(nodes=32, nodes_per_rack=4, vcs=3, pinned=1))
store = ClusterStore(topo)
ops = _random_ops(random.Random(9), 300, list(topo.vcs), sorted(topo.nodes))
for position, op in enumerate(ops):
    store.apply(position, Command(client_id=1, seq=position, op=op))
print(hashlib.sha256(store.snapshot()).hexdigest())
"""


def test_snapshots_do_not_depend_on_the_process_hash_seed() -> None:
    """Set and dict orders of strings vary with PYTHONHASHSEED; replicas must not."""
    here = Path(__file__).resolve().parent
    script = _REPLAY.format(tests=str(here))
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", script],
            cwd=here.parent.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        digests.add(out.stdout.strip())
    assert len(digests) == 1
    topo = Topology(synthetic_config(nodes=32, nodes_per_rack=4, vcs=3, pinned=1))
    local = ClusterStore(topo)
    ops = _random_ops(random.Random(9), 300, list(topo.vcs), sorted(topo.nodes))
    for position, op in enumerate(ops):
        local.apply(position, Command(client_id=1, seq=position, op=op))
    assert digests == {hashlib.sha256(local.snapshot()).hexdigest()}
