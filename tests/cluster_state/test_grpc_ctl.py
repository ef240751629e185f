"""The gRPC service and ``sdpaxos ctl``: generated code is current; every verb works against
replicas serving the store; sessions make retries take effect once; bind; compacted watches;
ctl moves past dead replicas (a watch resumes exactly); invalid requests fail clearly and
change nothing."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from bench.cli import main
from cluster_state.config import synthetic_config
from cluster_state.ctl import _Replicas
from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
from cluster_state.grpc_api.service import serve_grpc
from cluster_state.plugin import store_cluster_toml
from cluster_state.store import ClusterStore
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode

ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("cluster_state/grpc_api/cluster_state.proto")


def test_generated_code_is_current(tmp_path: Path) -> None:
    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.",
         "--grpc_python_out=.", "--pyi_out=.", str(PROTO)],
        cwd=tmp_path, check=True,
    )
    for name in ("cluster_state_pb2.py", "cluster_state_pb2.pyi", "cluster_state_pb2_grpc.py"):
        fresh = (tmp_path / PROTO.parent / name).read_text()
        assert fresh == (ROOT / PROTO.parent / name).read_text(), f"regenerate {name}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """Three in-process replicas serving the store (16 events kept); gRPC on replica 1.
    Yields host:port."""
    (tmp_path / "gpu.yaml").write_text(synthetic_config(nodes=16, vcs=2, pinned=1).to_yaml())
    base = free_base_port()
    (tmp_path / "cluster.toml").write_text(cluster_toml(3, base, wan=False))
    config = load_cluster_config(tmp_path / "cluster.toml")
    loop = asyncio.new_event_loop()
    grpc_port = base + 300
    ready = threading.Event()
    stopping: list[asyncio.Event] = []

    async def host() -> None:
        nodes = [
            ReplicaNode(config, i, ClusterStore(synthetic_config(nodes=16, vcs=2, pinned=1),
                                                event_limit=16), fsync=False)
            for i in range(3)
        ]
        for node in nodes:
            await node.start()
        grpc_server = await serve_grpc(nodes[1], "127.0.0.1", grpc_port)
        stop = asyncio.Event()
        stopping.append(stop)
        ready.set()
        await stop.wait()
        await grpc_server.stop(0.5)
        for node in nodes:
            await node.stop()

    thread = threading.Thread(target=lambda: loop.run_until_complete(host()), daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield f"127.0.0.1:{grpc_port}"
    finally:
        loop.call_soon_threadsafe(stopping[0].set)
        thread.join(30)


def ctl(capsys: pytest.CaptureFixture[str], server: str, *words: str) -> tuple[int, str, str]:
    code = main(["ctl", "--server", server, "--json", *words])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_verb_over_grpc(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ctl(capsys, server, "submit", "train", "--vc", "vc00", "--priority", "100",
                       "--pods", "2x8,1x4")
    assert code == 0
    placed = json.loads(out)
    assert placed["placed"] == "train" and sum(p[0] for p in placed["pods"]) == 20
    code, out, _ = ctl(capsys, server, "status", "train")
    assert code == 0 and json.loads(out)["token"] == placed["token"]
    code, out, _ = ctl(capsys, server, "status")
    assert [g["name"] for g in json.loads(out)] == ["train"]
    code, out, _ = ctl(capsys, server, "vc", "vc00")
    assert json.loads(out)["leaves"]["used"] == 20
    code, out, _ = ctl(capsys, server, "node", placed["pods"][0][1], "--bad")
    assert code == 0 and json.loads(out)["changed"] is True
    code, out, _ = ctl(capsys, server, "release", "train")
    assert code == 0 and json.loads(out)["released"] == "train"
    code, out, _ = ctl(capsys, server, "watch", "--count", "3")
    kinds = [json.loads(line)["kind"] for line in out.splitlines()]
    assert kinds == ["placed", "node_health", "released"]
    # the table output, too
    assert main(["ctl", "--server", server, "status"]) == 0
    assert "allocations" in capsys.readouterr().out
    assert main(["ctl", "--server", server, "vc", "vc00"]) == 0
    out = capsys.readouterr().out
    assert "vc00: 0 of" in out and "pinned vc00-PIN" in out


def test_invalid_requests_fail_clearly_and_change_nothing(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (["--vc", "nope", "--priority", "1", "--pods", "1x1"], "unknown virtual cluster"),
        (["--vc", "vc00", "--priority", "-1", "--pods", "1x8", "--pinned", "vc00-PIN"],
         "pinned"),
        (["--vc", "vc00", "--priority", "1", "--pods", "1x9"], "does not fit"),
    ]
    for words, message in cases:
        code, _, err = ctl(capsys, server, "submit", "bad", *words)
        assert code == 1 and "INVALID_ARGUMENT" in err and message in err, err
    code, out, _ = ctl(capsys, server, "status")
    assert json.loads(out) == []
    code, _, err = ctl(capsys, server, "status", "nobody")
    assert code == 1 and "NOT_FOUND" in err
    with pytest.raises(SystemExit):
        main(["ctl", "--server", server, "submit", "x", "--vc", "vc00", "--pods", "2y8"])
    with pytest.raises(SystemExit):  # ctl refuses it itself (a usage error), the store too:
        main(["ctl", "--server", server, "submit", "x", "--vc", "vc00", "--priority", "1001",
              "--pods", "1x1"])
    with pytest.raises(grpc.RpcError) as caught:
        stub_for(server).Submit(pb.SubmitRequest(group=pb.GroupSpec(
            name="x", vc="vc00", priority=1001, members=[pb.Member(pods=1, leaves=1)])),
            timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "priority" in (caught.value.details() or "")


def stub_for(server: str) -> Any:
    return pb_grpc.AllocationServiceStub(grpc.insecure_channel(server))  # type: ignore[no-untyped-call]


def group(name: str, pods: int = 1, gpus: int = 8) -> pb.GroupSpec:
    return pb.GroupSpec(name=name, vc="vc00", priority=100,
                        members=[pb.Member(pods=pods, leaves=gpus)])


def test_a_session_makes_a_retried_update_take_effect_once(server: str) -> None:
    stub = stub_for(server)
    session = pb.Session(client_id=4242, seq=0)
    first = stub.Submit(pb.SubmitRequest(group=group("job"), session=session), timeout=10)
    again = stub.Submit(pb.SubmitRequest(group=group("job"), session=session), timeout=10)
    assert first == again and first.WhichOneof("outcome") == "placed"
    release = pb.ReleaseRequest(group="job", session=pb.Session(client_id=4242, seq=1))
    assert stub.Release(release, timeout=10) == stub.Release(release, timeout=10)
    # an older client (its reply type was JsonReply) reads the JSON copy in field 1; a typed
    # one the groups and the revision
    wire = stub.ListAllocations(pb.QueryRequest(), timeout=10).SerializeToString()
    assert json.loads(pb.JsonReply.FromString(wire).json) == []
    listing = stub.ListAllocations(pb.QueryRequest(typed=True), timeout=10)
    assert not listing.json and not listing.groups and listing.revision >= 1
    # without a session a repeated release is a new request: the group is gone, and
    # releasing it again is no error (it says so); an unknown group is NOT_FOUND
    again_released = stub.Release(pb.ReleaseRequest(group="job"), timeout=10)
    assert again_released.already_released and not again_released.promoted
    for call, request in [("Release", pb.ReleaseRequest(group="nobody")),
                          ("GetGroup", pb.QueryRequest(name="nobody")),
                          ("GetVC", pb.QueryRequest(name="nope")),
                          ("ListAllocations", pb.QueryRequest(name="nope")),
                          ("Inspect", pb.InspectRequest(kind="group", name="nobody")),
                          ("Inspect", pb.InspectRequest(kind="vc", name="nope"))]:
        with pytest.raises(grpc.RpcError) as caught:
            getattr(stub, call)(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND, call
    with pytest.raises(grpc.RpcError) as caught:
        stub.Submit(pb.SubmitRequest(group=group("x"), session=pb.Session(client_id=1 << 63)),
                    timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "below 2^63" in (caught.value.details() or "")


def test_submit_inside_the_suggested_nodes_over_grpc(server: str) -> None:
    stub = stub_for(server)
    anywhere = stub.Submit(pb.SubmitRequest(group=group("free")), timeout=10).placed
    stub.Release(pb.ReleaseRequest(group="free"), timeout=10)
    summary = json.loads(stub.GetSummary(pb.QueryRequest(), timeout=10).json)
    assert summary["nodes"] == 16
    (pod,) = anywhere.pods
    other = "node0011" if pod.node != "node0011" else "node0010"  # vc00's first rack
    placed = stub.Submit(pb.SubmitRequest(
        group=group("picky"), suggested=pb.SuggestedNodes(nodes=[other])), timeout=10)
    assert [p.node for p in placed.placed.pods] == [other]
    # an empty list is a suggestion too: no node, so the gang waits
    none = stub.Submit(pb.SubmitRequest(group=group("nowhere"), suggested=pb.SuggestedNodes()),
                       timeout=10)
    assert none.WhichOneof("outcome") == "waiting" and "within the 0 suggested" in (
        none.waiting.reason)


def test_bind_over_grpc_and_ctl(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    stub = stub_for(server)
    placed = stub.Submit(pb.SubmitRequest(group=group("a")), timeout=10).placed
    (pod,) = placed.pods
    stub.Release(pb.ReleaseRequest(group="a"), timeout=10)
    code, out, _ = ctl(capsys, server, "watch", "--count", "2")
    revision = [json.loads(line)["revision"] for line in out.splitlines()][-1]
    at = f"{pod.node}:{min(pod.devices)}-{max(pod.devices)}"
    # a gang that does not match its placement: refused, nothing changes
    code, _, err = ctl(capsys, server, "bind", "b", "--vc", "vc00", "--priority", "100",
                       "--pods", "2x8", "--on", at, "--revision", str(revision))
    assert code == 1 and "INVALID_ARGUMENT" in err and "placement lists 1 pods" in err, err
    stale = stub.Bind(pb.BindRequest(group=group("b"), revision=placed.token,
                                     pods=[pb.PodPlacement(node=pod.node,
                                                           devices=list(pod.devices))]),
                      timeout=10)
    assert stale.WhichOneof("outcome") == "conflict" and stale.conflict.group == "b"
    code, out, _ = ctl(capsys, server, "bind", "b", "--vc", "vc00", "--priority", "100",
                       "--pods", "1x8", "--on", at, "--revision", str(revision))
    assert code == 0, out
    bound = json.loads(out)
    assert bound["placed"] == "b" and bound["token"] > revision
    assert bound["pods"] == [[8, pod.node, list(pod.devices)]]
    code, out, _ = ctl(capsys, server, "status", "--vc", "vc00")
    assert [g["name"] for g in json.loads(out)] == ["b"]
    code, out, _ = ctl(capsys, server, "summary")
    assert code == 0 and json.loads(out)["groups"] == 1
    assert main(["ctl", "--server", server, "summary"]) == 0
    assert "nodes" in capsys.readouterr().out


def test_claims_over_grpc_ctl_and_the_watch(server: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    stub = stub_for(server)
    stub.Submit(pb.SubmitRequest(group=group("g", 2, 4)), timeout=10)
    incarnation = stub.GetGroup(pb.QueryRequest(name="g", typed=True), timeout=10).group.incarnation
    code, out, _ = ctl(capsys, server, "claim", "g", "--incarnation", str(incarnation),
                       "--slot", "1", "--uid", "u1", "--pod", "ns/p1")
    assert code == 0 and json.loads(out) == {"claimed": "g", "incarnation": incarnation,
                                             "slot": 1, "uid": "u1"}
    # held: another pod's claim of it is a conflict (exit 1), naming the holder
    code, out, _ = ctl(capsys, server, "claim", "g", "--incarnation", str(incarnation),
                       "--slot", "1", "--uid", "u2", "--pod", "ns/p2")
    assert code == 1 and "held by u1" in json.loads(out)["reason"]
    # ... unless it names the holder as gone
    reply = stub.Claim(pb.ClaimRequest(group="g", incarnation=incarnation, slot=1, uid="u2",
                                       pod="ns/p2", previous="u1"), timeout=10)
    assert reply.WhichOneof("outcome") == "claimed" and reply.claimed.uid == "u2"
    code, out, _ = ctl(capsys, server, "status", "g")
    assert json.loads(out)["claims"] == [{"slot": 1, "uid": "u2", "pod": "ns/p2"}]
    assert main(["ctl", "--server", server, "status", "g"]) == 0
    assert "ns/p2 (u2)" in capsys.readouterr().out
    # the watch stream has both claims, typed
    events = []
    stream = stub.Watch(pb.WatchRequest(since=-1, typed=True), timeout=10)
    for event in stream:
        if event.kind == "claimed":
            events.append(event)
        if len(events) == 2:
            stream.cancel()
            break
    assert [(e.subject, e.claimed.slot, e.claimed.uid, e.claimed.pod, e.claimed.previous)
            for e in events] == [("g", 1, "u1", "ns/p1", ""), ("g", 1, "u2", "ns/p2", "u1")]
    assert all(e.claimed.incarnation == incarnation for e in events)
    code, out, _ = ctl(capsys, server, "watch", "--count", "3")
    assert [json.loads(line)["kind"] for line in out.splitlines()] == [
        "placed", "claimed", "claimed"]


def test_a_watch_behind_the_kept_events_fails_clearly(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stub = stub_for(server)
    for k in range(10):  # 20 events; the store keeps 16
        stub.Submit(pb.SubmitRequest(group=group(f"w{k}", 1, 1)), timeout=10)
        stub.Release(pb.ReleaseRequest(group=f"w{k}"), timeout=10)
    with pytest.raises(grpc.RpcError) as caught:
        next(iter(stub.Watch(pb.WatchRequest(since=-1), timeout=10)))
    assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
    code, _, err = ctl(capsys, server, "watch")
    assert code == 1 and "OUT_OF_RANGE" in err and "compacted" in err


def test_ctl_with_a_cluster_file_moves_past_a_dead_replica(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = free_base_port()
    text = store_cluster_toml(3, base, wan=False, gpu_config="gpu.yaml")
    live_port = int(server.rsplit(":", 1)[1])
    text = text.replace(f"127.0.0.1:{base + 301}", server)  # replica 1: the live service
    (tmp_path / "c.toml").write_text(text)  # replica 0's gRPC port: nobody listens
    config = str(tmp_path / "c.toml")
    assert load_cluster_config(config).replica(1).grpc_address == ("127.0.0.1", live_port)
    assert main(["ctl", "--config", config, "--json", "submit", "via-config", "--vc", "vc01",
                 "--pods", "1x2"]) == 0
    assert json.loads(capsys.readouterr().out)["placed"] == "via-config"
    assert main(["ctl", "--config", config, "--json", "status", "via-config"]) == 0
    assert json.loads(capsys.readouterr().out)["vc"] == "vc01"
    (tmp_path / "kv.toml").write_text(cluster_toml(3, base, wan=False))
    assert main(["ctl", "--config", str(tmp_path / "kv.toml"), "status"]) == 2
    assert "no replica" in capsys.readouterr().err


class _Down(grpc.RpcError):  # type: ignore[misc]
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


def test_ctl_watch_resumes_at_the_next_replica_exactly_after_the_last_event() -> None:
    # Messages hold whole revisions (three events at revision 7: a release that placed two
    # preemptors); the first replica dies after two messages. The next one is asked from
    # the last revision shown: none is lost or repeated.
    events = [pb.Event(revision=r, kind="placed", subject=s)
              for r, s in ((5, "a"), (7, "released"), (7, "p1"), (7, "p2"), (9, "b"))]
    messages = [pb.EventBatch(events=events[:1], through=5),
                pb.EventBatch(events=events[1:4], through=7),
                pb.EventBatch(events=events[4:], through=9)]
    asked = []

    class Stub:
        def __init__(self, dies_after: int | None) -> None:
            self.dies_after = dies_after

        def WatchPushed(self, request: pb.WatchRequest) -> Iterator[pb.EventBatch]:
            asked.append(request.since)
            sent = 0
            for message in messages:
                if message.through > request.since:
                    if sent == self.dies_after:
                        raise _Down()
                    sent += 1
                    yield message

    replicas = _Replicas.__new__(_Replicas)
    replicas.stubs = cast(Any, [Stub(dies_after=2), Stub(dies_after=None)])
    assert list(replicas.watch(-1)) == events
    assert asked == [-1, 7]


def test_ctl_watch_now_shows_only_what_changes_after_it(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stub = stub_for(server)
    stub.Submit(pb.SubmitRequest(group=group("before")), timeout=10)
    stub.Release(pb.ReleaseRequest(group="before"), timeout=10)
    code: list[int] = []
    watching = threading.Thread(target=lambda: code.append(main(
        ["ctl", "--server", server, "--json", "watch", "--now", "--count", "2", "--wait",
         "30"])))
    watching.start()
    k = 0
    while watching.is_alive():  # changes until the watch saw two of them
        stub.Submit(pb.SubmitRequest(group=group(f"after{k}")), timeout=10)
        stub.Release(pb.ReleaseRequest(group=f"after{k}"), timeout=10)
        k += 1
        watching.join(0.2)
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == [0] and len(shown) == 2
    assert all(event["subject"].startswith("after") for event in shown), shown


def test_undecodable_requests_are_invalid_argument_and_bad_names_never_reach_the_log(
    server: str,
) -> None:
    """Issue 34: invalid UTF-8 in a string field was ``UNKNOWN`` ("Unexpected DecodeError");
    a group named with a NUL was placed."""
    import grpc

    from cluster_state.grpc_api import cluster_state_pb2 as pb
    from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc

    bad_utf8 = b"\x0a\x02\xff\xfe"  # field 1 (name / group), a string of two invalid bytes
    truncated = b"\x08\xff"  # field 1 (since), a varint cut short
    service = "/sdpaxos.cluster_state.v1.AllocationService/"
    with grpc.insecure_channel(server) as channel:
        for method, streams, data in (("GetGroup", False, bad_utf8),
                                      ("Submit", False, bad_utf8), ("Watch", True, truncated)):
            raw = (channel.unary_stream if streams else channel.unary_unary)(
                service + method, request_serializer=lambda b: b,
                response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as caught:
                reply = raw(data, timeout=10)
                if streams:
                    next(iter(reply))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert "is not a valid sdpaxos.cluster_state.v1." in (caught.value.details() or "")
        stub = pb_grpc.AllocationServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Submit(pb.SubmitRequest(group=pb.GroupSpec(
                name="nul\x00job", vc="vc00", priority=1, members=[pb.Member(pods=1, leaves=1)],
            )), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "control characters: U+0000" in (caught.value.details() or "")
        listing = stub.ListAllocations(pb.QueryRequest(typed=True), timeout=10)
        assert list(listing.groups) == []  # nothing was placed
