"""A Prometheus text endpoint (``GET /metrics``) for one replica node, on plain asyncio; the
same port answers ``GET /livez`` and ``GET /readyz`` (``consensus.runtime.health``)."""

from __future__ import annotations

import asyncio
import bisect
import ssl
from typing import TYPE_CHECKING

from consensus.protocol.admission import REJECTION_KINDS
from consensus.protocol.sdpaxos import SDPaxosReplica
from consensus.runtime.health import HTTP_OK, PROBES, probe_response
from consensus.runtime.tls import TlsServer, accept_tls, start_server

if TYPE_CHECKING:
    from consensus.runtime.node import ReplicaNode

__all__ = ["LATENCY_BUCKETS_S", "render", "serve_metrics"]

LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


def render(node: ReplicaNode) -> str:
    core, stats, transport = node.core, node.stats, node.transport.stats
    # connection hygiene of the client and peer ports (conn_limits)
    client, peer = node.client_limits.stats, node.transport.inbound_limits.stats
    # the baseline cores (Multi-Paxos, Mencius) have no sequencer and no leases: 0
    sdpaxos = core if isinstance(core, SDPaxosReplica) else None
    lines = [
        "# TYPE sdpaxos_view gauge",
        f"sdpaxos_view {core.view}",
        "# TYPE sdpaxos_is_sequencer gauge",
        f"sdpaxos_is_sequencer {int(sdpaxos is not None and sdpaxos.role.value == 'sequencer')}",
        "# TYPE sdpaxos_lease_valid gauge",
        f"sdpaxos_lease_valid {int(sdpaxos is not None and sdpaxos.lease_valid())}",
        "# TYPE sdpaxos_executed_slots gauge",
        f"sdpaxos_executed_slots {node.executed_slot}",
        "# TYPE sdpaxos_commands_applied_total counter",
        f"sdpaxos_commands_applied_total {stats.commands_applied}",
        "# TYPE sdpaxos_loop_turns_total counter",
        f"sdpaxos_loop_turns_total {stats.turns}",
        "# TYPE sdpaxos_loop_turn_longest_seconds gauge",
        f"sdpaxos_loop_turn_longest_seconds {stats.longest_turn_s:.6f}",
        "# TYPE sdpaxos_busy_longest_seconds gauge",
        f"sdpaxos_busy_longest_seconds {stats.longest_busy_s:.6f}",
        "# TYPE sdpaxos_loop_stall_longest_seconds gauge",
        f"sdpaxos_loop_stall_longest_seconds {stats.longest_stall_s:.6f}",
        "# TYPE sdpaxos_replayed_slots gauge",
        f"sdpaxos_replayed_slots {stats.replayed_slots}",
        "# TYPE sdpaxos_replay_seconds gauge",
        f"sdpaxos_replay_seconds {stats.replay_seconds:.6f}",
        "# TYPE sdpaxos_fsyncs_total counter",
        f"sdpaxos_fsyncs_total {stats.fsyncs}",
        "# TYPE sdpaxos_fsync_seconds_total counter",
        f"sdpaxos_fsync_seconds_total {stats.fsync_seconds:.6f}",
        "# TYPE sdpaxos_frames_sent_total counter",
        f"sdpaxos_frames_sent_total {transport.frames_sent}",
        "# TYPE sdpaxos_frames_received_total counter",
        f"sdpaxos_frames_received_total {transport.frames_received}",
        "# TYPE sdpaxos_peer_bytes_sent_total counter",
        f"sdpaxos_peer_bytes_sent_total {transport.bytes_sent}",
        "# TYPE sdpaxos_peer_bytes_received_total counter",
        f"sdpaxos_peer_bytes_received_total {transport.bytes_received}",
        "# TYPE sdpaxos_frames_dropped_total counter",
        f"sdpaxos_frames_dropped_total {transport.frames_dropped}",
        "# TYPE sdpaxos_bad_frames_total counter",
        f"sdpaxos_bad_frames_total {stats.bad_frames + transport.bad_connections}",
        # decoded peer frames that failed admission, by the kind of field that failed
        "# TYPE sdpaxos_peer_frames_rejected_total counter",
        *(
            f'sdpaxos_peer_frames_rejected_total{{kind="{kind}"}} '
            f"{stats.peer_frames_rejected.get(kind, 0)}"
            for kind in REJECTION_KINDS
        ),
        "# TYPE sdpaxos_c_recoveries_total counter",
        f"sdpaxos_c_recoveries_total {0 if sdpaxos is None else sdpaxos.recoveries_started}",
        "# TYPE sdpaxos_candidacies_too_wide_total counter",
        f"sdpaxos_candidacies_too_wide_total {0 if sdpaxos is None else sdpaxos.too_wide_views}",
        "# TYPE sdpaxos_client_connections_open gauge",
        f"sdpaxos_client_connections_open {client.open}",
        "# TYPE sdpaxos_client_connections_refused_total counter",
        f"sdpaxos_client_connections_refused_total {client.refused}",
        "# TYPE sdpaxos_client_connections_idle_closed_total counter",
        f"sdpaxos_client_connections_idle_closed_total {client.closed_idle}",
        "# TYPE sdpaxos_client_connections_slow_closed_total counter",
        f"sdpaxos_client_connections_slow_closed_total {client.closed_slow}",
        "# TYPE sdpaxos_client_connections_over_budget_total counter",
        f"sdpaxos_client_connections_over_budget_total {client.closed_over_budget}",
        "# TYPE sdpaxos_client_buffered_bytes gauge",
        f"sdpaxos_client_buffered_bytes {client.buffered_bytes}",
        "# TYPE sdpaxos_peer_connections_open gauge",
        f"sdpaxos_peer_connections_open {peer.open}",
        "# TYPE sdpaxos_peer_connections_refused_total counter",
        f"sdpaxos_peer_connections_refused_total {peer.refused}",
        "# TYPE sdpaxos_commit_latency_seconds histogram",
    ]
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    total = 0.0
    for latency_us in stats.latencies_us:
        seconds = latency_us / 1e6
        total += seconds
        counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
    cumulative = 0
    for bound, count in zip(LATENCY_BUCKETS_S, counts, strict=False):
        cumulative += count
        lines.append(f'sdpaxos_commit_latency_seconds_bucket{{le="{bound}"}} {cumulative}')
    lines.append(f'sdpaxos_commit_latency_seconds_bucket{{le="+Inf"}} {len(stats.latencies_us)}')
    lines.append(f"sdpaxos_commit_latency_seconds_sum {total:.6f}")
    lines.append(f"sdpaxos_commit_latency_seconds_count {len(stats.latencies_us)}")
    return "\n".join(lines) + "\n"


