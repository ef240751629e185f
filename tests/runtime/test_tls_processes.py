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
from consensus.errors import IndefiniteFailure
from consensus.runtime.client import Client
from consensus.runtime.cluster_config import load_cluster_config
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
        except IndefiniteFailure:
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
