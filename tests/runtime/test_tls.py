"""TLS clusters (issue 22): mutual TLS 1.3 on the peer mesh, the client port and metrics;
refusals that must happen (plaintext, another CA, a certificate naming another replica, no
client certificate, a revoked one after the reload) and say why in the log; principals checked
as commands apply; mangled bytes over TLS harm nothing; no key material in any log."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import ssl
import stat
import tomllib
from pathlib import Path

import pytest

from consensus.auth import READER, SCHEDULER, PermissionDenied, Principal, seal
from consensus.codec import FORMAT_VERSION, encode_frame, frame_to_wire
from consensus.errors import DefiniteFailure, TlsRefused
from consensus.messages import Heartbeat
from consensus.runtime.cli import _cert_issue, _cert_revoke
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.health import http_probe
from consensus.runtime.metrics import serve_metrics
from consensus.runtime.node import ReplicaNode
from consensus.runtime.tls import (
    TlsFiles,
    client_context,
    identity_of_pem,
    issue_replica,
    make_ca,
    serial_of_pem,
)
from consensus.runtime.transport import Handshake, PeerTransport
from consensus.statemachine import kv_get, kv_put
from tests.runtime.kv_state import applied_alike, requests_state

from .polling import wait_until
from .test_port_fuzz import garbage
from .tls_helpers import CLUSTER, client, context_of, issue, running, write_tls_cluster

pytestmark = pytest.mark.timeout(60)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


async def refused(caplog: pytest.LogCaptureFixture, *fragments: str) -> None:
    """Some log line holds every fragment (polled: the replica logs as it refuses)."""
    def found() -> bool:
        return any(all(f in line for f in fragments) for line in messages(caplog))

    await wait_until(found, f"a log line with {fragments}; got {messages(caplog)[-5:]}")


async def closed(reader: asyncio.StreamReader) -> bool:
    """The other side closed the connection (read EOF or reset) within 5 s."""
    try:
        async with asyncio.timeout(5):
            return await reader.read(1 << 16) == b""
    except (ConnectionError, ssl.SSLError):
        return True


async def applied(node: ReplicaNode, slots: int) -> None:
    await wait_until(lambda: node.executed_slot >= slots, f"replica {node.me} applied {slots}")


def test_cluster_init_files_are_private_and_named(tmp_path: Path) -> None:
    path = write_tls_cluster(tmp_path)
    config = load_cluster_config(path)
    assert config.tls is not None and config.tls.client is not None
    named = [config.tls.ca, config.tls.ca_key, config.tls.client.cert, config.tls.client.key,
             *(f for r in config.tls.replicas.values() for f in (r.cert, r.key))]
    for file in named:
        assert file is not None and file.exists(), file
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    for i, files in config.tls.replicas.items():
        assert identity_of_pem(files.cert.read_bytes(), CLUSTER).replica == i
    admin = identity_of_pem(config.tls.client.cert.read_bytes(), CLUSTER).principal
    assert admin is not None and admin.role == "admin"


def test_cert_issue_names_role_and_vcs_and_revoke_lists_the_serial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_tls_cluster(tmp_path)
    assert _cert_issue(path, "sched-a", SCHEDULER, "vc2,vc1", None) == 0
    pem = (tmp_path / "tls" / "sched-a.pem").read_bytes()
    principal = identity_of_pem(pem, CLUSTER).principal
    assert principal == Principal("sched-a", SCHEDULER, ("vc1", "vc2"))
    assert stat.S_IMODE((tmp_path / "tls" / "sched-a.key").stat().st_mode) == 0o600
    # another cluster's name: nothing of that cluster
    with pytest.raises(Exception, match="names no identity"):
        identity_of_pem(pem, "other")
    assert _cert_revoke(path, None, str(tmp_path / "tls" / "sched-a.pem")) == 0
    config = load_cluster_config(path)
    assert config.tls is not None and config.tls.revoked == {serial_of_pem(pem)}
    tomllib.loads(path.read_text())  # still a valid file


async def test_tls_cluster_serves_and_refuses_plaintext_saying_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = write_tls_cluster(tmp_path)
    async with running(path) as (config, nodes):
        assert config.tls is not None
        async with client(config, 1, config.tls.tool()) as admin:
            assert (await admin.execute(kv_put("k", "v"), ["k"])).status == "ok"
            assert b"v" in (await admin.read(kv_get("k"), ["k"])).payload
        # a plaintext client: refused, told why (issue 34: "connection to replica lost", an
        # IndefiniteFailure: "retry"), logged, nothing applied
        plain = client(config, 2, None, timeout_s=1.0, attempts=1)
        with pytest.raises(TlsRefused, match="requires TLS and this client spoke plaintext"):
            await plain.execute(kv_put("k", "plain"), ["k"])
        await plain.close()
        await refused(caplog, "refusing client connection", "does not speak TLS")
        # a plaintext peer: refused before its handshake frame is even read
        reader, writer = await asyncio.open_connection(*config.replica(1).address)
        writer.write(Handshake(CLUSTER, 0, FORMAT_VERSION).encode())
        assert await closed(reader)
        writer.close()
        await refused(caplog, "refusing peer connection", "does not speak TLS")
        # the metrics endpoint (metrics = true) wants a certificate too
        host, port = config.replica(0).metrics_address or ("", 0)
        server = await serve_metrics(nodes[0], host, port, tls=config.tls.server(0))
        reader, writer = await asyncio.open_connection(host, port, ssl=config.tls.tool(),
                                                       server_hostname=host)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        body = await reader.read()
        assert b"sdpaxos_view" in body
        writer.close()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert b"sdpaxos_view" not in await reader.read()
        writer.close()
        await refused(caplog, "refusing metrics connection")
        server.close()
        for node in nodes:
            assert b'"plain"' not in node.state_machine.snapshot()


async def test_peer_of_another_ca_or_claiming_another_id_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = write_tls_cluster(tmp_path)
    async with running(path) as (config, nodes):
        assert config.tls is not None
        target = config.replica(1).address
        heartbeat = encode_frame([Heartbeat(src=0, view=7, executed=0, lease_request=-1)])
        # a certificate for replica 0 of this cluster's name, but from another CA
        rogue_ca = make_ca(CLUSTER)
        rogue = TlsFiles(tmp_path / "rogue.pem", tmp_path / "rogue.key")
        issue_replica(rogue_ca, CLUSTER, 0, ["127.0.0.1"]).write(rogue)
        rogue_context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        rogue_context.check_hostname = False
        rogue_context.verify_mode = ssl.CERT_NONE  # the rogue trusts anyone: it is refused
        rogue_context.load_cert_chain(rogue.cert, rogue.key)
        bad_before = nodes[1].transport.stats.bad_connections
        try:
            reader, writer = await asyncio.open_connection(*target, ssl=rogue_context)
            writer.write(Handshake(CLUSTER, 0, FORMAT_VERSION).encode() + frame_to_wire(heartbeat))
            assert await closed(reader)
            writer.close()
        except (ssl.SSLError, ConnectionError):
            pass  # refused during the handshake itself
        await refused(caplog, "refusing peer connection", "TLS handshake failed")
        # replica 2's own certificate, claiming to be replica 0
        genuine = client_context(config.tls.ca, config.tls.replicas[2])
        reader, writer = await asyncio.open_connection(*target, ssl=genuine)
        writer.write(Handshake(CLUSTER, 0, FORMAT_VERSION).encode() + frame_to_wire(heartbeat))
        assert await closed(reader)
        writer.close()
        await refused(caplog, "claims replica id 0", "names replica 2")
        # a client's certificate on the peer port
        admin = config.tls.tool()
        reader, writer = await asyncio.open_connection(*target, ssl=admin)
        writer.write(Handshake(CLUSTER, 0, FORMAT_VERSION).encode())
        assert await closed(reader)
        writer.close()
        assert nodes[1].transport.stats.bad_connections >= bad_before + 3
        assert all(node.core.view == 0 for node in nodes)  # the forged view 7 never arrived
        # the cluster still works, over its genuine links
        async with client(config, 1, admin) as good:
            assert (await good.execute(kv_put("k", "v"), ["k"])).status == "ok"


async def test_client_without_certificate_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = write_tls_cluster(tmp_path)
    async with running(path) as (config, nodes):
        assert config.tls is not None
        anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        anonymous.check_hostname = False
        anonymous.load_verify_locations(config.tls.ca)
        nameless = client(config, 3, anonymous, timeout_s=1.0, attempts=1)
        with pytest.raises(TlsRefused, match="does not take this client's certificate"):
            await nameless.execute(kv_put("k", "anonymous"), ["k"])
        await nameless.close()
        await refused(caplog, "refusing client connection", "TLS handshake failed")
        # a replica's certificate is no client's
        replica = client(config, 4, client_context(config.tls.ca, config.tls.replicas[0]),
                         timeout_s=1.0, attempts=1)
        with pytest.raises(TlsRefused, match=r"refuses this client's certificate: "
                                                   r"replica 0 .* is no client"):
            await replica.execute(kv_put("k", "replica"), ["k"])
        await replica.close()
        await refused(caplog, "refusing client connection", "is no client")
        for node in nodes:
            assert node.stats.commands_applied == 0


async def test_roles_are_checked_as_commands_apply(tmp_path: Path) -> None:
    path = write_tls_cluster(tmp_path)
    async with running(path) as (config, nodes):
        assert config.tls is not None
        reader = context_of(config, issue(config, tmp_path, Principal("ro", READER)))
        scheduler = context_of(
            config, issue(config, tmp_path, Principal("sched", SCHEDULER, ("vc1",)))
        )
        async with client(config, 1, config.tls.tool()) as admin:
            await admin.execute(kv_put("k", "v"), ["k"])
            # an admin's ops travel bare, but one that looks like an envelope is sealed, so
            # nobody names another principal through it
            with pytest.raises(PermissionDenied, match="inside an envelope"):
                await admin.execute(seal(Principal("x", READER), kv_put("k", "x")), ["k"])
        async with client(config, 2, reader) as ro:
            assert b"v" in (await ro.read(kv_get("k"), ["k"])).payload
            with pytest.raises(PermissionDenied, match="may not change"):
                await ro.execute(kv_put("k", "reader"), ["k"])
            # a blind write is not acknowledged before it is checked
            with pytest.raises(PermissionDenied):
                await ro.execute(kv_put("k", "blind"), ["k"], blind=True)
        async with client(config, 3, scheduler) as sched:  # the key-value store has no VCs
            with pytest.raises(PermissionDenied):
                await sched.read(kv_get("k"), ["k"])
        for node in nodes:
            await applied(node, 3)
            # refused, so nothing changed but the sessions' memory of the refusals (a later
            # copy of a refused request is refused too: issue 39)
            assert node.state_machine.data == {"k": "v"}  # type: ignore[attr-defined]


async def test_revoked_certificate_stops_working_after_reload(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = write_tls_cluster(tmp_path)
    async with running(path) as (config, nodes):
        files = issue(config, tmp_path, Principal("ro", READER))
        ro = client(config, 2, context_of(config, files), timeout_s=1.0, attempts=1)
        assert (await ro.read(kv_get("k"), ["k"])).status == "ok"
        assert _cert_revoke(path, None, str(files.cert)) == 0
        # before the reload the file's list is not in force
        assert (await ro.read(kv_get("k"), ["k"])).status == "ok"
        for node in nodes:
            assert node.revocations.reload()  # what SIGHUP runs
        await refused(caplog, "was revoked")
        # the open connection was closed; a new one is refused, saying why
        with pytest.raises(TlsRefused, match=r"the certificate of reader 'ro' .* revoked"):
            await ro.read(kv_get("k"), ["k"])
        await ro.close()
        await refused(caplog, "refusing client connection", "is revoked")
        # others are unaffected
        assert config.tls is not None
        async with client(config, 1, config.tls.tool()) as admin:
            assert (await admin.read(kv_get("k"), ["k"])).status == "ok"
        # the metrics port (aiohttp) checks revocations per request: 403, saying why
        host, port = config.replica(0).metrics_address or ("", 0)
        server = await serve_metrics(nodes[0], host, port, tls=config.tls.server(0))
        try:
            assert await http_probe(host, port, "livez", 5.0, config.tls.tool()) == (200, "ok\n")
            code, body = await http_probe(host, port, "livez", 5.0, context_of(config, files))
            assert code == 403 and "not revoked" in body
        finally:
            await server.stop()


async def test_mangled_frames_over_tls_leave_replicas_up_and_unchanged(tmp_path: Path) -> None:
    """The port fuzz test over authenticated TLS connections: what a holder of a valid
    certificate sends garbled must not crash or change a replica either."""
    path = write_tls_cluster(tmp_path)
    async with running(path) as (config, nodes):
        assert config.tls is not None
        async with client(config, 1, config.tls.tool()) as admin:
            for i in range(10):
                await admin.execute(kv_put(f"k{i % 3}", str(i)), [f"k{i % 3}"])
            await admin.read(kv_get("k0"), ["k0"])
            for node in nodes:
                await applied(node, 10)
            before = await applied_alike(nodes)
            rng = random.Random(22)
            peer = client_context(config.tls.ca, config.tls.replicas[0])
            hello = Handshake(CLUSTER, 0, FORMAT_VERSION).encode()
            frame = encode_frame([Heartbeat(src=0, view=0, executed=0, lease_request=-1)])
            request = frame_to_wire(kv_put("x", "y"))
            for _ in range(15):
                for address, context, chunks in (
                    (config.replica(1).address, peer,
                     [hello] + [frame_to_wire(garbage(rng, frame)) for _ in range(4)]),
                    (config.replica(1).address, peer, [garbage(rng, hello)]),
                    (config.replica(1).client_address, config.tls.tool(),
                     [frame_to_wire(garbage(rng, request)) for _ in range(3)]),
                ):
                    try:
                        _, writer = await asyncio.open_connection(*address, ssl=context)
                        for chunk in chunks:
                            writer.write(chunk)
                        await writer.drain()
                        writer.close()
                    except (OSError, ConnectionError):
                        pass
            await asyncio.sleep(0.2)  # let the replicas read what was sent
            assert all(n.serving for n in nodes)
            assert [requests_state(node.state_machine) for node in nodes] == before
            assert (await admin.execute(kv_put("after", "fuzz"), ["after"])).status == "ok"


async def test_no_key_material_in_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    path = write_tls_cluster(tmp_path)
    assert _cert_issue(path, "sched", SCHEDULER, "vc1", None) == 0
    async with running(path) as (config, _):
        assert config.tls is not None
        async with client(config, 1, config.tls.tool()) as admin:
            await admin.execute(kv_put("k", "v"), ["k"])
        plain = client(config, 2, None, timeout_s=0.5, attempts=1)
        with pytest.raises(TlsRefused):
            await plain.read(kv_get("k"), ["k"])
        await plain.close()
        await refused(caplog, "does not speak TLS")
    # a bad key file's error names the file, not what is in it
    broken = tmp_path / "tls" / "ca.key"
    secret_line = broken.read_text().splitlines()[1]
    broken.write_text(broken.read_text().replace(secret_line, secret_line[::-1]))
    with pytest.raises(Exception) as failure:
        _cert_issue(path, "late", READER, None, None)
    text = "\n".join(messages(caplog)) + capsys.readouterr().out + str(failure.value)
    keys = [p for p in (tmp_path / "tls").iterdir() if p.suffix == ".key"]
    assert len(keys) >= 6
    for key in keys:
        for line in key.read_text().splitlines():
            if not line.startswith("-----"):
                assert line not in text and line[::-1] not in text, f"{key.name} in the logs"
    assert "PRIVATE KEY" not in text
    assert os.fspath(broken) in str(failure.value)


async def test_dialer_refuses_a_listener_presenting_another_replicas_certificate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Replica 0 dials replica 1's address, where replica 2's certificate answers (a hijacked
    address): it sends nothing there and says why."""
    caplog.set_level(logging.INFO)
    path = write_tls_cluster(tmp_path)
    config = load_cluster_config(path)
    assert config.tls is not None
    impostor_context = config.tls.server(2)
    received: list[bytes] = []

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(1 << 16))
        writer.close()

    host, port = config.replica(1).address
    server = await asyncio.start_server(impostor, host, port, ssl=impostor_context)
    transport = PeerTransport(
        cluster_id=CLUSTER, me=0, addresses={r.id: r.address for r in config.replicas},
        one_way_us={}, on_frame=lambda peer, payload: None,
        tls_server=config.tls.server(0), tls_dialer=config.tls.dialer(0),
    )
    await transport.start()
    try:
        await refused(caplog, "not connecting to replica 1", "certificate of replica 2")
        transport.send(1, b"secret")
        assert transport.stats.frames_sent == 0
        assert not any(b"secret" in data for data in received)
    finally:
        await transport.close()
        server.close()