async def serve_metrics(
    node: ReplicaNode, host: str, port: int, tls: ssl.SSLContext | None = None
) -> asyncio.Server | TlsServer:
    """Serve ``GET /metrics``; with ``tls`` (a cluster's ``[tls] metrics = true``) over mutual
    TLS 1.3: a scraper presents a certificate of the cluster's CA (any identity of it), and a
    connection without one is refused with a log line saying why."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if tls is not None and await accept_tls(
                writer, tls, port="metrics", cluster_id=node.config.cluster_id,
                revocations=node.revocations,
            ) is None:
                return
            async with asyncio.timeout(5):
                request = await reader.readline()
            if request.startswith(b"GET /metrics"):
                body = render(node).encode()
                head = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
            elif probe := next((p for p in PROBES if request.startswith(f"GET /{p}".encode())),
                               None):
                status, body = probe_response(node, probe)
                reason = b"OK" if status == HTTP_OK else b"Service Unavailable"
                head = b"HTTP/1.0 %d %s\r\nContent-Type: text/plain\r\n" % (status, reason)
            else:
                body = b"not found\n"
                head = b"HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            await writer.drain()
        except (TimeoutError, OSError, ConnectionError):
            pass
        finally:
            writer.close()

    return await start_server(handle, host, port, tls=tls, name="metrics")
