"""Identity on disk with real processes (issue 20, point 1): ``cluster init`` gives every
replica its identity; a replica whose directory was wiped is refused at start without
``--initial-cluster-state new``, and with it its peers refuse it (they remember the directory
they met) and it exits saying why, while the others keep serving; a foreign directory is
refused. Plus the handshake that carries the identity."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import pytest

from bench.cli import main
from consensus.codec import FORMAT_VERSION
from consensus.errors import DecodeError
from consensus.runtime.client import Client
from consensus.runtime.local_cluster import LocalCluster
from consensus.runtime.transport import Handshake, decode_refusal, encode_refusal
from consensus.statemachine import kv_put
from consensus.storage.identity import IDENTITY_NAME, NO_INCARNATION, read_identity

#: how long a cluster may take to serve, and a refused replica to give up
SETTLE_S = 30.0


def test_the_handshake_carries_the_identity_and_reads_older_ones() -> None:
    for hello in (Handshake("c", 1, FORMAT_VERSION, False, 3, "ab12"),
                  Handshake("c", 1, FORMAT_VERSION, True, 1, "ff"),
                  Handshake("c", 1, FORMAT_VERSION, True),
                  Handshake("c", 1, FORMAT_VERSION)):
        assert Handshake.decode(hello.encode()[4:]) == hello
    assert Handshake.decode(Handshake("c", 1, FORMAT_VERSION).encode()[4:]).incarnation == (
        NO_INCARNATION)
    for bad in (["c", 1, FORMAT_VERSION, False, 0, "ab"],  # incarnation 0 is "none"
                ["c", 1, FORMAT_VERSION, False, -1, "ab"],
                ["c", 1, FORMAT_VERSION, False, True, "ab"],
                ["c", 1, FORMAT_VERSION, False, 1, b"ab"],
                ["c", 1, FORMAT_VERSION, False, 1, "ab", 7]):
        with pytest.raises(DecodeError):
            Handshake.decode(msgpack.packb(bad))
    assert decode_refusal(encode_refusal("why")[4:]) == "why"
    for junk in (b"", b"\xc1", msgpack.packb(["refused"]), msgpack.packb(["other", "x"]),
                 msgpack.packb(["refused", 3])):
        assert decode_refusal(junk) is None


def test_cluster_init_gives_every_replica_an_identity(tmp_path: Path) -> None:
    assert main(["cluster", "init", "--dir", str(tmp_path), "--no-wan",
                 "--cluster-id", "east"]) == 0
    found = [read_identity(tmp_path / "data" / f"replica-{i}") for i in range(3)]
    assert [(f.cluster_id, f.replica_id) for f in found if f is not None] == [
        ("east", 0), ("east", 1), ("east", 2)]
    assert len({f.token for f in found if f is not None}) == 3
    # init --force keeps them (the replicas' data stays, and so does whose it is)
    assert main(["cluster", "init", "--dir", str(tmp_path), "--no-wan", "--cluster-id", "east",
                 "--force"]) == 0
    assert [read_identity(tmp_path / "data" / f"replica-{i}") for i in range(3)] == found
    # ... unless it would make them another cluster's
    assert main(["cluster", "init", "--dir", str(tmp_path), "--no-wan", "--cluster-id", "west",
                 "--force"]) == 2


def serve(cluster: LocalCluster, replica: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "serve", "--config", str(cluster.config_path),
         "--id", str(replica), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


async def put(cluster: LocalCluster, client_id: int, count: int, *, home: int = 0) -> None:
    deadline = time.monotonic() + SETTLE_S
    async with Client(client_id, cluster.client_addresses, home=home) as client:
        done = 0
        while done < count:
            try:
                await client.execute(kv_put(f"k{client_id}-{done}", "v"), (f"k{client_id}-{done}",))
                done += 1
            except Exception:
                assert time.monotonic() < deadline, "the cluster did not take writes\n" + (
                    cluster.logs())
                await asyncio.sleep(0.1)


def test_a_wiped_replica_never_rejoins_as_if_it_had_not(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 3)
    cluster.start_all()
    try:
        asyncio.run(put(cluster, 1, 20))
        cluster.kill(2)
        wiped = cluster.config.replica_dir(2)
        shutil.rmtree(wiped)

        # started as before: refused before it touches anything
        plain = serve(cluster, 2)
        out, _ = plain.communicate(timeout=60)
        assert plain.returncode == 2, out
        assert "is empty (no IDENTITY)" in out and "member replace" in out
        assert not (wiped / IDENTITY_NAME).exists()

        # started as a new cluster's replica: it gets a new identity, its peers refuse it,
        # and it stops saying why
        bootstrapped = serve(cluster, 2, "--initial-cluster-state", "new")
        out, _ = bootstrapped.communicate(timeout=60)
        assert bootstrapped.returncode == 1, out
        assert "refuses this replica" in out and "another data directory" in out
        asyncio.run(put(cluster, 2, 5, home=1))  # the others kept serving
        assert "refusing peer connection" in cluster.logs()
    finally:
        cluster.stop_all()
    # a directory that is another replica's is refused too
    shutil.copy(cluster.config.replica_dir(0) / IDENTITY_NAME,
                cluster.config.replica_dir(1) / IDENTITY_NAME)
    foreign = serve(cluster, 1)
    out, _ = foreign.communicate(timeout=60)
    assert foreign.returncode == 2, out
    assert "belongs to replica 0" in out
