"""Membership with real processes on loopback (issue 20, point 6): under client writes, grow
3 -> 4 -> 5 voters, remove the sequencer, shrink back to 3, and replace a killed replica
whose disk is gone with a fresh one on a new port and data directory. The client history
(writes across every change, then reads at every member) is linearizable, and every member
ends at the same applied position."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

from bench.cli import main
from consensus.runtime.client import Client
from consensus.runtime.exit_codes import REMOVED
from consensus.runtime.local_cluster import LocalCluster
from consensus.sim.history import Operation
from consensus.sim.lincheck import Verdict, check_history
from consensus.statemachine import kv_get, kv_put

#: how long a change may take to show (a learner catches up, the epoch closes)
CHANGE_S = 40.0
#: how long the cluster may take to take writes again after a change
SERVE_S = 30.0


def members(cluster: LocalCluster, capsys: Any) -> dict[str, Any]:
    capsys.readouterr()
    code = main(["member", "list", "--config", str(cluster.config_path), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    doc: dict[str, Any] = json.loads(out)
    return doc


def member(cluster: LocalCluster, capsys: Any, *words: str) -> str:
    capsys.readouterr()
    code = main(["member", *words, "--config", str(cluster.config_path)])
    out = capsys.readouterr()
    assert code == 0, out
    return str(out.out)


def wait_for(cluster: LocalCluster, capsys: Any, what: str, done: Any) -> dict[str, Any]:
    deadline = time.monotonic() + CHANGE_S
    while True:
        try:
            doc = members(cluster, capsys)
            if done(doc):
                return doc
        except AssertionError:
            doc = {}
        assert time.monotonic() < deadline, f"{what}: {doc}\n{cluster.logs()}"
        time.sleep(0.2)


def voters(doc: dict[str, Any]) -> list[int]:
    return sorted(m["id"] for m in doc["members"] if m["role"] == "voter")


def join(cluster: LocalCluster, new_id: int) -> None:
    """Its entry in the cluster file (joined = true), its identity, and its process."""
    assert cluster.add_member_entry("IRE").id == new_id
    cluster.start(new_id)


#: keys the writes go round (each overwritten: a stale read would show)
KEYS = 10


def _now_us() -> int:
    return time.monotonic_ns() // 1000


class Writer:
    """Writes through whichever members answer, recording the client history (for the
    linearizability checker, ``sdpaxos lincheck``'s)."""

    def __init__(self) -> None:
        self.acked: dict[str, str] = {}
        self.count = 0
        self.history: list[Operation] = []

    async def write(self, addresses: list[tuple[str, int]], n: int) -> None:
        deadline = time.monotonic() + SERVE_S
        async with Client(4242, addresses, timeout_s=2.0, attempts=len(addresses)) as client:
            done = 0
            while done < n:
                key, value = f"k{self.count % KEYS}", f"v{self.count}"
                call = _now_us()
                while True:  # the same (client, seq) again: it takes effect once
                    try:
                        await client.execute(kv_put(key, value), (key,), seq=self.count)
                        break
                    except Exception:
                        assert time.monotonic() < deadline, "writes not taken"
                        await asyncio.sleep(0.2)
                self.history.append(Operation(client=4242, key=key, op="write", input=value,
                                              output=None, call=call, ret=_now_us()))
                self.acked[key] = value
                self.count += 1
                done += 1

    async def check(self, address: tuple[str, int], reader: int) -> None:
        """Linearizable reads of every key at one member, into the history."""
        async with Client(reader, [address], timeout_s=5.0, attempts=3) as client:
            for key in sorted(self.acked):
                call = _now_us()
                reply = await client.read(kv_get(key), (key,))
                value = msgpack.unpackb(reply.payload)[1]
                self.history.append(Operation(client=reader, key=key, op="read", input=None,
                                              output=value, call=call, ret=_now_us()))


def client_addresses(cluster: LocalCluster, ids: list[int], base: int) -> list[tuple[str, int]]:
    return [("127.0.0.1", base + 100 + i) for i in ids]


def test_grow_shrink_remove_the_sequencer_and_replace_a_lost_replica(
    tmp_path: Path, capsys: Any
) -> None:
    # (small snapshots: a joining member gets a voter's snapshot, then the log after it)
    cluster = LocalCluster(tmp_path, 3, extra_args=("--snapshot-every", "15"))
    base = cluster.config.replicas[0].address[1]
    cluster.start_all()
    writer = Writer()
    try:
        asyncio.run(writer.write(client_addresses(cluster, [0, 1, 2], base), 10))
        # 3 -> 4 -> 5: each joins as a learner and is promoted once caught up
        for new_id in (3, 4):
            out = member(cluster, capsys, "add", "--address", f"127.0.0.1:{base + new_id}",
                         "--client-address", f"127.0.0.1:{base + 100 + new_id}",
                         "--site", "IRE", "--id", str(new_id))
            assert f"ok: {new_id} added as a learner" in out and "joined = true" in out
            join(cluster, new_id)
            wait_for(cluster, capsys, f"{new_id} promoted",
                     lambda doc, n=new_id: n in voters(doc))
            live = voters(members(cluster, capsys))
            asyncio.run(writer.write(client_addresses(cluster, live, base), 10))
        assert voters(members(cluster, capsys)) == [0, 1, 2, 3, 4]
        # remove the sequencer: the next voter takes over
        doc = members(cluster, capsys)
        (sequencer,) = [m["id"] for m in doc["members"] if m["sequencer"]]
        member(cluster, capsys, "remove", str(sequencer))
        doc = wait_for(cluster, capsys, "sequencer removed",
                       lambda d: sequencer not in voters(d) and len(voters(d)) == 4)
        assert any(m["sequencer"] for m in doc["members"])
        # the removed replica stops by itself, saying so (a supervisor must not restart it)
        assert cluster.processes.pop(sequencer).wait(timeout=SERVE_S) == REMOVED
        asyncio.run(writer.write(client_addresses(cluster, voters(doc), base), 10))
        # back to three
        other = voters(doc)[0]
        member(cluster, capsys, "remove", str(other))
        doc = wait_for(cluster, capsys, "back to 3", lambda d: len(voters(d)) == 3)
        assert cluster.processes.pop(other).wait(timeout=SERVE_S) == REMOVED
        asyncio.run(writer.write(client_addresses(cluster, voters(doc), base), 10))
        # a replica loses its disk: replaced by a new one on a new port and directory
        lost = voters(doc)[-1]
        cluster.kill(lost)
        shutil.rmtree(cluster.config.replica_dir(lost))
        refused = subprocess.run(
            [sys.executable, "-m", "bench.cli", "serve", "--config", str(cluster.config_path),
             "--id", str(lost)], capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "must not rejoin" in refused.stderr
        new_id = 5
        out = member(cluster, capsys, "replace", str(lost), "--address",
                     f"127.0.0.1:{base + new_id}", "--client-address",
                     f"127.0.0.1:{base + 100 + new_id}", "--site", "IRE", "--id", str(new_id))
        assert f"{new_id} added as a learner to replace {lost}" in out
        join(cluster, new_id)
        doc = wait_for(cluster, capsys, "replaced",
                       lambda d: new_id in voters(d) and lost not in voters(d))
        live = voters(doc)
        assert len(live) == 3
        asyncio.run(writer.write(client_addresses(cluster, live, base), 10))
        # every acknowledged write at every member, and the same state everywhere
        for replica in live:
            asyncio.run(writer.check(("127.0.0.1", base + 100 + replica), 5000 + replica))
        # the whole client history is linearizable: every acknowledged write is there, the
        # latest of each key everywhere
        verdict = check_history(writer.history)
        assert verdict.verdict is Verdict.OK, verdict.detail
        deadline = time.monotonic() + SERVE_S
        while True:  # the members converge on one applied position
            applied = set()
            for replica in live:
                capsys.readouterr()
                assert main(["endpoint", "status", "--endpoints",
                             f"127.0.0.1:{base + 100 + replica}", "--json"]) == 0
                (status,) = json.loads(capsys.readouterr().out)
                applied.add(status["applied"])
            if len(applied) == 1:
                break
            assert time.monotonic() < deadline, applied
            time.sleep(0.2)
        assert writer.count == 60 and len(writer.acked) == KEYS
        listed = members(cluster, capsys)  # every member's position, from its own status
        assert {m["id"]: m["lag"] for m in listed["members"]} == dict.fromkeys(live, 0)
    finally:
        cluster.stop_all()
