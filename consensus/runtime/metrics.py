"""A Prometheus text endpoint (``GET /metrics``) for one replica node, served by aiohttp; the
same port answers ``GET /livez`` and ``GET /readyz`` (``consensus.runtime.health``). Exact
paths only (``PATHS``), each for GET and HEAD: another path is 404, another method 405.

The exposition is ``prometheus_client``'s, from a registry of the node's own (several nodes
share a process in tests and embeddings), whose collector reads ``ReplicaNode.stats``, the
transport's counters and the core at every scrape: every family has HELP text, per-peer
traffic carries a ``peer`` label, peer messages a ``kind`` label (the message class), and the
durations are fixed-bucket histograms (``consensus.runtime.histogram``), so a scrape costs
O(buckets + peers + message kinds) however many commands ran. The state machine's kind may
add families of its own (``StateMachineKind.metrics``; the GPU store's per-VC gauges, say).
"""

from __future__ import annotations

import asyncio
import ssl
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from consensus.protocol.admission import REJECTION_KINDS
from consensus.protocol.types import Role
from consensus.runtime.health import PROBES, probe_response
from consensus.runtime.histogram import Histogram
from consensus.runtime.state_machines import MetricsSource, StateMetric, state_machine_kind
from consensus.runtime.tls import TlsServer, checked_identity, start_protocol_server

if TYPE_CHECKING:
    from consensus.runtime.node import ReplicaNode

__all__ = ["CONTENT_TYPE", "PATHS", "MetricsServer", "NodeMetrics", "metrics_of", "render",
           "serve_metrics"]

#: the Prometheus text format's content type
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: the lease gauges' value when this replica granted no lease (or it expired)
NO_LEASE = -1


def render(node: ReplicaNode) -> str:
    """``node``'s metrics in the Prometheus text format."""
    return metrics_of(node).render()


_BY_NODE: weakref.WeakKeyDictionary[ReplicaNode, NodeMetrics] = weakref.WeakKeyDictionary()


def metrics_of(node: ReplicaNode) -> NodeMetrics:
    """The metrics of ``node``, made at the first call (call it before the node starts for
    the state machine's counters to include a restart's replay: ``serve_metrics`` does)."""
    metrics = _BY_NODE.get(node)
    if metrics is None:
        metrics = _BY_NODE[node] = NodeMetrics(node)
    return metrics


class NodeMetrics:
    """A node's registry: its collector, and the state machine kind's source."""

    def __init__(self, node: ReplicaNode) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.state: MetricsSource | None = state_machine_kind(node.config.state_machine).metrics(
            node
        )
        self.registry.register(_Collector(node, self))

    def render(self) -> str:
        return generate_latest(self.registry).decode()


class _Collector:
    """What a scrape reads, each family with its HELP text (``collect``)."""

    def __init__(self, node: ReplicaNode, metrics: NodeMetrics) -> None:
        # weak: the registry lives as long as the node, never longer because of us
        self._node = weakref.ref(node)
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return ()  # no fixed set: the peers, message kinds and the kind's families vary

    def collect(self) -> Iterator[Metric]:
        node = self._node()
        if node is None:
            return
        yield from _core_families(node)
        yield from _traffic_families(node)
        yield from _histogram_families(node)
        yield from _connection_families(node)
        yield from _session_families(node)
        state = self._metrics.state
        if state is not None:
            yield from (_family(metric) for metric in state.collect())


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    # prometheus_client adds "_total" to a counter's samples
    return CounterMetricFamily(name.removesuffix("_total"), help_text, value=value)


