"""The cluster file: a TOML document describing replicas, timeouts, batching and WAN delays.

Example (``sdpaxos cluster init`` writes one like it)::

    cluster_id = "demo"
    data_dir = "data"              # relative to the file; one sub-directory per replica
    initial_replicas = 3           # the voters the cluster was initialized with (ids 0..2)

    [[replica]]
    id = 0
    address = "127.0.0.1:7000"     # peer port
    client_address = "127.0.0.1:7100"
    metrics_address = "127.0.0.1:7200"   # optional Prometheus endpoint
    grpc_address = "127.0.0.1:7300"      # optional: what the state machine serves over gRPC
    site = "CA"

    [protocol]                     # any ProtocolConfig field except replicas; µs
    name = "sdpaxos"               # optional: the core to run (see consensus.protocol.registry)
    heartbeat_us = 50000
    election_timeout_us = 300000

    [state_machine]                # optional; default: kind = "kv", the key-value store
    kind = "kv"                    # one of consensus.runtime.state_machines.kinds(); the
                                   # kind's own keys follow (paths relative to this file)

    [wan]
    emulate = true                 # delay every frame by the one-way delay of its link
    # either per-site round trips (ms; the paper's table is built in) ...
    rtt_ms = { "CA-OR" = 20 }      # optional overrides, "A-B" = ms
    # ... or an explicit one-way delay matrix in ms, rows and columns in replica-id order
    # (symmetric, >= 0):
    # one_way_ms = [[0, 10], [10, 0]]

    [limits]                       # optional: connection hygiene (consensus.runtime.conn_limits)
    client_idle_timeout_s = 300    # no request and nothing outstanding this long: closed
    client_frame_timeout_s = 30    # a partial frame not completed in this: closed (slow-loris)
    client_max_connections = 1000  # per replica; more are closed at once
    client_max_frame_bytes = 2097152       # the largest client frame
    client_max_buffered_bytes = 67108864   # partial-frame bytes over all client connections
    peer_max_connections = 0       # of configured peers (handshake done); 0: 2 per peer + 8
    peer_max_handshakes = 16       # connections still in their handshake (silent ones make room)
    peer_handshake_timeout_s = 2   # to prove a configured peer (TLS handshake included)

    [tls]                          # optional: mutual TLS 1.3 on every link (runtime/tls.py)
    ca = "tls/ca.pem"              # the cluster's CA: the only issuer any link accepts
    ca_key = "tls/ca.key"          # optional: only `sdpaxos cert issue` reads it
    client_cert = "tls/admin.pem"  # optional: what this cluster's tools present (an admin)
    client_key = "tls/admin.key"
    revoked = ["5f3a..."]          # revoked serial numbers (hex); reloaded on SIGHUP
    metrics = false                # true: the metrics endpoint speaks TLS too
    # and in every [[replica]]: tls_cert = "tls/replica-0.pem", tls_key = "tls/replica-0.key"

The file seeds a new cluster and says how to reach replicas; once the cluster runs, who its
members are, and where each runs, is the log's (``consensus.protocol.membership``,
``consensus.runtime.members``): a member added later gets an entry (``sdpaxos member add``
prints it; ``joined = true``, an id of at least ``initial_replicas``), and a removed member's
entry may be deleted. So ids may have gaps; ``initial_replicas`` (written by ``cluster init``)
keeps saying how many voters the cluster started with (ids ``0..initial_replicas-1``: what a
replica's log starts from). A file without it is read the way older builds wrote it: the
entries without ``joined = true`` are the initial replicas, and their ids must be 0..N-1.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any

from consensus.config import ProtocolConfig, site_rtt_ms
from consensus.errors import ConfigError
from consensus.protocol.membership.config import MAX_MEMBER_ID
from consensus.protocol.registry import PROTOCOLS
from consensus.runtime.conn_limits import LimitsConfig
from consensus.runtime.state_machines import (
    grpc_requirement,
    parse_state_machine_table,
    state_machine_kind,
)
from consensus.runtime.tls import TlsConfig, TlsFiles, parse_revoked

__all__ = ["ClusterConfig", "ReplicaSpec", "load_cluster_config", "parse_address"]


def parse_address(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{what}: expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSpec:
    id: int
    address: tuple[str, int]
    client_address: tuple[str, int]
    metrics_address: tuple[str, int] | None
    site: str
    grpc_address: tuple[str, int] | None = None
    #: it joined the running cluster (``sdpaxos member add``): not one of the voters the
    #: cluster was initialized with (its id is ``initial_replicas`` or more); the live member
    #: set is the log's (membership)
    joined: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterConfig:
    cluster_id: str
    #: the file's replicas, by id (ids may have gaps: removed members' entries may go)
    replicas: tuple[ReplicaSpec, ...]
    #: ``protocol.replicas`` is the number of voters the cluster was initialized with
    #: (``initial_replicas``: ids 0..N-1)
    protocol: ProtocolConfig
    data_dir: Path
    #: one-way delay per directed link in µs (0 when WAN emulation is off), rows and
    #: columns in the order of ``replicas`` (``delays_from`` by id)
    one_way_us: tuple[tuple[int, ...], ...]
    #: which core the replicas run (``[protocol] name``): a ``consensus.protocol.registry`` key
    protocol_name: str = "sdpaxos"
    #: the replicated state machine's kind (``[state_machine] kind``): a
    #: ``consensus.runtime.state_machines.kinds()`` key
    state_machine: str = "kv"
    #: that kind's options, as its ``parse_options`` read them from ``[state_machine]``
    state_machine_options: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({})
    )
    #: connection caps, timeouts and buffer budget of the replicas' ports (``[limits]``)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    #: mutual TLS on every link (``[tls]``); None: plaintext (local development)
    tls: TlsConfig | None = None

    def replica(self, replica_id: int) -> ReplicaSpec:
        for spec in self.replicas:
            if spec.id == replica_id:
                return spec
        raise ConfigError(f"no replica with id {replica_id} in the cluster file (its ids: "
                          f"{[spec.id for spec in self.replicas]})")

    def delays_from(self, replica_id: int) -> dict[int, int]:
        """The one-way delay (µs) of each link from ``replica_id``, by peer id."""
        ids = [spec.id for spec in self.replicas]
        if replica_id not in ids:
            return {}
        row = self.one_way_us[ids.index(replica_id)]
        return dict(zip(ids, row, strict=True))

    def replica_dir(self, replica_id: int) -> Path:
        return self.data_dir / f"replica-{replica_id}"


def load_cluster_config(path: str | Path) -> ClusterConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_cluster_config(raw, base=path.parent, source=str(path))


def parse_cluster_config(raw: dict[str, Any], *, base: Path, source: str) -> ClusterConfig:
    def fail(message: str) -> ConfigError:
        return ConfigError(f"{source}: {message}")

    known = {"cluster_id", "data_dir", "initial_replicas", "replica", "protocol", "wan",
             "state_machine", "limits", "tls"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise fail(f"unknown top-level keys {unknown}")
    cluster_id = raw.get("cluster_id")
    if not isinstance(cluster_id, str) or not cluster_id:
        raise fail("cluster_id must be a non-empty string")
    entries = raw.get("replica")
    if not isinstance(entries, list) or not entries:
        raise fail("at least one [[replica]] table is required")
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise fail(f"[[replica]] #{position} must be a table")
        replica_id = entry.get("id")
        if type(replica_id) is not int or not 0 <= replica_id <= MAX_MEMBER_ID:
            raise fail(f"[[replica]] #{position}: id must be an integer in 0..{MAX_MEMBER_ID}, "
                       f"got {replica_id!r}")
    entries = sorted(entries, key=lambda e: e["id"])
    initial = _initial_replicas(raw.get("initial_replicas"), entries, fail)
    specs: list[ReplicaSpec] = []
    seen_addresses: set[tuple[str, int]] = set()
    for entry in entries:
        where = f"replica {entry['id']}"
        if specs and specs[-1].id == entry["id"]:
            raise fail(f"replica id {entry['id']} is used twice")
        extra = sorted(
            set(entry) - {"id", "address", "client_address", "metrics_address", "grpc_address",
                          "site", "tls_cert", "tls_key", "joined"}
        )
        joined = entry.get("joined", entry["id"] >= initial)
        if not isinstance(joined, bool):
            raise fail(f"{where}: joined must be true or false")
        if joined != (entry["id"] >= initial):
            raise fail(f"{where}: the cluster was initialized with replicas 0..{initial - 1} "
                       f"(initial_replicas = {initial}); a member added later (joined = true) "
                       f"has an id of {initial} or more")
        if extra:
            raise fail(f"{where}: unknown keys {extra}")
        for key in ("address", "client_address", "site"):
            if not isinstance(entry.get(key), str):
                raise fail(f"{where}: {key} must be a string")
        address = parse_address(entry["address"], f"{where}.address")
        client = parse_address(entry["client_address"], f"{where}.client_address")
        metrics_text = entry.get("metrics_address")
        metrics = parse_address(metrics_text, f"{where}.metrics_address") if metrics_text else None
        grpc_text = entry.get("grpc_address")
        grpc = parse_address(grpc_text, f"{where}.grpc_address") if grpc_text else None
        for addr in (address, client, metrics, grpc):
            if addr is None:
                continue
            if addr in seen_addresses:
                raise fail(f"{where}: address {addr[0]}:{addr[1]} is used twice")
            seen_addresses.add(addr)
        specs.append(
            ReplicaSpec(
                id=entry["id"],
                address=address,
                client_address=client,
                metrics_address=metrics,
                grpc_address=grpc,
                site=entry["site"],
                joined=joined,
            )
        )
    protocol_raw = raw.get("protocol", {})
    if not isinstance(protocol_raw, dict):
        raise fail("[protocol] must be a table")
    protocol_raw = dict(protocol_raw)
    protocol_name = protocol_raw.pop("name", "sdpaxos")
    if not isinstance(protocol_name, str) or protocol_name not in PROTOCOLS:
        raise fail(f"[protocol].name must be one of {sorted(PROTOCOLS)}, got {protocol_name!r}")
    allowed = {f.name for f in fields(ProtocolConfig)} - {"replicas", "unsafe", "preference"}
    bad = sorted(set(protocol_raw) - allowed)
    if bad:
        raise fail(f"[protocol]: unknown keys {bad} (allowed: {sorted(allowed | {'name'})})")
    for key, value in protocol_raw.items():
        if key != "thrifty" and (not isinstance(value, int) or isinstance(value, bool)):
            raise fail(f"[protocol].{key} must be an integer")
    try:
        protocol = ProtocolConfig(replicas=initial, **protocol_raw)
    except ConfigError as exc:
        raise fail(f"[protocol]: {exc}") from None
    one_way = _parse_wan(raw.get("wan", {}), specs, fail)
    try:
        kind, options = parse_state_machine_table(raw.get("state_machine", {}), base)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    if not state_machine_kind(kind).grpc_service and any(spec.grpc_address for spec in specs):
        raise fail(grpc_requirement())
    limits = _parse_limits(raw.get("limits", {}), len(specs), fail)
    tls = _parse_tls(raw.get("tls"), entries, base, source, fail)
    data_dir = Path(raw.get("data_dir", "data"))
    if not data_dir.is_absolute():
        data_dir = base / data_dir
    return ClusterConfig(
        cluster_id=cluster_id,
        replicas=tuple(specs),
        protocol=protocol,
        data_dir=data_dir,
        one_way_us=one_way,
        protocol_name=protocol_name,
        state_machine=kind,
        state_machine_options=options,
        limits=limits,
        tls=tls,
    )


def _initial_replicas(value: Any, entries: list[dict[str, Any]], fail: Any) -> int:
    """How many voters the cluster was initialized with: ``initial_replicas``, or (a file
    without it) the entries without ``joined = true``, whose ids must then be 0..N-1."""
    if value is None:
        initial = sum(1 for entry in entries if not entry.get("joined", False))
        ids = [entry["id"] for entry in entries if not entry.get("joined", False)]
        if ids != list(range(initial)):
            raise fail(f"the replicas without joined = true must have ids 0..N-1, got {ids}; "
                       "give initial_replicas = N (the replicas the cluster was initialized "
                       "with, ids 0..N-1; cluster init writes it) and a removed replica's entry "
                       "may be deleted")
    elif type(value) is not int or value < 1:
        raise fail(f"initial_replicas must be a positive integer, got {value!r}")
    else:
        initial = value
    if initial % 2 == 0:
        raise fail(f"a cluster is initialized with an odd number of replicas (2F+1), got "
                   f"{initial} (membership changes may then reach any size)")
    return initial


#: the keys of ``[tls]``
_TLS_KEYS = frozenset({"ca", "ca_key", "client_cert", "client_key", "revoked", "metrics"})


def _parse_tls(
    table: Any, entries: list[dict[str, Any]], base: Path, source: str, fail: Any
) -> TlsConfig | None:
    def path(value: Any, where: str) -> Path:
        if not isinstance(value, str) or not value:
            raise fail(f"{where} must be a file name")
        found = Path(value)
        return found if found.is_absolute() else base / found

    if table is None:
        if any("tls_cert" in e or "tls_key" in e for e in entries):
            raise fail("replica tls_cert/tls_key need a [tls] table (its ca)")
        return None
    if not isinstance(table, dict):
        raise fail("[tls] must be a table")
    extra = sorted(set(table) - _TLS_KEYS)
    if extra:
        raise fail(f"[tls]: unknown keys {extra} (allowed: {sorted(_TLS_KEYS)})")
    if "ca" not in table:
        raise fail("[tls].ca (the cluster's CA certificate) is required")
    replicas = {}
    for entry in entries:
        where = f"replica {entry.get('id')}"
        if "tls_cert" not in entry or "tls_key" not in entry:
            raise fail(f"{where}: tls_cert and tls_key are required in a TLS cluster")
        replicas[entry["id"]] = TlsFiles(path(entry["tls_cert"], f"{where}.tls_cert"),
                                         path(entry["tls_key"], f"{where}.tls_key"))
    if ("client_cert" in table) != ("client_key" in table):
        raise fail("[tls]: client_cert and client_key go together")
    client = None
    if "client_cert" in table:
        client = TlsFiles(path(table["client_cert"], "[tls].client_cert"),
                          path(table["client_key"], "[tls].client_key"))
    metrics = table.get("metrics", False)
    if not isinstance(metrics, bool):
        raise fail("[tls].metrics must be true or false")
    source_path = Path(source)
    return TlsConfig(
        ca=path(table["ca"], "[tls].ca"),
        ca_key=path(table["ca_key"], "[tls].ca_key") if "ca_key" in table else None,
        replicas=MappingProxyType(replicas),
        client=client,
        revoked=parse_revoked(table.get("revoked", []), f"{source}: [tls]"),
        metrics=metrics,
        source=source_path if source_path.is_file() else None,
    )


def _parse_limits(table: Any, replicas: int, fail: Any) -> LimitsConfig:
    if not isinstance(table, dict):
        raise fail("[limits] must be a table")
    extra = sorted(set(table) - LimitsConfig.keys())
    if extra:
        raise fail(f"[limits]: unknown keys {extra} (allowed: {sorted(LimitsConfig.keys())})")
    try:
        limits = LimitsConfig(**table)  # checks every value, naming its key
    except ConfigError as exc:
        raise fail(str(exc)) from None
    if 0 < limits.peer_max_connections < replicas - 1:
        raise fail(f"[limits].peer_max_connections must be 0 (automatic) or at least the "
                   f"{replicas - 1} other replicas, got {limits.peer_max_connections}")
    return limits


def _parse_wan(
    wan: Any, specs: list[ReplicaSpec], fail: Any
) -> tuple[tuple[int, ...], ...]:
    n = len(specs)
    if not isinstance(wan, dict):
        raise fail("[wan] must be a table")
    extra = sorted(set(wan) - {"emulate", "rtt_ms", "one_way_ms"})
    if extra:
        raise fail(f"[wan]: unknown keys {extra}")
    if not wan.get("emulate", False):
        return tuple((0,) * n for _ in range(n))
    if "one_way_ms" in wan:
        matrix = wan["one_way_ms"]
        if not (isinstance(matrix, list) and len(matrix) == n and all(
            isinstance(row, list) and len(row) == n for row in matrix
        )):
            raise fail(f"[wan].one_way_ms must be a {n}x{n} matrix")
        for i, row in enumerate(matrix):
            for j, ms in enumerate(row):
                if isinstance(ms, bool) or not isinstance(ms, int | float) or not ms >= 0:
                    raise fail(f"[wan].one_way_ms[{i}][{j}] must be milliseconds >= 0, "
                               f"got {ms!r}")
                if ms != matrix[j][i]:
                    # the receiver of a frame holds it for the link's delay (transport.py)
                    raise fail(f"[wan].one_way_ms must be symmetric: [{i}][{j}] is {ms}, "
                               f"[{j}][{i}] is {matrix[j][i]}")
        return tuple(
            tuple(int(float(v) * 1000) for v in row) for row in matrix
        )
    overrides: dict[frozenset[str], float] = {}
    for pair, ms in dict(wan.get("rtt_ms", {})).items():
        site_a, sep, site_b = str(pair).partition("-")
        if not sep or not isinstance(ms, int | float) or ms < 0:
            raise fail(f"[wan].rtt_ms: expected \"SITE-SITE\" = milliseconds, got {pair!r}")
        overrides[frozenset((site_a, site_b))] = float(ms)
    rows = []
    for a in specs:
        row = []
        for b in specs:
            if a.id == b.id or a.site == b.site:
                row.append(0)
                continue
            rtt = overrides.get(frozenset((a.site, b.site)))
            if rtt is None:
                try:
                    rtt = site_rtt_ms(a.site, b.site)
                except ConfigError:
                    raise fail(
                        f"[wan]: no RTT for {a.site}-{b.site}; add it to [wan].rtt_ms"
                    ) from None
            row.append(int(rtt * 1000) // 2)
        rows.append(tuple(row))
    return tuple(rows)
