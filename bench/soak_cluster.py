"""The clusters of ``sdpaxos bench soak`` and what an operator does to them.

``SoakCluster`` is a ``LocalCluster`` (real replica processes on loopback, fsync on) with the
members that run now, their addresses, and the operator's actions, each done the way an
operator does it — through the ``sdpaxos`` tools in subprocesses — and each ending only once
every member serves again:

* ``kill_and_restart``: SIGKILL one replica, leave it down a moment, start it again on its
  data directory;
* ``replace``: ``sdpaxos member replace OLD`` with a new replica (a new id, addresses and data
  directory), started once the log has it; it waits until the new one is a voter and OLD is
  gone, then retires OLD (stops it, wipes its directory);
* ``backup``: ``sdpaxos snapshot save``, the file checked (``decode_backup``);
* ``apply_config`` (the GPU store): ``sdpaxos ctl config apply FILE --dry-run``, then without.

The replacement's id and addresses follow the file's scheme (base + id, as ``member
replace`` assigns them) and are given to the tool explicitly, with the entry written to the
cluster file (the new replica's copy needs it: ``new_member_entry``, ``replace_command``); a
removed replica exits by itself (status 4) and is stopped only if it does not (``retire``).
The load's clients are handed the members of the moment when they (re)connect
(``client_addresses``); the library's clients also follow the member list by themselves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from consensus.errors import SDPaxosError
from consensus.runtime.cli import cluster_toml
from consensus.runtime.client import Client, new_client_id
from consensus.runtime.cluster_config import ReplicaSpec, load_cluster_config
from consensus.runtime.local_cluster import LocalCluster
from consensus.runtime.members import members_of_status
from consensus.storage.backup import decode_backup

__all__ = [
    "ActionFailed",
    "SoakCluster",
    "ToolResult",
    "base_ports",
    "new_member_entry",
    "replace_command",
    "retire",
    "run_tool",
]

#: the checkout this file is in: what the replicas and the tools run
TREE = Path(__file__).resolve().parents[1]
#: member ids the port scheme leaves room for (cluster_toml: base + 100 k + id)
MAX_IDS = 40
#: lowest base port handed out (below: well-known and registered services)
LOWEST_BASE = 10_000
#: a cluster's ports span this much above its base (peers, clients, metrics, gRPC)
PORT_SPAN = 400
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")

#: seconds a replica has to serve again after it was started (or the cluster, at start)
SERVE_TIMEOUT_S = 90.0
#: seconds a replacement has to become a voter (its learner caught up) and the old one to go
REPLACE_TIMEOUT_S = 150.0
#: seconds a removed replica has to exit by itself before it is stopped
RETIRE_WAIT_S = 5.0
#: seconds an operator tool may run
TOOL_TIMEOUT_S = 60.0
#: probe requests: one replica, one attempt, this long
PROBE_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 0.25


class ActionFailed(Exception):
    """An operator action that did not complete (its message says where it stopped)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolResult:
    args: tuple[str, ...]
    code: int | None  # None: killed after the timeout
    stdout: str
    stderr: str
    seconds: float


def tool_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TREE), "PYTHONUNBUFFERED": "1"}


