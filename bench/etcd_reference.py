"""``python -m bench.etcd_reference``: etcd's sequential put latency on this machine, the
reference for ``sdpaxos bench runtime --mode single`` (issue 37's target: p50 <= 1.0 ms).

Starts a three-member etcd cluster on loopback (the ``etcd`` binary on the PATH: Debian's
``etcd-server``; fsync on, as etcd always runs; its data directories in a temporary
directory on the same disk as the project's benches), then one client puts ``--writes``
16-byte values one at a time, each after the previous one's answer, to each member in turn
(a put to a follower is forwarded to the leader: the leader's figure is the one to compare
with a replica that leads its own commands). The client speaks etcd's v3 JSON gateway
(``POST /v3/kv/put``) over one keep-alive HTTP connection: the gateway is etcd's own, in
the member's process, and costs it a little more than a gRPC client would.

Prints one JSON object: per member, whether it led, and the put latency p50/p99/mean (ms).
etcd is not a dependency of the project: without the binary this exits 2, saying so.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from consensus.runtime.local_cluster import free_base_port

__all__ = ["measure"]

#: how long the members get to elect a leader and answer
START_TIMEOUT_S = 30.0
#: the exit status of a usage error, or of a missing etcd
USAGE_ERROR = 2


def _post(conn: http.client.HTTPConnection, path: str, body: dict[str, Any]) -> dict[str, Any]:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"etcd answered {response.status} to {path}: {data[:200]!r}")
    answer: dict[str, Any] = json.loads(data)
    return answer


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _wait_ready(ports: list[int]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    for port in ports:
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                _post(conn, "/v3/kv/put", {"key": _b64(b"ready"), "value": _b64(b"1")})
                conn.close()
                break
            except (OSError, RuntimeError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd on port {port} not serving within "
                                       f"{START_TIMEOUT_S:g} s") from None
                time.sleep(0.1)


def measure(writes: int = 2000, members: int = 3) -> dict[str, Any]:
    """Start the members, time ``writes`` sequential puts to each, stop them."""
    base = free_base_port()
    client_ports = [base + 2 * k for k in range(members)]
    peer_ports = [base + 2 * k + 1 for k in range(members)]
    initial = ",".join(f"e{k}=http://127.0.0.1:{peer_ports[k]}" for k in range(members))
    with tempfile.TemporaryDirectory(prefix="etcd-ref-", dir="/tmp") as tmp:
        procs = []
        try:
            for k in range(members):
                procs.append(subprocess.Popen(
                    ["etcd", "--name", f"e{k}", "--data-dir", str(Path(tmp) / f"e{k}"),
                     "--listen-client-urls", f"http://127.0.0.1:{client_ports[k]}",
                     "--advertise-client-urls", f"http://127.0.0.1:{client_ports[k]}",
                     "--listen-peer-urls", f"http://127.0.0.1:{peer_ports[k]}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_ports[k]}",
                     "--initial-cluster", initial, "--initial-cluster-state", "new",
                     "--log-level", "error"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            _wait_ready(client_ports)
            results = []
            for k, port in enumerate(client_ports):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                status = _post(conn, "/v3/maintenance/status", {})
                leads = status.get("leader") == status.get("header", {}).get("member_id")
                value = _b64(b"x" * 16)
                for _ in range(min(100, writes)):  # warm the connection and the member
                    _post(conn, "/v3/kv/put", {"key": _b64(b"warm"), "value": value})
                latencies = []
                for i in range(writes):
                    body = {"key": _b64(f"k{i % 100}".encode()), "value": value}
                    started = time.perf_counter()
                    _post(conn, "/v3/kv/put", body)
                    latencies.append(time.perf_counter() - started)
                conn.close()
                latencies.sort()
                results.append({
                    "member": k, "leader": leads, "writes": writes,
                    "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 3),
                    "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 3),
                    "mean_ms": round(statistics.fmean(latencies) * 1e3, 3),
                })
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    version = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout
    return {"etcd": version.splitlines()[0] if version else "?", "members": members,
            "fsync": True, "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.etcd_reference",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=2000, help="sequential puts per member")
    parser.add_argument("--members", type=int, choices=(1, 3, 5), default=3)
    args = parser.parse_args(argv)
    if args.writes < 1:
        parser.error("--writes must be at least 1")
    if shutil.which("etcd") is None:
        print("bench.etcd_reference: error: no etcd binary on the PATH (Debian: apt-get "
              "install etcd-server)", file=sys.stderr)
        return USAGE_ERROR
    print(json.dumps(measure(args.writes, args.members)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
