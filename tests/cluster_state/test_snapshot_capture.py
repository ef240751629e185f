"""``ClusterStore.capture_snapshot``: what is captured now makes, later (after more commands
applied), the bytes ``snapshot()`` made at the capture, and they restore to that state."""

from __future__ import annotations

import random

import pytest

from cluster_state import ClusterStore, release, set_node_health, submit, synthetic_config
from consensus.messages import Command


def run(store: ClusterStore, steps: int, seed: int, start: int) -> None:
    """Submits and releases (a group changes, items bind and unbind, events and sessions grow)
    and a node going bad then healthy (bad nodes and leaf revisions change)."""
    rng = random.Random(seed)
    vcs = [vc.name for vc in store.topology.config.virtual_clusters]
    live: list[str] = []
    for position in range(start, start + steps):
        if position == start + steps // 3:
            op = set_node_health("node0003", False)
        elif position == start + 2 * steps // 3:
            op = set_node_health("node0003", True)
        elif live and rng.random() < 0.4:
            op = release(live.pop(rng.randrange(len(live))))
        else:
            name = f"g{position}"
            op = submit(name, rng.choice(vcs), rng.choice([-1, 0, 5, 500]),
                        [(rng.choice([1, 2]), rng.choice([1, 2, 4, 8]))])
            live.append(name)
        store.apply(position, Command(client_id=position % 3, seq=position, op=op))


@pytest.mark.parametrize("event_limit", [4096, 50])  # 50: events dropped meanwhile
def test_a_capture_finished_after_more_commands_gives_the_snapshot_of_its_time(
    event_limit: int,
) -> None:
    config = synthetic_config(nodes=32, vcs=4, pinned=1)
    store = ClusterStore(config, event_limit=event_limit)
    run(store, 300, seed=1, start=0)
    captured = store.capture_snapshot()
    expected = store.snapshot()
    run(store, 300, seed=2, start=300)
    # a snapshot of the newer state first: the events' packed forms it keeps are newer
    assert store.snapshot() != expected
    assert captured() == expected
    again = ClusterStore(config, event_limit=event_limit)
    again.restore(captured())
    assert again.snapshot() == expected


def test_a_capture_of_a_restored_store_gives_its_snapshot() -> None:
    config = synthetic_config(nodes=32, vcs=4, pinned=1)
    store = ClusterStore(config)
    run(store, 200, seed=3, start=0)
    restored = ClusterStore(config)
    restored.restore(store.snapshot())
    captured = restored.capture_snapshot()
    run(restored, 100, seed=4, start=200)
    assert captured() == store.snapshot()
