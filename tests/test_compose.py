"""The docker-compose demo, checked without docker (which does not run here): its services,
that every command it runs is a real CLI verb with valid arguments, and that its configs parse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bench.cli import build_parser
from cluster_state.config import load_config
from consensus.runtime.cluster_config import load_cluster_config

ROOT = Path(__file__).resolve().parent.parent
REGIONS = ["ca", "or", "oh", "ire", "sel"]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def expand(words: list[str], replicas: int) -> list[str]:
    """Compose's ${VAR:-default} interpolation, with SDPAXOS_REPLICAS set."""
    return [re.sub(r"\$\{SDPAXOS_REPLICAS:-\d+\}", str(replicas), w) for w in words]


def parse_cli(words: list[str]) -> None:
    assert words[0] != "sdpaxos" or len(words) > 1
    if words[0] == "sdpaxos":
        words = words[1:]
    build_parser(words[0]).parse_args(words)  # SystemExit on an unknown verb or argument


def test_one_replica_and_one_scheduler_per_region_with_profiles() -> None:
    services = compose()["services"]
    assert set(services) == {f"{kind}-{r}" for r in REGIONS for kind in ("replica", "scheduler")
                             } | {"certs"}  # the TLS init step (tests/test_compose_tls.py)
    for i, region in enumerate(REGIONS):
        profiles = set(services[f"replica-{region}"]["profiles"])
        assert profiles == ({"three", "five"} if i < 3 else {"five"})
        assert set(services[f"scheduler-{region}"]["profiles"]) == profiles
        scheduler = services[f"scheduler-{region}"]
        assert scheduler["depends_on"][f"replica-{region}"]["condition"] == "service_healthy"


@pytest.mark.parametrize("replicas", [3, 5])
def test_every_command_is_a_cli_verb_and_its_config_parses(replicas: int) -> None:
    services = compose()["services"]
    regions = REGIONS[:replicas]
    for i, region in enumerate(regions):
        replica = services[f"replica-{region}"]
        serve = expand(replica["command"], replicas)
        parse_cli(serve)
        assert serve[:1] == ["serve"] and serve[serve.index("--id") + 1] == str(i)
        config_path = serve[serve.index("--config") + 1]
        assert config_path.startswith("/etc/sdpaxos/")  # deploy/ is copied there (Dockerfile)
        local = ROOT / "deploy" / Path(config_path).name
        config = load_cluster_config(local)
        assert [spec.site for spec in config.replicas] == [r.upper() for r in regions]
        assert config.replica(i).address[0] == f"replica-{region}"
        assert config.one_way_us[0][1] > 0  # WAN delays emulated by the transport
        parse_cli(expand(replica["healthcheck"]["test"][1:], replicas))
        parse_cli(expand(services[f"scheduler-{region}"]["command"], replicas))
        assert replica["volumes"][0] == f"wal-{region}:/var/lib/sdpaxos"
    assert load_config(ROOT / "deploy" / "gpu-cluster.yaml")


def test_the_image_ships_the_configs_and_the_entrypoint_uses_real_verbs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY deploy /etc/sdpaxos" in dockerfile
    assert "pip install" in dockerfile
    entrypoint = (ROOT / "deploy" / "entrypoint.sh").read_text()
    parse_cli(["cluster", "netem", "--config", "c.toml", "--id", "0", "--apply"])
    assert "sdpaxos cluster netem" in entrypoint and "--no-wan-emulation" in entrypoint
    parse_cli(["serve", "--config", "c.toml", "--id", "0", "--no-wan-emulation"])
