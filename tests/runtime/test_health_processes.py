"""``/livez`` and ``/readyz`` of real replica processes: all ready when serving; a replica cut
off in a minority stays live (200) but is not ready (503) while the majority stays ready; the
``sdpaxos cluster health --probe`` command and the compose health checks agree."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from consensus.runtime.client import cut_off
from consensus.runtime.health import HTTP_OK, HTTP_UNAVAILABLE, http_probe, run_probe
from consensus.runtime.local_cluster import LocalCluster

#: how long the cluster may take to elect and serve, and a probe to change its answer
SETTLE_S = 20.0
PROBE_TIMEOUT_S = 2.0


async def probe(cluster: LocalCluster, replica: int, path: str) -> tuple[int, str]:
    address = cluster.config.replica(replica).metrics_address
    assert address is not None
    return await http_probe(*address, path, PROBE_TIMEOUT_S)


async def wait_status(cluster: LocalCluster, replica: int, path: str, status: int) -> str:
    deadline = time.monotonic() + SETTLE_S
    while True:
        got, body = await probe(cluster, replica, path)
        if got == status:
            return body
        assert time.monotonic() < deadline, (
            f"replica {replica} /{path} answered {got} {body!r}, not {status}\n" + cluster.logs()
        )
        await asyncio.sleep(0.05)


async def isolate(cluster: LocalCluster, lonely: int) -> None:
    everyone = range(len(cluster.config.replicas))
    await cut_off(cluster.client_addresses[lonely], [r for r in everyone if r != lonely])
    for replica in everyone:
        if replica != lonely:
            await cut_off(cluster.client_addresses[replica], [lonely])


async def heal(cluster: LocalCluster) -> None:
    for address in cluster.client_addresses:
        await cut_off(address, [])


def test_a_replica_in_a_minority_is_live_but_not_ready(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 3, extra_args=("--fault-injection",))
    cluster.start_all()
    try:
        async def ready_then_isolated() -> str:
            for replica in range(3):
                await wait_status(cluster, replica, "readyz", HTTP_OK)
                assert (await probe(cluster, replica, "livez"))[0] == HTTP_OK
            assert (await probe(cluster, 0, "nothing"))[0] == 404
            await isolate(cluster, 2)
            reasons = await wait_status(cluster, 2, "readyz", HTTP_UNAVAILABLE)
            assert (await probe(cluster, 2, "livez"))[0] == HTTP_OK
            for replica in (0, 1):  # the majority keeps serving, and says so
                await wait_status(cluster, replica, "readyz", HTTP_OK)
            return reasons

        reasons = asyncio.run(ready_then_isolated())
        assert "heard from 1 of 3 replicas" in reasons
        # the command compose and exec probes run: 1 for not ready, 0 for live
        assert run_probe(str(cluster.config_path), 2, "readyz", PROBE_TIMEOUT_S) == 1
        assert run_probe(str(cluster.config_path), 2, "livez", PROBE_TIMEOUT_S) == 0
        assert run_probe(str(cluster.config_path), 0, "readyz", PROBE_TIMEOUT_S) == 0

        async def healed() -> None:
            await heal(cluster)
            await wait_status(cluster, 2, "readyz", HTTP_OK)

        asyncio.run(healed())
        cluster.kill(1)

        async def killed_peer() -> None:  # two of three still make a majority
            for replica in (0, 2):
                await wait_status(cluster, replica, "readyz", HTTP_OK)

        asyncio.run(killed_peer())
        assert run_probe(str(cluster.config_path), 1, "livez", PROBE_TIMEOUT_S) == 1  # gone
    finally:
        cluster.stop_all()


def test_probe_of_a_bad_configuration_is_a_usage_error(tmp_path: Path) -> None:
    missing = tmp_path / "none.toml"
    assert run_probe(str(missing), 0, "livez", PROBE_TIMEOUT_S) == 2


def test_compose_health_checks_probe_readiness() -> None:
    import yaml

    from bench.cli import build_parser

    compose = yaml.safe_load((Path(__file__).parents[2] / "docker-compose.yml").read_text())
    checks = [s["healthcheck"]["test"] for name, s in compose["services"].items()
              if name.startswith("replica-")]
    assert len(checks) == 5
    for check in checks:
        args = build_parser("cluster").parse_args(check[2:])
        assert (args.action, args.probe) == ("health", "readyz")
