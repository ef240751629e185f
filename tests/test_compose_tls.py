"""The compose demo's TLS and unprivileged containers, checked without docker (issue 22,
point 5): the image runs as a non-root user owning what its volumes mount on; a `certs` init
step makes the certificates every replica and scheduler mounts read-only; the CA's key is
mounted by nobody else; and that init step, run on the demo's own cluster files, makes exactly
the files they name (mode 0600), keeps them when run again, and names every replica."""

from __future__ import annotations

import re
import shutil
import stat
from pathlib import Path

import pytest
from test_compose import ROOT, compose, expand, parse_cli

from consensus.runtime.cli import _cert_init
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.tls import identity_of_pem

CERTS_MOUNT = "/etc/sdpaxos/tls"
CA_MOUNT = "/etc/sdpaxos/ca"


def test_the_image_runs_as_an_unprivileged_user_owning_its_mount_points() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.MULTILINE)
    assert users, "the image names a USER"
    assert users[-1].split(":")[0] not in ("root", "0")
    # the USER line comes after everything that needs root
    assert dockerfile.rindex("USER ") > dockerfile.rindex("pip install")
    assert dockerfile.rindex("USER ") > dockerfile.rindex("apt-get")
    chown = next(line for line in dockerfile.splitlines() if "chown" in line)
    for mount in ("/var/lib/sdpaxos", CERTS_MOUNT, CA_MOUNT):
        assert mount in chown, f"{mount} belongs to the user (new volumes copy that)"


def test_certificates_come_from_an_init_step_and_are_mounted_read_only() -> None:
    services = compose()["services"]
    certs = services["certs"]
    parse_cli(expand(certs["command"], 5))
    assert certs["command"][:2] == ["cert", "init"] and "--exist-ok" in certs["command"]
    assert f"certs:{CERTS_MOUNT}" in certs["volumes"] and f"ca:{CA_MOUNT}" in certs["volumes"]
    for name, service in services.items():
        if name == "certs":
            continue
        volumes = service["volumes"]
        assert f"certs:{CERTS_MOUNT}:ro" in volumes, f"{name} mounts the certificates read-only"
        assert not any(v.startswith("ca:") for v in volumes), f"{name} must not see the CA key"
    for region in ("ca", "or", "oh", "ire", "sel"):
        depends = services[f"replica-{region}"]["depends_on"]
        assert depends["certs"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("replicas", [3, 5])
def test_the_init_step_makes_what_the_demo_cluster_files_name(
    replicas: int, tmp_path: Path
) -> None:
    for name in (f"cluster-{replicas}.toml", "gpu-cluster.yaml"):
        shutil.copy(ROOT / "deploy" / name, tmp_path / name)
    path = tmp_path / f"cluster-{replicas}.toml"
    config = load_cluster_config(path)
    tls = config.tls
    assert tls is not None and tls.client is not None and tls.ca_key is not None
    # what the replicas read lies in the read-only mount, the CA key in its own
    deployed = load_cluster_config(ROOT / "deploy" / path.name).tls
    assert deployed is not None and deployed.ca_key is not None
    inside = [deployed.ca, *(f for r in deployed.replicas.values() for f in (r.cert, r.key))]
    for file in inside:
        assert file.parent.name == Path(CERTS_MOUNT).name, file
    assert deployed.ca_key.parent.name == Path(CA_MOUNT).name
    assert _cert_init(path, exist_ok=True) == 0
    made = [tls.ca, tls.ca_key, tls.client.cert, tls.client.key,
            *(f for r in tls.replicas.values() for f in (r.cert, r.key))]
    for file in made:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    for i, files in tls.replicas.items():
        assert identity_of_pem(files.cert.read_bytes(), config.cluster_id).replica == i
    before = tls.ca.read_bytes()
    assert _cert_init(path, exist_ok=True) == 0  # a restart of the demo keeps its CA
    assert tls.ca.read_bytes() == before
