"""The apply path's fast paths give what the plain scans they replace give, on the states a
random scheduler workload (the alloc-e2e job mix, node failures) leaves behind: the buddy
system's choice of a clean cell to bind (``Buddy.find_cell`` in ``CLEAN`` mode), the first
pass's best node and leaves (``Picker.best_node`` and ``Picker.pick`` without a threshold),
and the lazily kept free-capacity indexes (``CellState.candidates``)."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator

import msgpack
from cs_helpers import check_invariants, multi_chain_config
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_state import ClusterStore, ops, synthetic_config
from cluster_state.buddy import CLEAN, Buddy
from cluster_state.errors import RequestError
from cluster_state.index import CellState
from cluster_state.ops import OPPORTUNISTIC, GroupSpec, Member
from cluster_state.placement import Picker
from cluster_state.workload import next_job
from consensus.messages import Command

#: jobs in flight: enough to fill the small cluster now and then
IN_FLIGHT = 24
STEPS = 400
#: of the steps, about this share mark a node bad or healthy, and below this one release
NODE_FLIPS = 0.03
RELEASES = 0.4


def _plain_clean_cell(buddy: Buddy, chain: int, level: int) -> int:
    """``find_cell(chain, level, CLEAN)`` as a plain scan of the free lists (the rule)."""
    topo, cells = buddy.topo, buddy.cells
    levels = topo.chains[chain].levels
    size = levels[level - 1].leaf_number
    for lv in range(level, len(levels) + 1):
        listed = buddy.free[chain][lv - 1]
        if not listed or not buddy.safe_take(chain, level, lv):
            continue
        for f in listed:
            if cells.free_n[f] == levels[lv - 1].leaf_number:
                return topo.desc[f][level - 1][0]
            for c in (f,) if lv == level else topo.desc[f][level - 1]:
                if not cells.bad_n[c] and cells.free_n[c] == size:
                    return c
    return -1


def _plain_best_node(picker: Picker, nodes: list[int], need: int) -> int:
    """The first pass's best node by its rule: fewest available leaves that fit, lowest id."""
    fitting = [(picker.avail(n), n) for n in nodes if picker.avail(n) >= need]
    return min(fitting)[1] if fitting else -1


def _plain_pick(picker: Picker, c: int, need: int, out: list[int]) -> None:
    """``need`` leaves under ``c`` by the picking rule: into the child with the fewest
    available leaves that holds them all (lowest id on a tie); if none does, from the
    fullest children first (lowest id on a tie)."""
    topo = picker.topo
    if topo.level[c] == 1:
        out.append(c)
        return
    kids = [(picker.avail(k), k) for k in topo.children[c] if picker.avail(k) > 0]
    fitting = [(a, k) for a, k in kids if a >= need]
    if fitting:
        _plain_pick(picker, min(fitting)[1], need, out)
        return
    for a, k in sorted(kids, key=lambda ak: (-ak[0], ak[1])):
        n = min(a, need)
        _plain_pick(picker, k, n, out)
        need -= n
        if not need:
            return


def _chain_of_index(cells: CellState, index: int) -> int:
    """The chain whose cells index ``index`` lists (a chain's, a key's or a free region's)."""
    first_key, first_region = cells.n_chains, cells.n_chains + cells.n_keys
    if index < first_key:
        return index
    if index < first_region:
        return cells.topo.key_chain[index - first_key]
    return index - first_region


def _plain_candidates(cells: CellState, index: int, level: int, need: int) -> list[int]:
    """``candidates`` by their definition, from the state alone (see ``cluster_state.index``):
    the index's cells of ``level`` with at least ``need`` free leaves, fewest first, then id."""
    topo = cells.topo
    first_key, first_region = cells.n_chains, cells.n_chains + cells.n_keys
    listed = []
    for c in topo.level_cells[_chain_of_index(cells, index)][level - 1]:
        if index < first_key:
            belongs = level >= 2
        elif index < first_region:
            item = cells.item_of[c]
            belongs = (item >= 0 and cells.key_of_item[item] == index - first_key
                       and (level >= 2 or cells.item_root[item] == c))
        else:
            belongs = level >= 2 and cells.in_region[c]
        if belongs and cells.free_n[c] >= max(need, 1):
            listed.append((cells.free_n[c], c))
    return [c for _, c in sorted(listed)]


