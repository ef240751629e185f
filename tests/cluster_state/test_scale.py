"""What keeps a 100k-GPU store fast (issue 27): compact configuration text, parsing once per
text, shared inferred subtrees, the packed snapshot format and the one-pass index rebuild of a
restore — each checked against the slow, obvious way it replaces."""

import json
import random

import msgpack
from cs_helpers import check_invariants, multi_chain_config

from cluster_state import (
    ClusterStore,
    Topology,
    parse_config,
    release,
    set_node_health,
    submit,
    synthetic_config,
)
from cluster_state.config import ClusterConfig
from cluster_state.index import CellState
from cluster_state.ops import claim
from cluster_state.store import SNAPSHOT_FORMAT
from consensus.messages import Command

EXPLICIT_NODE = """
physicalCluster:
  cellTypes:
    K80-2GPU: {childCellType: K80, childCellNumber: 2}
    K80-NODE: {childCellType: K80-2GPU, childCellNumber: 2, isNodeLevel: true}
    K80-RACK: {childCellType: K80-NODE, childCellNumber: 3}
  physicalCells:
  - cellType: K80-RACK
    cellChildren:
    - cellAddress: n0
    - cellAddress: n1
      cellChildren:
      - cellChildren: [{cellAddress: 1}, {cellAddress: 3}]
      - cellChildren: [{cellAddress: 0}, {cellAddress: 2}]
    - cellAddress: n2
      cellChildren:
      - {}
virtualClusters:
  VC1: {virtualCells: [{cellType: K80-RACK.K80-NODE, cellNumber: 1}]}
"""


def test_compact_yaml_leaves_out_only_what_parsing_infers() -> None:
    config = parse_config(EXPLICIT_NODE)
    text = config.to_yaml()
    again = parse_config(text)
    assert again == config
    assert Topology(again).digest == Topology(config).digest
    nodes = {c["cellAddress"]: c for c in config.to_dict(compact=True)["physicalCluster"][
        "physicalCells"][0]["cellChildren"]}
    assert "cellChildren" not in nodes["n0"]  # inferred: left out
    assert "cellChildren" in nodes["n1"]  # non-standard device indices: kept
    assert len(nodes["n2"]["cellChildren"]) == 1  # partly filled: kept


def test_a_large_synthetic_configuration_round_trips_compactly() -> None:
    config = synthetic_config(nodes=256, vcs=8, pinned=2)
    text = config.to_yaml()
    full = json.dumps(config.to_dict())
    assert len(text) * 5 < len(full)  # the nodes' insides are left out
    again = parse_config(text)
    assert again == config
    assert Topology(again).digest == Topology(config).digest


def test_inferred_subtrees_are_shared_and_equal_to_built_ones() -> None:
    config = synthetic_config(nodes=16, vcs=2)
    node_a = config.physical_cells[0].children[0]
    node_b = config.physical_cells[1].children[3]
    assert node_a.children[0] is node_b.children[0]  # one object for every node
    # ... and the same as spelling the node out in full
    spelled = parse_config(json.dumps(config.to_dict()))
    assert spelled == config


def test_the_same_text_is_parsed_once() -> None:
    text = synthetic_config(nodes=32, vcs=4).to_yaml()
    first = parse_config(text)
    assert parse_config(text) is first
    assert ClusterStore(parse_config(text)).topology is ClusterStore(first).topology
    assert parse_config(text + "\n") == first  # another text: parsed again, same config


def test_a_json_configuration_parses_like_its_yaml() -> None:
    config = synthetic_config(nodes=16, vcs=2, pinned=1)
    assert parse_config(json.dumps(config.to_dict(compact=True))) == config