def _labelled_counter(
    name: str, help_text: str, label: str, values: Iterable[tuple[str, float]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=[label])
    for label_value, value in values:
        family.add_metric([label_value], value)
    return family


def _family(metric: StateMetric) -> Metric:
    """A kind's ``StateMetric`` as a prometheus_client family."""
    family: GaugeMetricFamily | CounterMetricFamily
    if metric.type == "counter":
        family = CounterMetricFamily(metric.name.removesuffix("_total"), metric.help,
                                     labels=list(metric.labels))
    else:
        family = GaugeMetricFamily(metric.name, metric.help, labels=list(metric.labels))
    for labels, value in metric.samples:
        family.add_metric(list(labels), value)
    return family


def _core_families(node: ReplicaNode) -> Iterator[Metric]:
    status, stats = node.core.status(), node.stats
    # the counters below are the SDPaxos core's (0 for a baseline core, or while learning)
    sdpaxos = node.sdpaxos
    yield _gauge("sdpaxos_view", "The view (sequencer epoch) this replica is in.", status.view)
    yield _counter("sdpaxos_view_changes_total",
                   "Times this replica's view moved on since it started (a new sequencer).",
                   stats.view_changes)
    yield _gauge("sdpaxos_is_sequencer",
                 "1 if this replica is the sequencer of its view (Multi-Paxos: the leader).",
                 int(status.role in (Role.SEQUENCER, Role.LEADER)))
    yield _gauge("sdpaxos_lease_valid",
                 "1 if this replica is the sequencer (Multi-Paxos: the leader) and holds read "
                 "leases from a majority (it may answer linearizable reads).",
                 int(status.lease_held))
    granted = status.lease_granted_to
    yield _gauge("sdpaxos_lease_granted_to",
                 "The replica this one granted its read lease to while it runs (it votes for "
                 "no other sequencer meanwhile); -1 for none.",
                 NO_LEASE if granted is None else granted)
    yield _counter("sdpaxos_c_recoveries_total",
                   "C-instance recoveries this replica started (a Prepare over a suspected "
                   "replica's unfinished instances).",
                   0 if sdpaxos is None else sdpaxos.recoveries_started)
    yield _counter("sdpaxos_candidacies_too_wide_total",
                   "Candidacies given up because their NewView would not fit in a message.",
                   0 if sdpaxos is None else sdpaxos.too_wide_views)
    yield _gauge("sdpaxos_executed_slots",
                 "One past the last global log slot applied to the state machine.",
                 node.executed_slot)
    peers = GaugeMetricFamily("sdpaxos_peer_executed_slots",
                              "The execution frontier each peer last reported to this replica "
                              "(none for a core without comparable positions, EPaxos).",
                              labels=["peer"])
    for peer, executed in sorted(status.peer_executed.items()):
        peers.add_metric([str(peer)], executed)
    yield peers
    yield _counter("sdpaxos_commands_applied_total",
                   "Commands applied to the state machine (a restart's replay included).",
                   stats.commands_applied)
    yield _counter("sdpaxos_loop_turns_total", "Turns of the replica's event loop.", stats.turns)
    yield _gauge("sdpaxos_loop_turn_longest_seconds",
                 "The longest loop turn since start, yields to the event loop included.",
                 stats.longest_turn_s)
    yield _gauge("sdpaxos_busy_longest_seconds",
                 "The longest piece of the replica's own work between two yields to the event "
                 "loop since start.", stats.longest_busy_s)
    yield _gauge("sdpaxos_loop_stall_longest_seconds",
                 "The longest the event loop was held by anything since start (20 ms "
                 "resolution): how long a peer frame, a client or a scrape waited at most.",
                 stats.longest_stall_s)
    yield _gauge("sdpaxos_replayed_slots",
                 "Slots executed again from the write-ahead log at start.", stats.replayed_slots)
    yield _gauge("sdpaxos_replay_seconds", "How long executing them again took.",
                 stats.replay_seconds)
    yield _counter("sdpaxos_fsyncs_total", "fsyncs of the write-ahead log (group commits).",
                   stats.fsyncs)
    yield _counter("sdpaxos_fsync_seconds_total", "Seconds spent in those fsyncs.",
                   stats.fsync_seconds)
    yield _counter("sdpaxos_snapshots_taken_total",
                   "Snapshots of the state machine this replica took.", stats.snapshots_taken)
    yield _counter("sdpaxos_snapshots_installed_total",
                   "Snapshots this replica installed from a peer (it was too far behind).",
                   stats.snapshots_installed)
    yield _gauge("sdpaxos_snapshot_hold_longest_seconds",
                 "The longest a snapshot of this replica's held its event loop at once (its "
                 "capture or its install; the file is written off the loop).",
                 stats.longest_snapshot_hold_s)
    yield _gauge("sdpaxos_snapshot_log_rewrite_longest_seconds",
                 "The longest rewrite of the write-ahead log after a snapshot (on the loop).",
                 stats.longest_log_rewrite_s)


def _session_families(node: ReplicaNode) -> Iterator[Metric]:
    """The replicated session table's size and log time (``consensus.sessions``), if the
    state machine keeps one."""
    table, stats = node.sessions, node.stats
    if table is None:
        return
    family = GaugeMetricFamily(
        "sdpaxos_sessions", "Client sessions the replicated session table holds: open, closed "
        "(until their open-by time), pinned (no open-by time: never evicted), and tombstones "
        "of sessions evicted before their open-by time.", labels=["state"])
    for state, count in table.counts().items():
        family.add_metric([state], count)
    yield family
    yield _gauge("sdpaxos_log_time_seconds",
                 "The log time the session table runs on (Unix seconds; 0 before the first "
                 "log-time command).", table.now)
    yield _counter("sdpaxos_sessions_expired_total",
                   "Commands led here that were not applied because their session was gone "
                   "(SessionExpired).", stats.sessions_expired)
    yield _counter("sdpaxos_log_times_proposed_total",
                   "Log-time commands this replica proposed.", stats.log_times_proposed)


def _traffic_families(node: ReplicaNode) -> Iterator[Metric]:
    stats, transport = node.stats, node.transport.stats
    peers = sorted(transport.peers.items())
    for name, attribute, help_text in (
        ("sdpaxos_frames_sent_total", "frames_sent", "Frames written to the peer."),
        ("sdpaxos_frames_received_total", "frames_received", "Frames read from the peer."),
        ("sdpaxos_peer_bytes_sent_total", "bytes_sent",
         "Frame bytes written to the peer (length prefixes and WAN stamps included)."),
        ("sdpaxos_peer_bytes_received_total", "bytes_received",
         "Frame bytes read from the peer (length prefixes and WAN stamps included)."),
        ("sdpaxos_frames_dropped_total", "frames_dropped",
         "Frames to or from the peer dropped: unreachable, over the send or hold bound, or "
         "cut off by fault injection (the protocol retransmits)."),
    ):
        yield _labelled_counter(name, help_text, "peer",
                                ((str(peer), getattr(traffic, attribute))
                                 for peer, traffic in peers))
    yield _counter("sdpaxos_bad_frames_total",
                   "Peer frames that did not decode, and peer connections closed or refused "
                   "for bad bytes or a bad handshake.",
                   stats.bad_frames + transport.bad_connections)
    # decoded peer frames that failed admission, by the kind of field that failed
    yield _labelled_counter("sdpaxos_peer_frames_rejected_total",
                            "Decoded peer frames dropped by admission, by the kind of field "
                            "that failed (consensus.protocol.admission).",
                            "kind", ((kind, stats.peer_frames_rejected.get(kind, 0))
                                     for kind in REJECTION_KINDS))
    for name, counts, help_text in (
        ("sdpaxos_messages_sent_total", stats.messages_sent,
         "Peer messages this replica's core produced for its peers, by message kind."),
        ("sdpaxos_messages_received_total", stats.messages_received,
         "Peer messages received and admitted, by message kind."),
    ):
        yield _labelled_counter(name, help_text, "kind", sorted(
            (kind.__name__, count) for kind, count in counts.items()))


def _histogram(
    family: HistogramMetricFamily, labels: list[str], histogram: Histogram
) -> None:
    family.add_metric(
        labels,
        [(_le(bound), count) for bound, count in histogram.cumulative()],
        histogram.sum,
    )


def _le(bound: float) -> str:
    """A bucket's ``le`` label: the bound's shortest exact text, ``+Inf`` for the last."""
    return "+Inf" if bound == float("inf") else repr(bound)


def _histogram_families(node: ReplicaNode) -> Iterator[Metric]:
    stats = node.stats
    commit = HistogramMetricFamily(
        "sdpaxos_commit_latency_seconds",
        "Seconds from the proposal of a command led here to its answer: answer=\"ready\" "
        "for blind writes (acknowledged once ready), answer=\"executed\" for the others.",
        labels=["answer"],
    )
    _histogram(commit, ["ready"], stats.ready_latency)
    _histogram(commit, ["executed"], stats.executed_latency)
    yield commit
    pauses = HistogramMetricFamily(
        "sdpaxos_gc_pause_seconds",
        "Seconds per pass of Python's cyclic garbage collector, by generation (2: the "
        "oldest, a walk of every tracked object not frozen); each holds the event loop.",
        labels=["generation"],
    )
    for generation, histogram in enumerate(stats.gc_pauses.by_generation):
        _histogram(pauses, [str(generation)], histogram)
    yield pauses
    for name, help_text, histogram in (
        ("sdpaxos_fsync_duration_seconds", "Seconds per fsync of the write-ahead log.",
         stats.fsync_latency),
        ("sdpaxos_apply_duration_seconds",
         "Seconds a loop turn spent applying its committed commands to the state machine "
         "(turns that applied any; yields to the event loop excluded).",
         stats.apply_latency),
        ("sdpaxos_loop_turn_duration_seconds",
         "Seconds per turn of the replica's event loop (yields included).",
         stats.turn_latency),
        ("sdpaxos_loop_stall_seconds",
         "How late the event loop ran a 20 ms timer, measured at every one: how long anything "
         "held the loop (the rate of the buckets above 0.05 counts stalls over 50 ms).",
         stats.stall_latency),
    ):
        family = HistogramMetricFamily(name, help_text)
        _histogram(family, [], histogram)
        yield family


def _connection_families(node: ReplicaNode) -> Iterator[Metric]:
    # connection hygiene of the client and peer ports (conn_limits)
    client, peer = node.client_limits.stats, node.transport.inbound_limits.stats
    yield _gauge("sdpaxos_client_connections_open", "Open client connections.", client.open)
    yield _counter("sdpaxos_client_connections_refused_total",
                   "Client connections refused over the connection cap.", client.refused)
    yield _counter("sdpaxos_client_connections_idle_closed_total",
                   "Client connections closed for idling too long.", client.closed_idle)
    yield _counter("sdpaxos_client_connections_slow_closed_total",
                   "Client connections closed for sending a frame too slowly.",
                   client.closed_slow)
    yield _counter("sdpaxos_client_connections_over_budget_total",
                   "Client connections closed for buffering over their byte budget.",
                   client.closed_over_budget)
    yield _gauge("sdpaxos_client_buffered_bytes",
                 "Bytes the client connections hold buffered.", client.buffered_bytes)
    yield _gauge("sdpaxos_peer_connections_open",
                 "Open inbound peer connections whose handshake proved a configured peer.",
                 peer.open)
    yield _counter("sdpaxos_peer_connections_refused_total",
                   "Inbound peer connections of configured peers refused over the connection "
                   "cap.", peer.refused)
    handshakes = node.transport.handshakes.stats
    yield _gauge("sdpaxos_peer_handshakes_open",
                 "Inbound peer connections still in their handshake.", handshakes.open)
    yield _counter("sdpaxos_peer_handshakes_refused_total",
                   "Inbound peer connections refused at once: every handshake place taken by "
                   "a connection that sent something.", handshakes.refused)
    yield _counter("sdpaxos_peer_handshakes_evicted_total",
                   "Inbound peer connections closed in their handshake, having sent nothing, "
                   "to make room for a newcomer.", handshakes.evicted_silent)
    yield _counter("sdpaxos_peer_handshakes_timed_out_total",
                   "Inbound peer connections closed for not finishing their handshake in time.",
                   handshakes.timed_out)


class MetricsServer:
    """What ``serve_metrics`` runs: an aiohttp application on a listening socket."""

    def __init__(self, runner: web.AppRunner, server: asyncio.Server | TlsServer) -> None:
        self._runner = runner
        self._server = server
        self.sockets = server.sockets

    def close(self) -> None:
        """Stop listening (``stop`` also ends the connections still open)."""
        self._server.close()

    async def stop(self) -> None:
        self.close()
        await self._runner.cleanup()


#: the paths served, each for GET and HEAD (aiohttp answers 404 for any other path, 405 for
#: another method: no prefix of a path, nor a path with a suffix, is one of them)
PATHS = ("/metrics", *(f"/{probe}" for probe in PROBES))


async def serve_metrics(
    node: ReplicaNode, host: str, port: int, tls: ssl.SSLContext | None = None
) -> MetricsServer:
    """Serve ``GET /metrics``, ``/livez`` and ``/readyz`` (and ``HEAD``) with aiohttp; with
    ``tls`` (a cluster's ``[tls] metrics = true``) over mutual TLS 1.3: a scraper presents a
    certificate of the cluster's CA (any identity of it), a connection without one is refused
    with a log line saying why, and a request with a revoked one is answered 403."""
    metrics = metrics_of(node)  # before the node starts: its replay counts

    async def scrape(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render().encode(),
                            headers={"Content-Type": CONTENT_TYPE})

    def probe(path: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def answer(request: web.Request) -> web.Response:
            status, body = probe_response(node, path)
            return web.Response(status=status, body=body, content_type="text/plain")

        return answer

    @web.middleware
    async def authenticated(request: web.Request, handler: Handler) -> web.StreamResponse:
        # the handshake checked the CA; who the certificate names, and revocations, here
        if tls is not None and (request.transport is None or checked_identity(
            request.transport, port="metrics", cluster_id=node.config.cluster_id,
            revocations=node.revocations,
        ) is None):
            raise web.HTTPForbidden(text="a certificate of this cluster, not revoked, is "
                                         "required\n")
        return await handler(request)

    app = web.Application(middlewares=[authenticated])
    app.router.add_get("/metrics", scrape)
    for name in PROBES:
        app.router.add_get(f"/{name}", probe(name))
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    assert runner.server is not None  # made by setup: the protocol factory of the connections
    try:
        server = await start_protocol_server(runner.server, host, port, tls=tls,
                                             name="metrics")
    except BaseException:
        await runner.cleanup()
        raise
    return MetricsServer(runner, server)