def _workload(seed: int) -> Iterator[ClusterStore]:
    """The store after each step of a random workload: submits of the alloc-e2e job mix,
    releases, nodes failing and coming back (look at it before asking for the next)."""
    config = synthetic_config(nodes=32, vcs=4, pinned=1)
    store = ClusterStore(config)
    rng = random.Random(seed)
    names = [vc.name for vc in config.virtual_clusters]
    nodes = sorted(store.topology.nodes)
    running: deque[str] = deque()
    for position in range(STEPS):
        roll = rng.random()
        if roll < NODE_FLIPS:
            op = ops.set_node_health(rng.choice(nodes), rng.random() < 0.5)
        elif len(running) >= IN_FLIGHT or (running and roll < RELEASES):
            op = ops.release(running.popleft())
        else:
            job = next_job(rng, f"j{position}", names, mean_duration_s=1.0)
            op = ops.submit(job.name, job.vc, job.priority, job.members)
            running.append(job.name)
        result = msgpack.unpackb(store.apply(position, Command(client_id=1, seq=position,
                                                                 op=op)))
        if result[0] in ("waiting", "error") and running and running[-1] == result[1]:
            running.pop()  # nothing to release
        yield store


def test_find_cell_clean_is_the_plain_scan() -> None:
    compared = found = 0
    for store in _workload(seed=3):
        buddy, topo = store.allocator.buddy, store.topology
        for chain, info in enumerate(topo.chains):
            for level in range(1, info.top_level + 1):
                expected = _plain_clean_cell(buddy, chain, level)
                assert buddy.find_cell(chain, level, CLEAN) == expected
                compared += 1
                found += expected >= 0
    assert found and found < compared  # both outcomes were checked


def test_best_node_of_the_first_pass_is_the_plain_rule() -> None:
    rng = random.Random(5)
    compared = 0
    for store in _workload(seed=4):
        topo, cells = store.topology, store.allocator.cells
        chain = topo.chains[0]
        nodes = list(topo.level_cells[0][chain.node_level - 1])
        rng.shuffle(nodes)  # the rule breaks ties by id, whatever the order given
        picker = Picker(topo, cells, None)
        for need in (rng.randint(1, 8) for _ in range(3)):  # later pods see the taken ones
            best = picker.best_node(nodes, need)
            assert best == _plain_best_node(picker, nodes, need)
            compared += 1
            if best < 0:
                break
            picker.pick(best, need)
    assert compared > STEPS


def test_the_job_mix_keeps_every_derived_structure_exact() -> None:
    for step, store in enumerate(_workload(seed=6)):
        if step % 20 == 0:
            check_invariants(store.allocator)
    check_invariants(store.allocator)


def test_a_final_pack_places_the_pods_a_remembering_pack_places() -> None:
    rng = random.Random(8)
    compared = 0
    for store in _workload(seed=9):
        topo, cells = store.topology, store.allocator.cells
        chain = topo.chains[0]
        racks = list(topo.level_cells[0][chain.top_level - 1])
        nodes = Picker(topo, cells, None).nodes([rng.choice(racks)], chain.node_level)
        sizes = [rng.choice((1, 2, 4, 8)) for _ in range(rng.randint(1, 3))]
        order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
        final = Picker(topo, cells, None).pack(nodes, sizes, order, final=True)
        assert final == Picker(topo, cells, None).pack(nodes, sizes, order)
        compared += final is not None
    assert compared


