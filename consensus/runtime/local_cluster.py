"""Start, kill, pause and restart real replica processes on loopback (tests and benchmarks).

``LocalCluster`` writes a cluster file for free loopback ports, runs each replica as
``python -m bench.cli serve``, and can kill -9, SIGSTOP/SIGCONT and restart any of them.
Use it as a context manager so every process is stopped, also on failure or Ctrl-C.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from consensus.runtime.cli import cluster_toml, init_identities
from consensus.runtime.cluster_config import ClusterConfig, ReplicaSpec, load_cluster_config

__all__ = ["LocalCluster", "free_base_port"]


#: where base ports are drawn from when the kernel's ephemeral range cannot be read
_FALLBACK_EPHEMERAL_LOW = 32768
#: lowest base port handed out (below: well-known and registered services)
_LOWEST_BASE = 10000


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def free_base_port(span: int = 400) -> int:
    """A base port whose [base, base + span) range looks free right now, below the kernel's
    ephemeral range: a port in it can be taken by any outgoing connection (a client's own end)
    while a replica is down, and its restart then fails to bind (seen in the restart bench)."""
    high = _ephemeral_low() - span
    draw = random.Random(os.getpid() ^ time.monotonic_ns())  # not the core's: a test helper
    for _ in range(200):
        base = draw.randrange(_LOWEST_BASE, max(high, _LOWEST_BASE + 1))
        ok = True
        for offset in (hundreds + i for hundreds in (0, 100, 200, 300) for i in range(5)):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", base + offset))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")


class LocalCluster:
    def __init__(
        self,
        directory: Path,
        replicas: int = 3,
        *,
        protocol: str = "",
        wan: bool = False,
        state_machine: str = "",
        grpc: bool = False,
        extra_args: tuple[str, ...] = (),
        tls: bool = False,
        source: Path | None = None,
    ) -> None:
        """``state_machine``: the body of a ``[state_machine]`` table (paths relative to
        ``directory``); ``grpc``: a gRPC address for every replica (a kind that serves
        gRPC serves it there); ``tls``: mutual TLS on every link, certificates made in
        ``directory/tls`` (``sdpaxos cluster init --tls``); ``source``: run the replicas
        from that source tree (another build's checkout, to measure it against this one:
        it comes first on their path and is their working directory)."""
        self.directory = directory
        self.extra_args = extra_args
        self.source = source
        directory.mkdir(parents=True, exist_ok=True)
        text = cluster_toml(replicas, free_base_port(), wan=wan, grpc=grpc, tls=tls)
        if protocol:
            text = text.replace("[protocol]\n", f"[protocol]\n{protocol}\n")
        if state_machine:  # the body of a [state_machine] table
            text += f"\n[state_machine]\n{state_machine}\n"
        self.config_path = directory / "cluster.toml"
        self.config_path.write_text(text)
        if tls:
            from consensus.runtime.cli import _cert_init

            _cert_init(self.config_path, force=True)
        init_identities(self.config_path)  # as ``cluster init`` does
        self.config: ClusterConfig = load_cluster_config(self.config_path)
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def client_addresses(self) -> list[tuple[str, int]]:
        return [spec.client_address for spec in self.config.replicas]

    @property
    def grpc_addresses(self) -> list[tuple[str, int] | None]:
        return [spec.grpc_address for spec in self.config.replicas]

    def start(self, replica: int) -> None:
        log = open(self.directory / f"replica-{replica}.log", "ab")  # noqa: SIM115
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.source is not None:
            env["PYTHONPATH"] = str(self.source)
        self.processes[replica] = subprocess.Popen(
            [sys.executable, "-m", "bench.cli", "serve", "--config", str(self.config_path),
             "--id", str(replica), *self.extra_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.source,
        )

    def start_all(self) -> None:
        for spec in self.config.replicas:
            self.start(spec.id)

    def kill(self, replica: int) -> None:
        process = self.processes.pop(replica)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def pause(self, replica: int) -> None:
        self.processes[replica].send_signal(signal.SIGSTOP)

    def resume(self, replica: int) -> None:
        self.processes[replica].send_signal(signal.SIGCONT)

    def stop_all(self) -> None:
        for process in self.processes.values():
            process.send_signal(signal.SIGCONT)
            process.terminate()
        deadline = time.monotonic() + 10
        for process in self.processes.values():
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes.clear()

    def add_member_entry(self, site: str, new_id: int | None = None) -> ReplicaSpec:
        """A new member's entry in the cluster file (``joined = true``, ``new_id`` or the id
        after the file's highest, on the ports of the file's scheme) and its identity; start
        it with ``start``."""
        if new_id is None:
            new_id = max(spec.id for spec in self.config.replicas) + 1
        base = self.config.replicas[0].address[1]
        first = self.config.replicas[0]
        lines = ["", "[[replica]]", f"id = {new_id}",
                 f'address = "127.0.0.1:{base + new_id}"',
                 f'client_address = "127.0.0.1:{base + 100 + new_id}"']
        if first.metrics_address is not None:
            lines.append(f'metrics_address = "127.0.0.1:{base + 200 + new_id}"')
        if first.grpc_address is not None:
            lines.append(f'grpc_address = "127.0.0.1:{base + 300 + new_id}"')
        lines += [f'site = "{site}"', "joined = true", ""]
        text = self.config_path.read_text()
        marker = "\n[protocol]"  # replicas come before the other tables
        head, sep, tail = text.partition(marker)
        self.config_path.write_text(head.rstrip("\n") + "\n" + "\n".join(lines) + sep + tail)
        init_identities(self.config_path)
        self.config = load_cluster_config(self.config_path)
        return self.config.replica(new_id)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def logs(self) -> str:
        return "\n".join(
            f"--- replica {spec.id}\n"
            + (self.directory / f"replica-{spec.id}.log").read_text()[-3000:]
            for spec in self.config.replicas
            if (self.directory / f"replica-{spec.id}.log").exists()
        )
