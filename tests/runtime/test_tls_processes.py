"""A TLS cluster as real processes (issue 22): ``sdpaxos cluster init --tls`` and ``up`` make a
working cluster the tools reach with the admin certificate; ``sdpaxos cert issue`` makes a
reader that works; ``sdpaxos cert revoke`` plus SIGHUP (no restart) stops it; the replicas'
logs hold no key material."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from bench.cli import main
from consensus.errors import IndefiniteFailure, TlsRefused
from consensus.runtime.client import Client
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.exit_codes import TLS_REFUSED
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.tls import TlsFiles, client_context
from consensus.statemachine import kv_get, kv_put

pytestmark = pytest.mark.timeout(90)


async def _read_until_refused(client: Client, deadline_s: float) -> None:
    """Reads succeed until the replicas close the revoked certificate's connection."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while loop.time() < end:
        try:
            await client.read(kv_get("k"), ["k"])
        except (IndefiniteFailure, TlsRefused):  # refused, now saying why
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the revoked certificate still works after SIGHUP")


def test_revocation_reloaded_on_sighup_by_running_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "c"
    assert main(["cluster", "init", "--tls", "--dir", str(directory), "--no-wan",
                 "--base-port", str(free_base_port())]) == 0
    config_path = directory / "cluster.toml"
    assert main(["cluster", "up", "--dir", str(directory), "--timeout", "30"]) == 0
    try:
        config = load_cluster_config(config_path)
        assert config.tls is not None
        addresses = [spec.client_address for spec in config.replicas]
        assert main(["cluster", "health", "--config", str(config_path), "--id", "1"]) == 0
        assert main(["cert", "issue", "--config", str(config_path), "--client", "ro",
                     "--role", "reader"]) == 0
        reader = client_context(config.tls.ca, TlsFiles(directory / "tls" / "ro.pem",
                                                        directory / "tls" / "ro.key"))

        async def scenario() -> None:
            async with Client(1, addresses, tls=config.tls.tool() if config.tls else None,
                              timeout_s=2.0) as admin:
                await admin.execute(kv_put("k", "v"), ["k"])
            async with Client(2, addresses, tls=reader, timeout_s=1.0, attempts=1) as ro:
                assert b"v" in (await ro.read(kv_get("k"), ["k"])).payload
                assert main(["cert", "revoke", "--config", str(config_path), "--cert",
                             str(directory / "tls" / "ro.pem")]) == 0
                pids = json.loads((directory / "pids.json").read_text()).values()
                for pid in pids:
                    os.kill(int(pid), signal.SIGHUP)
                await _read_until_refused(ro, 10.0)
            # the replicas are still up and serve the admin
            async with Client(3, addresses, tls=config.tls.tool() if config.tls else None,
                              timeout_s=2.0) as admin:
                assert b"v" in (await admin.read(kv_get("k"), ["k"])).payload

        asyncio.run(scenario())
    finally:
        assert main(["cluster", "down", "--dir", str(directory)]) == 0
    logs = "".join((directory / f"replica-{i}.log").read_text() for i in range(3))
    assert "revocation list reloaded" in logs and "is revoked" in logs
    assert "PRIVATE KEY" not in logs
    for key in (directory / "tls").glob("*.key"):
        body = [line for line in key.read_text().splitlines() if not line.startswith("-----")]
        assert not any(line in logs for line in body), key.name
    capsys.readouterr()


def test_tls_refusals_are_named_to_the_client_and_logged_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 34: a plaintext or wrong-CA client saw "connection to replica lost" or gRPC's
    "UNAVAILABLE ... Socket closed", exit 3 (retry); gRPC's C core wrote non-JSON lines into
    the replica's JSON log."""
    directory, other = tmp_path / "c", tmp_path / "other"
    assert main(["cluster", "init", "--tls", "--gpu-store", "--dir", str(directory),
                 "--no-wan", "--base-port", str(free_base_port())]) == 0
    assert main(["cluster", "init", "--tls", "--dir", str(other), "--no-wan"]) == 0
    assert main(["cluster", "up", "--dir", str(directory), "--timeout", "30"]) == 0
    try:
        config = load_cluster_config(directory / "cluster.toml")
        spec = config.replica(0)
        assert spec.grpc_address is not None
        grpc_at = f"{spec.grpc_address[0]}:{spec.grpc_address[1]}"
        native_at = f"{spec.client_address[0]}:{spec.client_address[1]}"
        capsys.readouterr()
        for verb in (["ctl", "--endpoints", grpc_at, "summary"],
                     ["endpoint", "status", "--endpoints", native_at]):
            assert main([*verb, "--timeout", "3"]) == TLS_REFUSED
            captured = capsys.readouterr()  # ctl: on stderr; endpoint: in its table
            assert "requires TLS and this client spoke" in " ".join(
                (captured.err + captured.out).split())
        theirs = ["--ca", str(other / "tls" / "ca.pem"), "--cert",
                  str(other / "tls" / "admin.pem"), "--key", str(other / "tls" / "admin.key")]
        assert main(["ctl", "--endpoints", grpc_at, "--timeout", "3", *theirs, "summary"]) \
            == TLS_REFUSED
        assert "presents a certificate this client does not trust" in capsys.readouterr().err
        ours_ca = ["--ca", str(directory / "tls" / "ca.pem"), *theirs[2:]]
        assert main(["ctl", "--endpoints", grpc_at, "--timeout", "3", *ours_ca, "summary"]) \
            == TLS_REFUSED
        assert "does not take this client's certificate" in capsys.readouterr().err
    finally:
        assert main(["cluster", "down", "--dir", str(directory)]) == 0
    lines = [line for i in range(3)
             for line in (directory / f"replica-{i}.log").read_text().splitlines()]
    records = [json.loads(line) for line in lines]  # every line is a JSON record
    assert any(r["logger"] == "grpc" and "Handshake failed" in r["msg"] for r in records)