def test_the_first_pass_picks_the_leaves_the_plain_rule_picks() -> None:
    rng = random.Random(10)
    compared = 0
    for store in _workload(seed=11):
        topo, cells = store.topology, store.allocator.cells
        chain = topo.chains[0]
        picker, plain = Picker(topo, cells, None), Picker(topo, cells, None)
        for _ in range(3):  # later pods see the leaves taken before them
            root = rng.choice(topo.level_cells[0][rng.randint(2, chain.top_level) - 1])
            if not picker.avail(root):
                continue
            need = rng.randint(1, picker.avail(root))
            expected: list[int] = []
            _plain_pick(plain, root, need, expected)
            assert picker.pick(root, need) == plain.pick(root, need) == tuple(sorted(expected))
            compared += 1
    assert compared > STEPS


def test_the_lazy_indexes_read_as_the_state_says() -> None:
    # Each step reads a few indexes and levels only, so the others stay stale for many steps
    # (placements, releases, bindings, nodes failing) before they are read.
    rng = random.Random(12)
    compared = 0
    for store in _workload(seed=13):
        cells = store.allocator.cells
        indexes = cells.n_chains * 2 + cells.n_keys
        for _ in range(3):
            index = rng.randrange(indexes)
            level = rng.randint(1, cells.topo.chains[_chain_of_index(cells, index)].top_level)
            need = rng.choice((0, 1, 2, 4, 8))
            assert (list(cells.candidates(index, level, need))
                    == _plain_candidates(cells, index, level, need))
            compared += 1
    check_invariants(store.allocator)  # and every index, read at last, is exact
    assert compared == 3 * STEPS


MEMBERS = st.lists(st.tuples(st.integers(1, 3), st.integers(1, 10)), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(vc=st.sampled_from(["VC1", "VC2", "VC3", "VC9"]),
       leaf_type=st.sampled_from(["", "V100", "K80", "P100"]),
       pinned=st.sampled_from(["", "VC1-PIN", "VC2-PIN"]),
       priority=st.sampled_from([-1, 0, 100]), members=MEMBERS, more=st.integers(1, 4))
def test_the_chains_kept_per_kind_of_request_are_the_chains_worked_out(
        vc: str, leaf_type: str, pinned: str, priority: int, members: list[tuple[int, int]],
        more: int) -> None:
    # Requests after another, then with ``more`` times the pods (the same largest pod), then
    # with pods ``more`` times as large: each is answered from what one before kept if they
    # are of one kind, and must be what working it out says (or the same refusal).
    if pinned and priority == OPPORTUNISTIC:
        return  # the decoder refuses it before the allocator sees it
    allocator = ClusterStore(multi_chain_config()).allocator
    for i, wanted in enumerate((members, [(p * more, n) for p, n in members],
                                [(p, n * more) for p, n in members])):
        spec = GroupSpec(name=f"g{i}", vc=vc, priority=priority, leaf_type=leaf_type,
                         pinned=pinned, members=tuple(Member(p, n) for p, n in wanted))
        try:
            expected: tuple[int, ...] | str = allocator._find_chains(spec)
        except RequestError as exc:
            expected = exc.reason
        try:
            kept: tuple[int, ...] | str = allocator._chains_for(spec)
        except RequestError as exc:
            kept = exc.reason
        assert kept == expected


def test_one_pod_takes_the_leaves_a_pack_takes() -> None:
    # the first pass of one pod in a cell at or below the node level that has the leaves
    rng = random.Random(15)
    compared = 0
    for store in _workload(seed=16):
        topo, allocator = store.topology, store.allocator
        chain = topo.chains[0]
        for _ in range(3):
            c = rng.choice(topo.level_cells[0][rng.randint(1, chain.node_level) - 1])
            if not allocator.cells.free_n[c]:
                continue
            need = rng.randint(1, allocator.cells.free_n[c])
            picker = Picker(topo, allocator.cells, None)
            packed = picker.pack(picker.nodes([c], chain.node_level), [need], [0], final=True)
            assert packed == [allocator._one_pod(c, need)]
            compared += 1
    assert compared > STEPS