async def run_tool(args: Sequence[str], timeout_s: float = TOOL_TIMEOUT_S) -> ToolResult:
    """``sdpaxos ARGS`` in a subprocess (this tree's code), killed after ``timeout_s``."""
    began = time.monotonic()
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.cli", *args, env=tool_env(), cwd=str(TREE),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(child.communicate(), timeout_s)
        code: int | None = child.returncode
    except TimeoutError:
        child.kill()
        out, err = await child.communicate()
        code = None
    except BaseException:  # the run is interrupted: the tool goes with it
        child.kill()
        await child.wait()
        raise
    return ToolResult(tuple(args), code, out.decode(errors="replace"),
                      err.decode(errors="replace"), time.monotonic() - began)


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def _range_free(base: int) -> bool:
    for offset in (hundreds + i for hundreds in range(0, PORT_SPAN, 100) for i in range(MAX_IDS)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", base + offset))
            except OSError:
                return False
    return True


def base_ports(count: int, seed: int) -> list[int]:
    """``count`` base ports whose whole port ranges (every id the run may give a member) are
    free now, do not overlap, and lie below the kernel's ephemeral range (where a replica
    that is down could find its port taken by an outgoing connection)."""
    import random

    draw = random.Random(f"{seed}/{os.getpid()}/{time.monotonic_ns()}")  # not the cores'
    high = _ephemeral_low() - PORT_SPAN
    bases: list[int] = []
    for _ in range(500):
        base = draw.randrange(LOWEST_BASE, max(high, LOWEST_BASE + 1))
        if any(abs(base - other) < PORT_SPAN for other in bases) or not _range_free(base):
            continue
        bases.append(base)
        if len(bases) == count:
            return bases
    raise RuntimeError("no free port ranges for the soak's clusters")


# ----------------------------------------------------------------- what lifecycle changes


def new_member_entry(cluster: LocalCluster, site: str) -> ReplicaSpec:
    """The replacement's cluster-file entry: the next id, on the file's port scheme (every
    address: peer, client, metrics, gRPC), ``joined = true``, and its identity."""
    return cluster.add_member_entry(site)


def replace_command(config_path: Path, old: int, new: ReplicaSpec) -> list[str]:
    """``sdpaxos member replace`` for ``new`` taking ``old``'s place (the addresses it would
    assign itself, given so that they are the entry's)."""
    return ["member", "replace", str(old), "--id", str(new.id),
            "--address", f"{new.address[0]}:{new.address[1]}",
            "--client-address", f"{new.client_address[0]}:{new.client_address[1]}",
            "--site", new.site, "--config", str(config_path)]


async def retire(cluster: LocalCluster, old: int) -> int | None:
    """Stop a replica the log no longer has and wipe its data directory; its exit status.
    It is given ``RETIRE_WAIT_S`` to exit by itself (a removed replica does: status 4), then
    SIGTERM (and SIGKILL after 10 s)."""
    process = cluster.processes.pop(old, None)
    code: int | None = None
    if process is not None:
        deadline = time.monotonic() + RETIRE_WAIT_S
        while process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        code = process.returncode
    shutil.rmtree(cluster.config.replica_dir(old), ignore_errors=True)
    return code


# ----------------------------------------------------------------- the cluster


class SoakCluster:
    """One cluster of the soak (see the module). ``probe_op``: a read-only op of its state
    machine, cheap, that a replica serving linearizable reads answers."""

    def __init__(self, name: str, directory: Path, replicas: int, base_port: int, *,
                 probe_op: bytes, state_machine: dict[str, str] | None = None,
                 grpc: bool = False, extra_args: tuple[str, ...] = ()) -> None:
        self.name = name
        self.probe_op = probe_op
        body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in (state_machine or {}).items())
        self.local = LocalCluster(directory, replicas, grpc=grpc, state_machine=body,
                                  extra_args=extra_args, source=TREE)
        # LocalCluster's ports leave room for 5 ids; a soak replaces members many times
        self.local.config_path.write_text(cluster_toml(
            replicas, base_port, wan=False, grpc=grpc, state_machine=state_machine))
        self.local.config = load_cluster_config(self.local.config_path)
        #: the voters running now, in the order they joined
        self.members: list[int] = list(range(replicas))
        #: members being replaced: their process ends by itself (a removed replica does)
        self._leaving: set[int] = set()
        self._turn = 0  # whose turn it is to be killed or replaced

    @property
    def config_path(self) -> Path:
        return self.local.config_path

    def spec(self, replica: int) -> ReplicaSpec:
        return self.local.config.replica(replica)

    def data_dir(self, replica: int) -> Path:
        return self.local.config.replica_dir(replica)

    @property
    def client_addresses(self) -> list[tuple[str, int]]:
        """The members' client ports, for clients started now."""
        return [self.spec(r).client_address for r in self.members]

    @property
    def grpc_targets(self) -> list[str]:
        return [f"{host}:{port}" for r in self.members
                if (address := self.spec(r).grpc_address) is not None
                for host, port in [address]]

    def pid(self, replica: int) -> int | None:
        process = self.local.processes.get(replica)
        return None if process is None or process.poll() is not None else process.pid

    def next_victim(self) -> int:
        """The member whose turn it is (round-robin: the sequencer's turn comes too)."""
        victim = self.members[self._turn % len(self.members)]
        self._turn += 1
        return victim

    def start(self) -> None:
        self.local.start_all()

    def stop(self) -> None:
        self.local.stop_all()

    def exited(self) -> list[str]:
        """Members whose process ended by itself (a crash), said once each."""
        gone = []
        for replica in self.members:
            if replica in self._leaving:
                continue
            process = self.local.processes.get(replica)
            if process is not None and process.poll() is not None:
                gone.append(f"{self.name} replica {replica} exited by itself (status "
                            f"{process.returncode})")
                self.local.processes.pop(replica)
        return gone

    # ------------------------------------------------------------- probes

    async def serves(self, replica: int) -> bool:
        """Whether ``replica`` answers a linearizable read, asked alone, once."""
        client = Client(new_client_id(), [self.spec(replica).client_address],
                        timeout_s=PROBE_TIMEOUT_S, attempts=1)
        try:
            await client.read(self.probe_op)
            return True
        except (OSError, TimeoutError, SDPaxosError):
            return False
        finally:
            await client.close()

    async def wait_serving(self, replicas: Sequence[int] | None = None,
                           timeout_s: float = SERVE_TIMEOUT_S) -> float:
        """Seconds until every one of ``replicas`` (default: the members) served a
        linearizable read; ``ActionFailed`` naming those that did not within ``timeout_s``."""
        began = time.monotonic()
        waiting = set(self.members if replicas is None else replicas)
        while waiting:
            for replica in sorted(waiting):
                if await self.serves(replica):
                    waiting.discard(replica)
            if not waiting:
                break
            if time.monotonic() - began > timeout_s:
                raise ActionFailed(f"{self.name} replicas {sorted(waiting)} did not serve "
                                   f"within {timeout_s:g} s")
            await asyncio.sleep(PROBE_INTERVAL_S)
        return time.monotonic() - began

    async def voters(self) -> dict[int, bool] | None:
        """Member id -> voter, as the first member that answers has the log's member set
        (None: none answered)."""
        for replica in self.members:
            client = Client(new_client_id(), [self.spec(replica).client_address],
                            timeout_s=PROBE_TIMEOUT_S, attempts=1)
            try:
                members = members_of_status(await client.status())
            except (OSError, TimeoutError, SDPaxosError):
                continue
            finally:
                await client.close()
            if members is not None:
                return {member.id: member.voter for member in members}
        return None

    # ------------------------------------------------------------- actions

    async def kill_and_restart(self, victim: int, down_s: float) -> dict[str, Any]:
        """SIGKILL ``victim``, ``down_s`` seconds down, started again; until it serves."""
        if victim in self.local.processes:
            await asyncio.to_thread(self.local.kill, victim)
        await asyncio.sleep(down_s)
        self.local.start(victim)
        serving = await self.wait_serving([victim])
        return {"replica": victim, "down_s": down_s, "serving_after_start_s": round(serving, 3)}

    async def replace(self, old: int) -> dict[str, Any]:
        """``old`` replaced by a new replica (see the module)."""
        began = time.monotonic()
        new = new_member_entry(self.local, self.spec(old).site)
        self._leaving.add(old)
        result = await run_tool(replace_command(self.config_path, old, new))
        if result.code != 0:
            raise ActionFailed(f"member replace {old} exited {result.code}: "
                               f"{(result.stderr or result.stdout).strip()[-500:]}")
        self.local.start(new.id)
        deadline = time.monotonic() + REPLACE_TIMEOUT_S
        while True:
            voters = await self.voters()
            if voters is not None and voters.get(new.id) and old not in voters:
                break
            if time.monotonic() > deadline:
                raise ActionFailed(f"{new.id} did not replace {old} within "
                                   f"{REPLACE_TIMEOUT_S:g} s (members: {voters})")
            await asyncio.sleep(0.5)
        promoted = time.monotonic() - began
        self.members = [new.id if r == old else r for r in self.members]
        code = await retire(self.local, old)
        self._leaving.discard(old)
        serving = await self.wait_serving()
        return {"old": old, "new": new.id, "voter_after_s": round(promoted, 3),
                "old_exit_status": code, "serving_after_s": round(serving, 3)}

    async def backup(self, path: Path) -> dict[str, Any]:
        """``sdpaxos snapshot save PATH``; the file checked."""
        result = await run_tool(["snapshot", "save", str(path), "--config",
                                 str(self.config_path)])
        if result.code != 0:
            raise ActionFailed(f"snapshot save exited {result.code}: "
                               f"{(result.stderr or result.stdout).strip()[-500:]}")
        header, meta, _ = decode_backup(path.read_bytes())
        return {"file": path.name, "bytes": path.stat().st_size, "slot": meta.slot,
                "state_machine": header.state_machine, "seconds": round(result.seconds, 3)}

    async def apply_config(self, path: Path) -> dict[str, Any]:
        """``sdpaxos ctl config apply PATH``, after a dry run that must keep every group."""
        base = ["ctl", "--config", str(self.config_path), "--json", "config", "apply", str(path)]
        planned = await run_tool([*base, "--dry-run"])
        if planned.code != 0:
            raise ActionFailed(f"config apply --dry-run exited {planned.code}: "
                               f"{planned.stderr.strip()[-500:]}")
        outcomes = _outcomes(json.loads(planned.stdout))
        if set(outcomes) - {"kept"}:
            raise ActionFailed(f"the edit of {path.name} would not keep every group: {outcomes}")
        applied = await run_tool(base)
        if applied.code != 0:
            raise ActionFailed(f"config apply exited {applied.code}: "
                               f"{applied.stderr.strip()[-500:]}")
        doc = json.loads(applied.stdout)
        return {"file": path.name, "digest": doc["digest"][:12], "changed": doc["changed"],
                "groups": _outcomes(doc)}

    def logs(self) -> str:
        return self.local.logs()


def _outcomes(report: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in (report.get("groups") or {}).values():
        counts[entry["outcome"]] = counts.get(entry["outcome"], 0) + 1
    return counts
