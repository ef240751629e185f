"""Each readiness condition of ``consensus.runtime.health`` on its own (a stand-in node)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from consensus.config import ProtocolConfig
from consensus.protocol.types import Role
from consensus.runtime.health import READY_MAX_LAG, liveness, readiness

NOW = 1000.0
ELECTION_S = 0.3


def node(**core: Any) -> Any:
    loop_task = SimpleNamespace(done=lambda: False)
    config = SimpleNamespace(replicas=[0, 1, 2, 3, 4],
                             protocol=ProtocolConfig(replicas=5, election_timeout_us=300_000))
    return SimpleNamespace(
        config=config, me=0, _loop_task=loop_task, _stopping=False, executed_slot=500,
        peer_heard_at={1: NOW - 0.1, 2: NOW - 0.2, 3: NOW - 5.0},
        core=SimpleNamespace(view=3, role=Role.FOLLOWER, view_ready=True,
                             _peer_executed={1: 500, 2: 510}, **core),
    )


def test_ready_with_a_majority_heard_and_caught_up() -> None:
    assert readiness(node(), now=NOW).ready


def test_each_condition_fails_alone() -> None:
    n = node()
    n.peer_heard_at = {1: NOW - 0.1, 3: NOW - 2 * ELECTION_S - 0.01}  # only 2 of 5 heard
    verdict = readiness(n, now=NOW)
    assert not verdict.ready and "heard from 2 of 5" in verdict.reasons[0]
    n = node()
    n.core.view_ready = False
    assert "view 0.3 not accepted" in readiness(n, now=NOW).reasons[0]
    n = node()
    n.core.role = Role.CANDIDATE
    assert not readiness(n, now=NOW).ready
    n = node()
    n.core._peer_executed = {1: 500 + READY_MAX_LAG + 1}
    assert "behind" in readiness(n, now=NOW).reasons[0]
    n = node()
    n._loop_task = None  # still replaying its log
    assert "not serving" in readiness(n, now=NOW).reasons[0]


def test_a_core_without_views_or_positions_is_judged_on_the_rest() -> None:
    n = node()
    n.core = SimpleNamespace(view=0)  # a baseline core: no view_ready, role or positions
    assert readiness(n, now=NOW).ready


def test_liveness_fails_only_when_the_loop_died() -> None:
    n = node()
    assert liveness(n).ready
    n.peer_heard_at = {}  # alone: still live
    assert liveness(n).ready

    async def died() -> None:
        raise RuntimeError("boom")

    async def dead_task() -> Any:
        task = asyncio.create_task(died())
        await asyncio.sleep(0)
        return task

    n._loop_task = asyncio.run(dead_task())
    assert not liveness(n).ready
