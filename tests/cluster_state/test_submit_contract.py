"""The GPU store's contract when the home replica dies under a submit (issue 39, point 5).

A scheduler acts on what a submit tells it: ``Placed`` (the GPUs are its), ``Waiting`` (nothing
was placed), ``Preempting``, or a ``DefiniteFailure`` (it did not and never will take effect:
the scheduler may place the job elsewhere). Here real replica processes (fsync on) are killed
with SIGKILL right after a submit leaves — the scheduler's own home replica, at a random
moment of the request's life — and every answer is checked against the replicated state once
the replica is back: the native client (``AllocationStore.connect``, which retries at the
next replica and settles a request whose fate it lost) and ``sdpaxos ctl`` over gRPC (which
moves to the next replica's gRPC port with the same session). An indefinite answer claims
nothing; each one is counted, not checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest

from bench.cli import main
from cluster_state.client import AllocationStore
from cluster_state.config import synthetic_config
from cluster_state.ops import GroupSpec, Member, Placed, Preempting, Waiting
from consensus.errors import DefiniteFailure, IndefiniteFailure, SDPaxosError
from consensus.runtime.local_cluster import LocalCluster

GPU: dict[str, Any] = dict(nodes=24, nodes_per_rack=4, vcs=2)
#: rounds per way in (each kills and restarts one replica)
ROUNDS = 6
#: a kill lands this long after the submit left, at most (seconds): before the copy reached
#: anyone, while it is replicated, or after it executed
KILL_WITHIN_S = 0.02


async def serving(cluster: LocalCluster, timeout_s: float = 30.0) -> None:
    """Every replica answers a linearizable read through itself."""
    deadline = time.monotonic() + timeout_s
    for home in range(len(cluster.client_addresses)):
        while True:
            store = AllocationStore.connect([cluster.client_addresses[home]], timeout_s=1.0,
                                            attempts=1)
            try:
                await store.summary()
                break
            except SDPaxosError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"replica {home} does not serve:\n"
                                         f"{cluster.logs()}") from None
                await asyncio.sleep(0.2)
            finally:
                await store.close()


async def state_of(cluster: LocalCluster, name: str) -> dict[str, Any] | None:
    """The group as the log has it (a linearizable read, at any live replica)."""
    async with AllocationStore.connect(cluster.client_addresses, timeout_s=2.0,
                                       attempts=6) as store:
        return await store.status(name)


def check(outcome: object, state: dict[str, Any] | None, name: str) -> str:
    """That the answer the scheduler got is true of the replicated state; its kind."""
    if isinstance(outcome, Placed):
        assert state is not None and state["state"] == "placed", (name, outcome, state)
        assert state["token"] == outcome.token, (name, outcome, state)
        assert [(p.node, tuple(p.devices)) for p in state["pods"]] == [
            (p.node, tuple(p.devices)) for p in outcome.pods], (name, outcome, state)
        return "placed"
    if isinstance(outcome, Preempting):
        assert state is not None and state["state"] == "preempting", (name, outcome, state)
        return "preempting"
    if isinstance(outcome, Waiting | DefiniteFailure):
        # nothing was placed, and nothing ever will be under this request
        assert state is None, (name, outcome, state)
        return "refused" if isinstance(outcome, DefiniteFailure) else "waiting"
    assert isinstance(outcome, IndefiniteFailure), outcome
    return "indefinite"


async def native_round(cluster: LocalCluster, rng: random.Random, index: int) -> str:
    home = index % len(cluster.client_addresses)
    name = f"native-{index}"
    spec = GroupSpec(name=name, vc=f"vc0{index % 2}", priority=100,
                     members=(Member(pods=1, leaves=8),))
    store = AllocationStore.connect(cluster.client_addresses, home=home, timeout_s=0.5,
                                    attempts=3)
    try:
        submit = asyncio.create_task(store.submit(spec))
        await asyncio.sleep(rng.uniform(0, KILL_WITHIN_S))
        cluster.kill(home)
        try:
            outcome: object = await submit
        except (DefiniteFailure, IndefiniteFailure) as exc:
            outcome = exc
    finally:
        await store.close()
    cluster.start(home)
    await serving(cluster)
    return check(outcome, await state_of(cluster, name), name)


async def ctl_round(cluster: LocalCluster, rng: random.Random, index: int) -> str:
    """``sdpaxos ctl --config`` tries the replicas' gRPC ports in the file's order: the first,
    replica 0, is killed under it."""
    name = f"ctl-{index}"
    argv = ["ctl", "--config", str(cluster.config_path), "--json", "--timeout", "2", "submit",
            name, "--vc", f"vc0{index % 2}", "--priority", "100", "--pods", "1x8"]
    with contextlib.redirect_stdout(None):
        submit = asyncio.create_task(asyncio.to_thread(main, argv))
        await asyncio.sleep(rng.uniform(0, KILL_WITHIN_S))
        cluster.kill(0)
        code = await submit
    cluster.start(0)
    await serving(cluster)
    state = await state_of(cluster, name)
    # exit codes: 0 placed or preempting, 1 a definite answer that placed nothing (waiting,
    # refused), 3 no answer (claims nothing)
    if code == 0:
        assert state is not None and state["state"] in ("placed", "preempting"), (name, state)
        return "placed"
    if code == 1:
        assert state is None, (name, state)
        return "refused"
    assert code == 3, code
    return "indefinite"


@pytest.mark.timeout(240)
def test_every_answer_after_the_home_replica_is_killed_is_true(tmp_path: Path) -> None:
    (tmp_path / "gpu.yaml").write_text(synthetic_config(**GPU).to_yaml())
    with LocalCluster(tmp_path, 3, state_machine='kind = "cluster_state"\ngpu_config = "gpu.yaml"',
                      grpc=True) as cluster:
        cluster.start_all()

        async def drive() -> dict[str, int]:
            await serving(cluster)
            rng = random.Random(39)
            kinds: dict[str, int] = {}
            for index in range(ROUNDS):
                for way in (native_round, ctl_round):
                    kind = await way(cluster, rng, index)
                    kinds[kind] = kinds.get(kind, 0) + 1
            return kinds

        kinds = asyncio.run(asyncio.wait_for(drive(), 220))
    print(json.dumps(kinds))
    # most rounds end with an answer the scheduler can act on; none of them was false
    assert kinds.get("indefinite", 0) <= ROUNDS, kinds
    assert kinds.get("placed", 0) > 0, kinds