def _run(store: ClusterStore, steps: int, seed: int, start: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    vcs = [vc.name for vc in store.topology.config.virtual_clusters]
    live: list[str] = []
    results = []
    for position in range(start, start + steps):
        if live and rng.random() < 0.4:
            op = release(live.pop(rng.randrange(len(live))))
        else:
            name = f"g{position}"
            op = submit(name, rng.choice(vcs), rng.choice([-1, 0, 5, 50, 500]),
                        [(rng.choice([1, 2]), rng.choice([1, 2, 4, 8]))])
            live.append(name)
        results.append(store.apply(position, Command(client_id=1, seq=position, op=op)))
    return results


def _indexes(cells: CellState) -> list[list[list[list[int]]]]:
    return [[[list(b) for b in level] for level in index] for index in cells.buckets]


def test_a_restore_rebuilds_the_same_indexes_and_makes_the_same_choices() -> None:
    config = synthetic_config(nodes=64, vcs=4, pinned=1)
    a = ClusterStore(config)
    _run(a, 400, seed=3)
    a.apply(400, Command(client_id=2, seq=0, op=set_node_health("node0005", False)))
    b = ClusterStore(config)
    b.restore(a.snapshot())
    assert b.snapshot() == a.snapshot()
    assert _indexes(b.allocator.cells) == _indexes(a.allocator.cells)
    assert b.allocator.cells.free_n == a.allocator.cells.free_n
    assert b.allocator.cells.hist == a.allocator.cells.hist
    check_invariants(b.allocator)
    assert _run(b, 300, seed=4, start=401) == _run(a, 300, seed=4, start=401)
    assert b.snapshot() == a.snapshot()


def _as_format_2(snapshot: bytes) -> bytes:
    """The layout before format 3: the configuration as maps, leaf revisions as pairs (and,
    as before format 4, seven fields, the sessions an earlier build's list: pinned ones)."""
    fields = msgpack.unpackb(snapshot)[:7]
    fields[0] = 2
    fields[6] = fields[6][2]
    config = parse_config(msgpack.unpackb(fields[2]))
    fields[2] = config.to_dict()
    topo = Topology(config)
    state = fields[4]
    revs = msgpack.unpackb(msgpack.packb(list(memoryview(state[3]).cast("q"))))
    state[3] = [[leaf, rev] for leaf, rev in zip(topo.leaf_ids, revs, strict=True) if rev >= 0]
    packed: bytes = msgpack.packb(fields)
    return packed


def test_format_2_snapshots_still_restore() -> None:
    config: ClusterConfig = synthetic_config(nodes=32, vcs=2)
    a = ClusterStore(config)
    _run(a, 200, seed=5)
    old = _as_format_2(a.snapshot())
    elsewhere = ClusterStore(synthetic_config(nodes=16, vcs=2))  # adopts the snapshot's
    elsewhere.restore(old)
    assert elsewhere.snapshot() == a.snapshot()


def test_the_snapshot_keeps_the_configuration_compact_and_packed() -> None:
    config = synthetic_config(nodes=64, vcs=4)
    fields = msgpack.unpackb(ClusterStore(config).snapshot())
    assert fields[0] == 4
    assert isinstance(fields[2], bytes)
    assert parse_config(msgpack.unpackb(fields[2])) == config


def test_a_hundred_schedulers_retries_take_effect_once() -> None:
    """100 scheduler sessions interleaved, each with many requests in flight (up to the
    session window): any of them retried later answers its first result and changes
    nothing (issue 27 point 6)."""
    from consensus.statemachine import SESSION_WINDOW

    store = ClusterStore(synthetic_config(nodes=256, vcs=8))
    vcs = [vc.name for vc in store.topology.config.virtual_clusters]
    schedulers, per_scheduler = 100, 4
    first: dict[tuple[int, int], bytes] = {}
    position = 0
    for seq in range(per_scheduler):
        for client in range(1, schedulers + 1):
            op = submit(f"c{client}-{seq}", vcs[client % len(vcs)], 10, [(1, 1)])
            first[(client, seq)] = store.apply(position, Command(client_id=client, seq=seq,
                                                                 op=op))
            position += 1
    # one scheduler keeps going, up to a window's worth of requests after its first one
    for seq in range(per_scheduler, SESSION_WINDOW - 1):
        store.apply(position, Command(client_id=1, seq=seq, op=release(f"c1-{seq % 4}")))
        position += 1
    before = store.snapshot()
    events = len(store.events.events)
    for (client, seq), result in sorted(first.items()):
        op = submit(f"c{client}-{seq}", vcs[client % len(vcs)], 10, [(1, 1)])
        again = store.apply(position, Command(client_id=client, seq=seq, op=op))
        position += 1
        assert again == result
    assert len(store.events.events) == events
    assert store.snapshot() == before


def test_sorted_ids_behave_as_a_sorted_list() -> None:
    from bisect import insort

    from cluster_state.index import SortedIds

    rng = random.Random(7)
    ids, plain = SortedIds(), []
    for c in range(0, 3000, 3):
        ids.append(c)
        plain.append(c)
    for _ in range(20_000):  # enough to split and empty chunks many times
        c = rng.randrange(6000)
        if c in plain and rng.random() < 0.6:
            ids.remove(c)
            plain.remove(c)
        elif c not in plain:
            ids.add(c)
            insort(plain, c)
    assert list(ids) == plain and len(ids) == len(plain) and bool(ids) == bool(plain)
    for c in list(plain):
        ids.remove(c)
    assert list(ids) == [] and not ids
    ids.add(5)
    assert list(ids) == [5]


#: every per-cell table of a Topology
_CELL_TABLES = ("level", "parent", "children", "chain_of", "cell_type", "address", "node_name",
                "node_cell", "device", "pinned_of", "leaves", "desc", "ancestors", "complete",
                "nodes", "leaf_ids", "device_leaf", "pinned_cells", "level_cells")


def test_a_topology_stamps_shared_node_insides_exactly_as_built_cell_by_cell() -> None:
    # Inferred node insides are shared spec objects, stamped from the first node built;
    # spelled out in full, every node's cells are built one by one: the tables must agree.
    for config in (synthetic_config(nodes=48, nodes_per_rack=4, vcs=3, pinned=1),
                   synthetic_config(nodes=12, gpus_per_node=6, nodes_per_rack=3, vcs=2),
                   multi_chain_config()):
        spelled = parse_config(json.dumps(config.to_dict()))
        assert spelled == config
        stamped, built = Topology(config), Topology(spelled)
        for table in _CELL_TABLES:
            assert getattr(stamped, table) == getattr(built, table), table
        # and the obvious definitions hold
        for c in range(stamped.size):
            assert stamped.ancestors[c][0] == c
            assert stamped.ancestors[c][1:] == (
                stamped.ancestors[stamped.parent[c]] if stamped.parent[c] >= 0 else ())
            assert stamped.leaves[c] == stamped.desc[c][0]
            assert stamped.desc[c][-1] == (c,)


def test_first_and_later_node_cells_of_a_stamped_topology_differ_only_by_offset() -> None:
    topo = Topology(synthetic_config(nodes=16, vcs=2))
    first, later = topo.nodes["node0000"][0], topo.nodes["node0009"][0]
    size = len(topo.desc[first][0])  # 8 GPUs
    assert size == 8
    offset = later - first
    assert topo.leaves[later] == tuple(c + offset for c in topo.leaves[first])
    assert topo.address[later + 1].startswith(topo.address[later] + "/")
    assert {topo.node_cell[c] for c in range(later, later + 15)} == {later}


def _snapshot_at_once(store: ClusterStore) -> bytes:
    """The snapshot packed the obvious way: the whole state in one ``packb``."""
    packed: bytes = msgpack.packb([
        SNAPSHOT_FORMAT,
        store.topology.digest,
        msgpack.packb(store.topology.config.to_dict(compact=True)),
        store.revision,
        store.allocator.export_state(),
        store.events.to_state(),
        store.sessions.to_state(),
        [store.configured, list(store.configs)],
    ])
    return packed


def test_a_snapshot_of_kept_pieces_is_the_whole_state_packed_at_once() -> None:
    # Groups placed, preempting (victims leaving one by one), lazily downgraded, claimed,
    # released; node health; events dropped from a small log: after every command the
    # snapshot made of kept pieces is the state packed at once.
    store = ClusterStore(synthetic_config(nodes=16, nodes_per_rack=4, vcs=2), event_limit=40)
    rng = random.Random(7)
    live: dict[str, int] = {}  # group -> its incarnation
    outcomes: set[str] = set()
    for position in range(600):
        roll, submitted = rng.random(), ""
        if live and roll < 0.3:
            op = release(rng.choice(sorted(live)))
        elif live and roll < 0.4:
            name = rng.choice(sorted(live))
            op = claim(name, live[name], 0, f"uid{position}", f"ns/pod{position}",
                       rng.choice(["", f"uid{position - 1}"]))
        elif roll < 0.45:
            op = set_node_health(f"node{rng.randrange(16):04d}", rng.random() < 0.5)
        else:
            submitted = f"g{position}"
            op = submit(submitted, rng.choice(["vc00", "vc01"]),
                        rng.choice([-1, 0, 5, 50, 500]),
                        [(rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8]))],
                        lazy=rng.random() < 0.3)
        result = msgpack.unpackb(store.apply(position, Command(client_id=1, seq=position,
                                                               op=op)))
        outcomes.add(result[0])
        if submitted and submitted in store.allocator.groups:
            live[submitted] = position
        for name in [n for n in live if n not in store.allocator.groups]:
            del live[name]
        assert store.snapshot() == _snapshot_at_once(store), position
    # the run did change groups in every way a snapshot records
    assert {"placed", "preempting", "released", "claimed"} <= outcomes, outcomes
    assert {e.kind for e in store.events.events} >= {"placed", "released"}
    restored = ClusterStore(store.topology)
    restored.restore(store.snapshot())
    assert restored.snapshot() == _snapshot_at_once(restored) == store.snapshot()
