"""``plan_submit``: a dry run of ``submit`` (HiveD's filtering phase) answers what ``submit``
would, and changes nothing — not the snapshot, not a reservation."""

from __future__ import annotations

from pathlib import Path

import msgpack

from cluster_state import ops
from cluster_state.config import load_config
from cluster_state.store import ClusterStore
from consensus.messages import Command

GPU = Path(__file__).parents[1] / "k8s" / "gpu.yaml"


def query(store: ClusterStore, op: bytes) -> list[object]:
    answer: list[object] = msgpack.unpackb(store.query(op))
    return answer


def test_the_dry_run_answers_what_submit_would_and_changes_nothing() -> None:
    store = ClusterStore(load_config(GPU))
    for position, (name, priority, members, expected) in enumerate((
        ("low", 10, [(2, 4)], "placed"),  # fills vc1
        ("high", 100, [(1, 4)], "preempting"),  # needs a victim
        ("same", 10, [(1, 4)], "waiting"),  # nothing to preempt at its priority
    )):
        before = store.snapshot()
        kind, revision, plan = query(store, ops.plan_submit(name, "vc1", priority, members))
        assert (kind, revision) == ("plan_submit", store.revision)
        assert store.snapshot() == before  # nothing changed, nothing reserved
        result = store.apply(position, Command(client_id=1, seq=position,
                                               op=ops.submit(name, "vc1", priority, members)))
        assert plan[0] == expected  # type: ignore[index]
        # the plan is exactly what submit did (at the position it would have taken)
        if expected == "placed":
            assert msgpack.unpackb(result)[:4] == plan[:4]  # type: ignore[index]
        else:
            assert msgpack.unpackb(result) == plan


def test_an_invalid_request_is_an_error_and_changes_nothing() -> None:
    store = ClusterStore(load_config(GPU))
    before = store.snapshot()
    assert query(store, ops.plan_submit("x", "nope", 10, [(1, 4)]))[0] == "error"
    assert msgpack.unpackb(store.query(msgpack.packb(["plan_submit", ["x"]])))[0] == "error"
    assert store.snapshot() == before
