"""``sdpaxos cluster health`` and ``sdpaxos cluster netem``: checks and set-up for one replica of
a deployed cluster (the compose demo's health checks and optional kernel WAN emulation).

``health`` sends one linearizable read to the replica's client port: it succeeds only if the
replica is up, in a view with a working sequencer, and has executed up to what the read needs.

``netem`` turns the cluster file's WAN delays into ``tc`` commands for this replica's outgoing
traffic: a ``prio`` root qdisc with one band per peer, each band a ``netem`` delay of the
link's one-way time, and a ``u32`` filter sending packets for the peer's address into its band.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

from consensus.errors import ConfigError, SDPaxosError
from consensus.runtime.cluster_config import ClusterConfig, load_cluster_config

__all__ = ["check_health", "netem_commands", "run_health", "run_netem"]


async def check_health(config: ClusterConfig, me: int, timeout_s: float) -> bool:
    from consensus.runtime.client import Client
    from consensus.statemachine import kv_get

    # a TLS cluster's tools present its admin certificate (a missing one: a ConfigError)
    tls = config.tls.tool() if config.tls is not None else None
    client = Client(1 << 42, [config.replica(me).client_address], timeout_s=timeout_s, attempts=1,
                    tls=tls)
    try:
        await client.read(kv_get("__health__"), ("__health__",))
        return True
    except (SDPaxosError, OSError):
        return False
    finally:
        await client.close()


def netem_commands(
    config: ClusterConfig, me: int, device: str, resolve: bool = True
) -> list[list[str]]:
    """The ``tc`` invocations that delay this replica's packets to each peer."""
    peers = [spec for spec in config.replicas if spec.id != me]
    if len(peers) > 15:
        raise ConfigError("netem: at most 16 replicas (one prio band per peer)")
    commands = [
        ["tc", "qdisc", "replace", "dev", device, "root", "handle", "1:", "prio", "bands",
         str(len(peers) + 1), "priomap", *["0"] * 16],
    ]
    for band, spec in enumerate(peers, start=2):
        delay_ms = config.one_way_us[me][spec.id] / 1000
        host = spec.address[0]
        address = socket.gethostbyname(host) if resolve else host
        commands.append(["tc", "qdisc", "add", "dev", device, "parent", f"1:{band}", "handle",
                         f"{band}0:", "netem", "delay", f"{delay_ms:.3f}ms"])
        commands.append(["tc", "filter", "add", "dev", device, "parent", "1:", "protocol", "ip",
                         "prio", "1", "u32", "match", "ip", "dst", f"{address}/32", "flowid",
                         f"1:{band}"])
    return commands


def run_health(config_path: str, me: int, timeout_s: float) -> int:
    try:
        config = load_cluster_config(config_path)
        config.replica(me)
    except ConfigError as exc:
        print(f"sdpaxos cluster health: {exc}", file=sys.stderr)
        return 2
    healthy = asyncio.run(check_health(config, me, timeout_s))
    print(f"replica {me}: {'serving' if healthy else 'not serving'}")
    return 0 if healthy else 1


def run_netem(config_path: str, me: int, device: str, apply: bool) -> int:
    try:
        config = load_cluster_config(config_path)
        config.replica(me)
        commands = netem_commands(config, me, device, resolve=apply)
    except (ConfigError, OSError) as exc:
        print(f"sdpaxos cluster netem: {exc}", file=sys.stderr)
        return 2
    for command in commands:
        print(" ".join(command))
        if apply:
            try:
                done = subprocess.run(command, capture_output=True, text=True, check=False)
            except OSError as exc:
                print(f"sdpaxos cluster netem: {exc}", file=sys.stderr)
                return 1
            if done.returncode != 0:
                print(f"sdpaxos cluster netem: {done.stderr.strip()}", file=sys.stderr)
                return 1
    return 0
