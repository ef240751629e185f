"""The allocation store in a TLS cluster (issue 22, points 1, 3, 4): gRPC with client
certificates required and per-principal authorization. Scheduler A (vc00) cannot submit into
B's VC (vc01), release B's group or see B's events, over gRPC (PERMISSION_DENIED) or the native
port (a definite error); a reader reads and changes nothing; a client without a certificate is
refused; a revoked certificate stops working after the reload; refusals change nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from cs_helpers import without_sessions

from bench.cli import main
from cluster_state.authz import AuthorizedStore
from cluster_state.client import AllocationStore
from cluster_state.config import synthetic_config
from cluster_state.grpc_api import cluster_state_pb2 as pb
from cluster_state.grpc_api import cluster_state_pb2_grpc as pb_grpc
from cluster_state.grpc_api.service import serve_grpc
from cluster_state.ops import GroupSpec, Member
from cluster_state.plugin import store_table
from consensus.auth import READER, SCHEDULER, PermissionDenied, Principal
from consensus.runtime.cli import _cert_init, _cert_revoke, cluster_toml
from consensus.runtime.cluster_config import ClusterConfig, load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.runtime.tls import (
    REPLICA_DNS_NAME,
    TlsFiles,
    client_context,
    issue_client,
    load_ca,
)

pytestmark = pytest.mark.timeout(60)

A = Principal("sched-a", SCHEDULER, ("vc00",))
B = Principal("sched-b", SCHEDULER, ("vc01",))
RO = Principal("ro", READER)


async def wait_until(done: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.02)


def issue(config: ClusterConfig, directory: Path, principal: Principal) -> TlsFiles:
    assert config.tls is not None and config.tls.ca_key is not None
    files = TlsFiles(directory / f"{principal.name}.pem", directory / f"{principal.name}.key")
    ca = load_ca(config.tls.ca, config.tls.ca_key)
    issue_client(ca, config.cluster_id, principal).write(files)
    return files


def context_of(config: ClusterConfig, files: TlsFiles) -> ssl.SSLContext:
    assert config.tls is not None
    return client_context(config.tls.ca, files)


def credentials(config: ClusterConfig, files: TlsFiles | None) -> grpc.ChannelCredentials:
    assert config.tls is not None
    ca = config.tls.ca.read_bytes()
    if files is None:
        return grpc.ssl_channel_credentials(root_certificates=ca)
    return grpc.ssl_channel_credentials(root_certificates=ca,
                                        private_key=files.key.read_bytes(),
                                        certificate_chain=files.cert.read_bytes())


class Cluster:
    def __init__(self, tmp_path: Path, config: ClusterConfig, nodes: list[ReplicaNode],
                 target: str) -> None:
        self.tmp_path = tmp_path
        self.config = config
        self.nodes = nodes
        self.target = target
        self.channels: list[grpc.aio.Channel] = []

    def stub(self, files: TlsFiles | None) -> Any:
        channel = grpc.aio.secure_channel(
            self.target, credentials(self.config, files),
            options=[("grpc.ssl_target_name_override", REPLICA_DNS_NAME)],
        )
        self.channels.append(channel)
        return pb_grpc.AllocationServiceStub(channel)  # type: ignore[no-untyped-call]

    def files(self, principal: Principal) -> TlsFiles:
        return issue(self.config, self.tmp_path, principal)


@contextlib.asynccontextmanager
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    (tmp_path / "gpu.yaml").write_text(synthetic_config(nodes=16, vcs=2).to_yaml())
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False, tls=True, grpc=True,
                                 state_machine=store_table("gpu.yaml")))
    assert _cert_init(path) == 0
    config = load_cluster_config(path)
    assert config.tls is not None
    nodes = [ReplicaNode(config, i, AuthorizedStore(synthetic_config(nodes=16, vcs=2)),
                         fsync=False) for i in range(3)]
    for node in nodes:
        await node.start()
    address = config.replica(1).grpc_address
    assert address is not None
    server = await serve_grpc(nodes[1], *address, tls=config.tls, me=1)
    found = Cluster(tmp_path, config, nodes, f"{address[0]}:{address[1]}")
    try:
        yield found
    finally:
        for channel in found.channels:
            await channel.close()
        await server.stop(0.5)
        for node in nodes:
            await node.stop()


async def converged(nodes: list[ReplicaNode]) -> None:
    """Every replica applied what the serving one (replica 1) has."""
    target = nodes[1].executed_slot
    await wait_until(lambda: all(n.executed_slot >= target for n in nodes), "replicas caught up")


def group(name: str, vc: str) -> pb.GroupSpec:
    return pb.GroupSpec(name=name, vc=vc, priority=100, members=[pb.Member(pods=1, leaves=8)])


async def denied(call: Any) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value
    return caught.value.details() or ""


async def test_schedulers_are_confined_to_their_vcs_over_grpc(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        a, b, ro = c.stub(c.files(A)), c.stub(c.files(B)), c.stub(c.files(RO))
        assert c.config.tls is not None and c.config.tls.client is not None
        admin = c.stub(c.config.tls.client)
        watch = a.Watch(pb.WatchRequest(since=-1))
        await a.Submit(pb.SubmitRequest(group=group("a1", "vc00")), timeout=10)
        await b.Submit(pb.SubmitRequest(group=group("b1", "vc01")), timeout=10)
        await converged(c.nodes)
        before = [without_sessions(node.state_machine.snapshot()) for node in c.nodes]
        assert "vc01" in await denied(
            a.Submit(pb.SubmitRequest(group=group("a2", "vc01")), timeout=10))
        assert "b1" in await denied(a.Release(pb.ReleaseRequest(group="b1"), timeout=10))
        await denied(a.GetGroup(pb.QueryRequest(name="b1"), timeout=10))
        await denied(a.GetSummary(pb.QueryRequest(), timeout=10))
        await denied(a.SetNodeHealth(pb.NodeHealthRequest(node="0", healthy=False), timeout=10))
        await denied(ro.Submit(pb.SubmitRequest(group=group("r1", "vc00")), timeout=10))
        await denied(ro.Release(pb.ReleaseRequest(group="a1"), timeout=10))
        await converged(c.nodes)  # every replica applied the refusals
        # (which changed nothing but the sessions' memory of them: issue 39)
        assert [without_sessions(node.state_machine.snapshot()) for node in c.nodes] == before
        summary = json.loads((await ro.GetSummary(pb.QueryRequest(), timeout=10)).json)
        assert set(summary["vcs"]) == {"vc00", "vc01"}
        assert json.loads((await a.GetGroup(pb.QueryRequest(name="a1"), timeout=10)).json)
        # B releases its own group; A's watch shows A's events only, the admin's everything
        await b.Release(pb.ReleaseRequest(group="b1"), timeout=10)
        await a.Submit(pb.SubmitRequest(group=group("a3", "vc00")), timeout=10)
        seen: list[str] = []
        async with asyncio.timeout(10):
            async for event in watch:
                seen.append(event.subject)
                if event.subject == "a3":
                    break
        assert "a1" in seen and not any(s.startswith("b") for s in seen), seen
        every = admin.Watch(pb.WatchRequest(since=-1))
        subjects: list[str] = []
        async with asyncio.timeout(10):
            async for event in every:
                subjects.append(event.subject)
                if event.subject == "a3":
                    break
        assert "b1" in subjects
        every.cancel()
        watch.cancel()


async def test_native_port_refusals_are_definite_and_watch_is_filtered(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        addresses = [spec.client_address for spec in c.config.replicas]
        # A watches over the pushed gRPC stream (the only remote watch), trimmed to its VCs
        a = AllocationStore.connect(addresses, tls=context_of(c.config, c.files(A)),
                                    watch_targets=[c.target],
                                    watch_credentials=credentials(c.config, c.files(A)))
        b = AllocationStore.connect(addresses, tls=context_of(c.config, c.files(B)))
        try:
            spec = GroupSpec(name="b1", vc="vc01", priority=100, members=(Member(1, 8),))
            await b.submit(spec)
            with pytest.raises(PermissionDenied, match="b1"):
                await a.release("b1")
            with pytest.raises(PermissionDenied):
                await a.submit(GroupSpec(name="a2", vc="vc01", priority=100,
                                         members=(Member(1, 8),)))
            assert await b.status("b1") is not None
            await a.submit(GroupSpec(name="a1", vc="vc00", priority=100, members=(Member(1, 8),)))
            seen: list[str] = []
            async with asyncio.timeout(10):
                async for event in a.watch(-1):
                    seen.append(event.subject)
                    if event.subject == "a1":
                        break
            assert seen and not any(s.startswith("b") or s == "" for s in seen), seen
        finally:
            await a.close()
            await b.close()


async def test_no_certificate_and_revoked_certificates_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with cluster(tmp_path) as c:
        anonymous = c.stub(None)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await anonymous.GetVC(pb.QueryRequest(name="vc00"), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake failed
        files = c.files(A)
        a = c.stub(files)
        assert json.loads((await a.GetVC(pb.QueryRequest(name="vc00"), timeout=10)).json)
        assert _cert_revoke(c.config.tls.source if c.config.tls and c.config.tls.source
                            else Path(), None, str(files.cert)) == 0
        for node in c.nodes:
            node.revocations.reload()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await a.GetVC(pb.QueryRequest(name="vc00"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in (caught.value.details() or "")


async def test_ctl_presents_the_cluster_certificate_or_a_given_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with cluster(tmp_path) as c:
        assert c.config.tls is not None and c.config.tls.source is not None
        config = str(c.config.tls.source)
        # with --config: the file's [tls] client certificate (the admin's)
        code = await asyncio.to_thread(main, ["ctl", "--config", config, "--json", "vc", "vc01"])
        assert code == 0, capsys.readouterr().err
        files = c.files(A)
        as_a = ["ctl", "--config", config, "--cert", str(files.cert), "--key", str(files.key)]
        assert await asyncio.to_thread(main, [*as_a, "--json", "vc", "vc00"]) == 0
        capsys.readouterr()
        assert await asyncio.to_thread(main, [*as_a, "--json", "vc", "vc01"]) == 1
        assert "PERMISSION_DENIED" in capsys.readouterr().err
        # plaintext against a TLS replica: refused, saying why (issue 34: "UNAVAILABLE ...
        # Socket closed", exit 3)
        code = await asyncio.to_thread(
            main, ["ctl", "--server", c.target, "--timeout", "2", "--json", "vc", "vc00"])
        assert code == 5  # exit_codes.TLS_REFUSED
        assert "requires TLS and this client spoke plaintext" in capsys.readouterr().err


async def test_a_revoked_certificates_open_calls_end_when_the_revocation_is_reloaded(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as c:
        assert c.config.tls is not None and c.config.tls.client is not None
        revoked_files, kept_files = c.files(RO), c.files(Principal("ro2", READER))
        admin = c.stub(c.config.tls.client)
        revoked, kept = c.stub(revoked_files), c.stub(kept_files)
        streams = [stub.WatchPushed(pb.WatchRequest(since=-1, typed=True))
                   for stub in (revoked, kept)]
        await admin.Submit(pb.SubmitRequest(group=group("g1", "vc00")), timeout=10)
        for stream in streams:  # both see the first event: their streams are open
            async with asyncio.timeout(10):
                assert (await stream.read()).events
        source = c.config.tls.source
        assert source is not None and _cert_revoke(source, None, str(revoked_files.cert)) == 0
        for node in c.nodes:
            node.revocations.reload()
        # the revoked certificate's stream ends at once, saying why; the other goes on
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async with asyncio.timeout(10):
                while True:
                    await streams[0].read()
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in (caught.value.details() or "")
        await admin.Submit(pb.SubmitRequest(group=group("g2", "vc01")), timeout=10)
        async with asyncio.timeout(10):
            subjects: list[str] = []
            while "g2" not in subjects:
                subjects += [e.subject for e in (await streams[1].read()).events]
        # and its new calls are refused, the other certificate's answered
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await revoked.GetVC(pb.QueryRequest(name="vc00"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert json.loads((await kept.GetVC(pb.QueryRequest(name="vc00"), timeout=10)).json)
        streams[1].cancel()


def test_a_scheduler_certificate_names_only_virtual_clusters_that_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 34: a certificate for a VC the cluster does not have was issued (and opened nothing)
    assert main(["cluster", "init", "--dir", str(tmp_path), "--tls", "--gpu-store"]) == 0
    config = str(tmp_path / "cluster.toml")
    capsys.readouterr()
    assert main(["cert", "issue", "--config", config, "--client", "s1", "--role", "scheduler",
                 "--vcs", "vc00,nosuchvc"]) == 2
    err = capsys.readouterr().err
    assert "no virtual cluster nosuchvc in" in err and "it has vc00, vc01, vc02, vc03" in err
    assert not (tmp_path / "tls" / "s1.pem").exists()
    assert main(["cert", "issue", "--config", config, "--client", "s1", "--role", "scheduler",
                 "--vcs", "vc00,vc01"]) == 0
    assert (tmp_path / "tls" / "s1.pem").exists()