async def test_sessions_belong_to_their_principal(tmp_path: Path) -> None:
    """Two principals using the same client id and sequence numbers each get their own
    session: neither takes the other's result, both commands execute; a retry of a
    principal's own command answers its first result."""
    path = write_tls_cluster(tmp_path)
    async with running(path) as (config, _):
        assert config.tls is not None
        other = context_of(config, issue(config, tmp_path, Principal("admin-2", "admin")))
        async with client(config, 5, config.tls.tool()) as first, \
                client(config, 5, other) as second:
            one = await first.execute(kv_put("a", "1"), ["a"], seq=0)
            two = await second.execute(kv_put("b", "2"), ["b"], seq=0)
            assert one.position != two.position  # both went through the log
            again = await first.execute(kv_put("a", "changed"), ["a"], seq=0)
            assert again.payload == one.payload  # the first result, not executed again
            value = (await second.read(kv_get("a"), ["a"])).payload
            assert b"1" in value and b"changed" not in value
            assert b"2" in (await first.read(kv_get("b"), ["b"])).payload


async def test_a_revoked_replica_certificate_loses_its_connections_and_gets_no_new_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The peer mesh: once its revocation is reloaded, replica 2's certificate is cut off
    (its open connections closed both ways, its dials refused at the handshake) while the
    two others keep theirs and serve."""
    caplog.set_level(logging.INFO)
    path = write_tls_cluster(tmp_path)
    async with running(path) as (config, nodes):
        assert config.tls is not None
        async with client(config, 1, config.tls.tool()) as admin:
            await admin.execute(kv_put("k", "1"), ["k"])
            for node in nodes:
                await applied(node, 1)
            assert _cert_revoke(path, None, str(config.tls.replicas[2].cert)) == 0
            for node in nodes:
                assert node.revocations.reload()
            await refused(caplog, "closing a peer connection", "was revoked")
            for node in nodes[:2]:  # each keeps only the other's connection, and its link
                await wait_until(lambda n=node: n.transport.inbound_limits.stats.open == 1,
                                 f"replica {node.me} still takes replica 2's connection")
                await wait_until(lambda n=node: not n.transport._links[2].connected,
                                 f"replica {node.me} still sends to replica 2")
                assert node.transport._links[1 - node.me].connected
            await refused(caplog, "refusing peer connection", "replica 2", "is revoked")
            cut_at = nodes[2].executed_slot
            await admin.execute(kv_put("k", "2"), ["k"])  # the two others still serve
            await applied(nodes[0], cut_at + 1)
            assert nodes[2].executed_slot == cut_at


async def test_a_client_is_told_which_certificate_tls_refuses(tmp_path: Path) -> None:
    """Issue 34: a client of another CA saw "connection to replica lost" (exit 3: retry)
    while the replica's log said why; now it is a definite refusal naming the certificate."""
    path = write_tls_cluster(tmp_path)
    (tmp_path / "other").mkdir()
    other = load_cluster_config(write_tls_cluster(tmp_path / "other"))  # same id, another CA
    async with running(path) as (config, _):
        assert config.tls is not None and other.tls is not None and other.tls.client
        # the replica's certificate is not of the CA this client trusts
        with pytest.raises(TlsRefused, match="presents a certificate this client does not "
                                             "trust") as caught:
            async with client(config, 2, other.tls.tool(), attempts=1) as stranger:
                await stranger.read(kv_get("k"), ["k"])
        assert isinstance(caught.value, DefiniteFailure)  # exit 1, not 3
        # this client's certificate is not of the cluster's CA
        with pytest.raises(TlsRefused, match="does not take this client's certificate"):
            async with client(config, 3, client_context(config.tls.ca, other.tls.client),
                              attempts=1) as foreign:
                await foreign.read(kv_get("k"), ["k"])
        # a TLS client of a plaintext replica
    async with running(write_plain_cluster(tmp_path / "plain")) as (plain, _):
        with pytest.raises(TlsRefused, match="does not speak TLS"):
            async with client(plain, 4, config.tls.tool(), attempts=1) as tls_client:
                await tls_client.read(kv_get("k"), ["k"])


def write_plain_cluster(directory: Path) -> Path:
    from consensus.runtime.cli import cluster_toml
    from consensus.runtime.local_cluster import free_base_port

    directory.mkdir()
    path = directory / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    return path
