"""Well-formed but forged peer frames (ids outside the configuration, huge indexes, foreign
views, a src that is not the handshake's peer) sent to a live replica: admission drops each
whole frame, counts it in /metrics, and the replica stays up, unchanged, and serves."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import get_args

import msgpack

from consensus.codec import FORMAT_VERSION, encode_frame, frame_to_wire
from consensus.messages import (
    EVERY_INDEX,
    NO_CL,
    CAccept,
    CAck,
    Catchup,
    CatchupMarkers,
    CCommit,
    CNack,
    Command,
    CPrepare,
    CPromise,
    CRequest,
    CVote,
    EAccept,
    EAcceptReply,
    ECommit,
    EPreAccept,
    EPreAcceptReply,
    EPrepare,
    EPrepareReply,
    ETryPreAccept,
    ETryPreAcceptReply,
    Heartbeat,
    LearnReply,
    LearnRequest,
    LeaseGrant,
    MenciusAccept,
    MenciusAck,
    MenciusPrepare,
    MenciusPromise,
    MenciusSkip,
    NewView,
    NewViewAck,
    OAccept,
    OAck,
    OCommit,
    OEntry,
    OVote,
    PaxosAccept,
    PaxosAck,
    PaxosCommit,
    PaxosForward,
    PaxosPrepare,
    PaxosPromise,
    PeerMessage,
    PreVote,
    PreVoteReply,
    RReply,
    RRequest,
    SnapshotChunk,
    Suspect,
    Vote,
    VRequest,
)
from consensus.protocol.admission import VIEW_WINDOW
from consensus.protocol.ballot import ballot_of
from consensus.protocol.membership import MemberReplica
from consensus.protocol.membership.config import EPOCH_SHIFT
from consensus.runtime.client import Client
from consensus.runtime.metrics import render
from consensus.runtime.transport import Handshake
from consensus.statemachine import KVStore, kv_get, kv_put

from .polling import wait_until
from .test_port_fuzz import cluster

N = 3
#: the forger claims to be replica 0 and writes to replica 1
FORGER, TARGET = 0, 1
HUGE = (1 << 63) - 1


def forged() -> list[PeerMessage]:
    """One message of every peer class (src = the forger), each naming replica N somewhere
    (or, for the classes that only carry their sender, claiming to come from N)."""
    op = Command(client_id=5, seq=0, op=kv_put("forged", "x"), keys=("forged",), blind=True)
    s, bad = FORGER, N
    return [
        CAccept(src=s, view=0, owner=bad, index=0, ballot=s, batch=(op,)),
        CAck(src=s, view=0, owner=bad, index=0, ballot=s),
        CCommit(src=s, view=0, owner=bad, index=0, ballot=s, batch=(op,)),
        CRequest(src=s, view=0, owner=bad, index=0, keys=(), o_prefix=0),
        OAccept(src=s, view=0, entries=(OEntry(slot=0, owner=bad),)),
        OAck(src=bad, view=0, slots=(0,)),
        OCommit(src=s, view=0, entries=(OEntry(slot=0, owner=bad),)),
        Catchup(src=bad, view=0, slot=0),
        CatchupMarkers(src=bad, view=0, slot=0),
        Heartbeat(src=bad, view=0, executed=0, lease_request=-1),
        LeaseGrant(src=bad, view=0, request=0),
        PreVote(src=bad, view=3),
        PreVoteReply(src=bad, view=3, granted=True),
        VRequest(src=bad, view=3, from_slot=0),
        Vote(src=s, view=3, accepted_view=0, accepted_from=0, executed=0,
             entries=(OVote(slot=0, owner=bad, ballot=0),), c_high=(-1,) * N),
        NewView(src=s, view=3, start=0, owners=(bad, NO_CL)),
        NewViewAck(src=bad, view=3),
        CPrepare(src=s, view=0, owner=bad, from_index=0, ballot=ballot_of(1, s)),
        CPromise(src=s, view=0, owner=bad, from_index=0, ballot=ballot_of(1, 1),
                 accepted=(CVote(index=0, ballot=0, batch=(op,)),), high=0, through=EVERY_INDEX),
        CNack(src=s, view=0, owner=bad, index=0, ballot=ballot_of(1, s)),
        RRequest(src=bad, view=0, read_id=0, keys=()),
        RReply(src=bad, view=0, read_id=0, slot=0),
        Suspect(src=bad, view=0),
        SnapshotChunk(src=bad, view=0, slot=1, offset=0, total=1, data=b"x"),
        LearnRequest(src=bad, view=0, slot=0),
        LearnReply(src=bad, view=0, start=0, executed=0, slots=()),
        PaxosForward(src=bad, view=0, commands=(op,)),
        PaxosAccept(src=s, view=0, slot=0, ballot=bad, batch=(op,)),
        PaxosAck(src=s, view=0, ballot=bad, slots=(0,)),
        PaxosCommit(src=s, view=0, slot=0, ballot=bad, batch=(op,)),
        MenciusAccept(src=s, view=0, slot=0, ballot=bad, batch=(op,), skip_start=0,
                      skip_stop=0),
        MenciusAck(src=s, view=0, ballot=bad, slots=(0,), skip_start=0, skip_stop=0),
        MenciusSkip(src=bad, view=0, skip_start=0, skip_stop=0),
        MenciusPrepare(src=s, view=0, owner=bad, start=0, stop=1, ballot=ballot_of(1, s)),
        MenciusPromise(src=s, view=0, owner=bad, start=0, stop=1, ballot=ballot_of(1, s),
                       ok=True, accepted=()),
        PaxosPrepare(src=bad, view=0, ballot=ballot_of(1, bad), from_slot=0),
        PaxosPromise(src=bad, view=0, ballot=ballot_of(1, s), ok=True, from_slot=0, through=0,
                     complete=True, accepted=()),
        EPreAccept(src=s, view=0, owner=bad, index=0, ballot=0, batch=(op,), seq=1,
                   deps=(-1,) * N),
        EPreAcceptReply(src=s, view=0, owner=bad, index=0, ballot=0, ok=True, seq=1,
                        deps=(-1,) * N, changed=False),
        EAccept(src=s, view=0, owner=bad, index=0, ballot=0, batch=(op,), seq=1,
                deps=(-1,) * N),
        EAcceptReply(src=s, view=0, owner=bad, index=0, ballot=0, ok=True),
        ECommit(src=s, view=0, owner=bad, index=0, ballot=0, batch=(op,), seq=1,
                deps=(-1,) * N),
        EPrepare(src=s, view=0, owner=bad, index=0, ballot=ballot_of(1, s)),
        EPrepareReply(src=s, view=0, owner=bad, index=0, ballot=ballot_of(1, s), ok=True,
                      status=0, vballot=0, batch=(), seq=0, deps=(-1,) * N),
        ETryPreAccept(src=s, view=0, owner=bad, index=0, ballot=ballot_of(1, s), batch=(op,),
                      seq=1, deps=(-1,) * N),
        ETryPreAcceptReply(src=s, view=0, owner=bad, index=0, ballot=ballot_of(1, s), ok=True,
                           conflict=0),
    ]


def out_of_range_values() -> list[PeerMessage]:
    """Huge indexes and slots, foreign views and ballots, a src that is not the peer."""
    op = Command(client_id=5, seq=1, op=kv_put("forged", "y"), keys=("forged",), blind=True)
    s = FORGER
    return [
        CAccept(src=s, view=0, owner=s, index=HUGE, ballot=s, batch=(op,)),
        CRequest(src=s, view=0, owner=s, index=1 << 62, keys=(), o_prefix=0),
        OAccept(src=s, view=0, entries=(OEntry(slot=HUGE, owner=s),)),
        Heartbeat(src=s, view=VIEW_WINDOW + 3, executed=0, lease_request=-1),  # 3 % 3 == 0
        CAccept(src=s, view=0, owner=s, index=0, ballot=ballot_of(2, N + 7), batch=(op,)),
        Heartbeat(src=2, view=0, executed=0, lease_request=-1),  # not the handshake's peer
        Vote(src=s, view=3, accepted_view=0, accepted_from=0, executed=0, entries=(),
             c_high=(-1,) * (N + 1)),
        PaxosAccept(src=s, view=1, slot=0, ballot=s, batch=(op,)),  # another protocol's
    ]


def test_forged_frames_of_every_kind_are_dropped_counted_and_harmless(tmp_path: Path) -> None:
    kinds = {type(msg) for msg in forged()}
    assert kinds == set(get_args(PeerMessage)), "every peer message class is forged"
    asyncio.run(asyncio.wait_for(scenario(tmp_path), 60))


async def scenario(tmp_path: Path) -> None:
    nodes, clients = cluster(tmp_path)
    for node in nodes:
        await node.start()
    try:
        client = Client(7, clients, timeout_s=2.0)
        await client.execute(kv_put("k", "v"), ["k"], blind=True)
        await client.read(kv_get("k"), ["k"])  # everyone has executed what came before
        target = nodes[TARGET]
        store = target.state_machine
        assert isinstance(store, KVStore)
        # (the store's data: its snapshot also holds the session table's log time, which the
        # replicas' log-time commands move on whatever the forger does)
        before = dict(store.data)
        assert target.sdpaxos is not None
        c_before = set(target.sdpaxos.c_store)
        # a valid CAccept for a fresh instance first: the bad message after it drops it too
        fresh = CAccept(src=FORGER, view=0, owner=FORGER, index=1000, ballot=FORGER, batch=())
        frames: list[list[PeerMessage]] = [[msg] for msg in forged() + out_of_range_values()]
        frames.append([fresh, dataclasses.replace(fresh, owner=N)])
        _, writer = await asyncio.open_connection(*target.config.replica(TARGET).address)
        writer.write(Handshake("fuzz", FORGER, FORMAT_VERSION).encode())
        for frame in frames:
            writer.write(frame_to_wire(encode_frame(frame)))
        await writer.drain()

        def rejected() -> int:
            return sum(target.stats.peer_frames_rejected.values())

        await wait_until(lambda: rejected() >= len(frames), "forged frames counted")
        assert rejected() == len(frames)
        assert target.stats.rejected_peers == {FORGER}  # logged once, for that peer
        text = render(target)
        counts = _labelled(text, "sdpaxos_peer_frames_rejected_total")
        assert sum(counts.values()) == len(frames)
        assert counts["replica"] > 0 and counts["sender"] > 0 and counts["index"] > 0
        assert counts["view"] > 0 and counts["protocol"] > 0 and counts["length"] > 0
        assert all(node.serving for node in nodes)
        assert store.data == before
        # (the genuine replicas' periodic log-time commands add small instances of their own)
        assert all(key in c_before or (0 <= key[0] < N and key[1] < fresh.index)
                   for key in target.sdpaxos.c_store)
        writer.close()
        # still serving: replica 0's genuine connection was never touched
        reply = await client.execute(kv_put("after", "forgery"), ["after"])
        assert reply.status == "ok"
        answer = await client.read(kv_get("after"), ["after"])
        assert msgpack.unpackb(answer.payload) == ["value", "forgery"]
        await client.close()
    finally:
        for node in nodes:
            await node.stop()


def _labelled(text: str, name: str) -> dict[str, int]:
    """``name{kind="x"} v`` lines of a Prometheus text as {x: v}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            label, value = line.split()
            out[label.split('"')[1]] = int(float(value))
    return out


