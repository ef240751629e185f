"""A TLS cluster for tests: its certificates (``consensus.runtime.tls``) and in-process nodes."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from consensus.auth import ADMIN, Principal
from consensus.runtime.client import Client
from consensus.runtime.cluster_config import ClusterConfig, load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode
from consensus.runtime.tls import TlsFiles, client_context, issue_client, load_ca
from consensus.statemachine import KVStore, StateMachine

CLUSTER = "tls-test"
SITES = ("CA", "OR", "OH")


def write_tls_cluster(directory: Path, *, replicas: int = 3, state_machine: str = "") -> Path:
    """A cluster file with ``[tls]`` and its certificates (``sdpaxos cert init``'s code)."""
    from consensus.runtime.cli import _cert_init

    base = free_base_port()
    lines = [f'cluster_id = "{CLUSTER}"', f'data_dir = "{directory / "data"}"', ""]
    for i in range(replicas):
        lines += [
            "[[replica]]", f"id = {i}", f'address = "127.0.0.1:{base + i}"',
            f'client_address = "127.0.0.1:{base + 100 + i}"',
            f'metrics_address = "127.0.0.1:{base + 200 + i}"',
            f'site = "{SITES[i]}"', f'tls_cert = "tls/replica-{i}.pem"',
            f'tls_key = "tls/replica-{i}.key"', "",
        ]
    lines += ["[protocol]", "heartbeat_us = 50000", "election_timeout_us = 300000", "",
              "[tls]", 'ca = "tls/ca.pem"', 'ca_key = "tls/ca.key"',
              'client_cert = "tls/admin.pem"', 'client_key = "tls/admin.key"', "revoked = []",
              "metrics = true", "", state_machine]
    path = directory / "cluster.toml"
    path.write_text("\n".join(lines))
    assert _cert_init(path) == 0
    return path


def issue(config: ClusterConfig, directory: Path, principal: Principal) -> TlsFiles:
    """A client certificate for ``principal`` signed by the cluster's CA."""
    assert config.tls is not None and config.tls.ca_key is not None
    ca = load_ca(config.tls.ca, config.tls.ca_key)
    files = TlsFiles(directory / f"{principal.name}.pem", directory / f"{principal.name}.key")
    issue_client(ca, config.cluster_id, principal).write(files)
    return files


def context_of(config: ClusterConfig, files: TlsFiles) -> ssl.SSLContext:
    assert config.tls is not None
    return client_context(config.tls.ca, files)


def client(config: ClusterConfig, client_id: int, tls: ssl.SSLContext | None, **kw: Any) -> Client:
    return Client(client_id, [spec.client_address for spec in config.replicas], tls=tls,
                  **{"timeout_s": 2.0, **kw})


@contextlib.asynccontextmanager
async def running(
    path: Path, machine: type[StateMachine] = KVStore
) -> AsyncIterator[tuple[ClusterConfig, list[ReplicaNode]]]:
    config = load_cluster_config(path)
    nodes = [ReplicaNode(config, i, machine(), fsync=False) for i in range(len(config.replicas))]
    for node in nodes:
        await node.start()
    try:
        yield config, nodes
    finally:
        for node in nodes:
            await node.stop()


def admin() -> Principal:
    return Principal("admin", ADMIN)