def test_a_frame_claiming_a_far_future_epoch_moves_no_replica(tmp_path: Path) -> None:
    """Issue 38 point 5 on the wire: a peer's frames claiming an epoch far ahead make the
    replica ask for the SEAL (no one has one) and nothing more: it keeps voting in its epoch
    and the cluster serves (before, it dropped its core and learned until the next epoch)."""
    async def run() -> None:
        nodes, clients = cluster(tmp_path)
        for node in nodes:
            await node.start()
        try:
            _, writer = await asyncio.open_connection(*nodes[TARGET].config.replica(
                TARGET).address)
            writer.write(Handshake(nodes[TARGET].config.cluster_id, FORGER,
                                   FORMAT_VERSION).encode())
            claim = Heartbeat(src=FORGER, view=1000 << EPOCH_SHIFT, executed=0,
                              lease_request=-1)
            for _ in range(20):
                writer.write(frame_to_wire(encode_frame([claim])))
            await writer.drain()
            target = nodes[TARGET]
            await wait_until(lambda: target.stats.messages_received.get(Heartbeat, 0) >= 20,
                             "the claims did not arrive")
            assert isinstance(target.core, MemberReplica)
            assert target.core.voting and target.core.config.epoch == 0
            async with Client(7, clients[TARGET:TARGET + 1], timeout_s=5.0) as client:
                assert (await client.execute(kv_put("after", "lie"), ["after"])).status == "ok"
            assert target.core.voting and target.core.config.epoch == 0
            writer.close()
        finally:
            for node in nodes:
                await node.stop()

    asyncio.run(asyncio.wait_for(run(), 60))
