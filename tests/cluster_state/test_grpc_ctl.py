"""The gRPC service and ``sdpaxos ctl``: generated code is current; every verb works against
replicas serving the store; invalid requests fail clearly and change nothing."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.cli import main
from cluster_state.config import synthetic_config
from cluster_state.grpc_api.service import serve_grpc
from cluster_state.store import ClusterStore
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.node import ReplicaNode

ROOT = Path(__file__).resolve().parents[2]
PROTO = Path("cluster_state/grpc_api/cluster_state.proto")


def test_generated_code_is_current(tmp_path: Path) -> None:
    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.",
         "--grpc_python_out=.", "--pyi_out=.", str(PROTO)],
        cwd=tmp_path, check=True,
    )
    for name in ("cluster_state_pb2.py", "cluster_state_pb2.pyi", "cluster_state_pb2_grpc.py"):
        fresh = (tmp_path / PROTO.parent / name).read_text()
        assert fresh == (ROOT / PROTO.parent / name).read_text(), f"regenerate {name}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """Three in-process replicas serving the store; gRPC on replica 1. Yields host:port."""
    (tmp_path / "gpu.yaml").write_text(synthetic_config(nodes=16, vcs=2, pinned=1).to_yaml())
    base = free_base_port()
    (tmp_path / "cluster.toml").write_text(cluster_toml(3, base, wan=False))
    config = load_cluster_config(tmp_path / "cluster.toml")
    loop = asyncio.new_event_loop()
    grpc_port = base + 250
    ready = threading.Event()
    stopping: list[asyncio.Event] = []

    async def host() -> None:
        nodes = [
            ReplicaNode(config, i, ClusterStore(synthetic_config(nodes=16, vcs=2, pinned=1)),
                        fsync=False)
            for i in range(3)
        ]
        for node in nodes:
            await node.start()
        grpc_server = await serve_grpc(nodes[1], 1, "127.0.0.1", grpc_port)
        stop = asyncio.Event()
        stopping.append(stop)
        ready.set()
        await stop.wait()
        await grpc_server.stop(0.5)
        for node in nodes:
            await node.stop()

    thread = threading.Thread(target=lambda: loop.run_until_complete(host()), daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield f"127.0.0.1:{grpc_port}"
    finally:
        loop.call_soon_threadsafe(stopping[0].set)
        thread.join(30)


def ctl(capsys: pytest.CaptureFixture[str], server: str, *words: str) -> tuple[int, str, str]:
    code = main(["ctl", "--server", server, "--json", *words])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_verb_over_grpc(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = ctl(capsys, server, "submit", "train", "--vc", "vc00", "--priority", "100",
                       "--pods", "2x8,1x4")
    assert code == 0
    placed = json.loads(out)
    assert placed["placed"] == "train" and sum(p[0] for p in placed["pods"]) == 20
    code, out, _ = ctl(capsys, server, "status", "train")
    assert code == 0 and json.loads(out)["token"] == placed["token"]
    code, out, _ = ctl(capsys, server, "status")
    assert [g["name"] for g in json.loads(out)] == ["train"]
    code, out, _ = ctl(capsys, server, "vc", "vc00")
    assert json.loads(out)["leaves"]["used"] == 20
    code, out, _ = ctl(capsys, server, "node", placed["pods"][0][1], "--bad")
    assert code == 0 and json.loads(out)["changed"] is True
    code, out, _ = ctl(capsys, server, "release", "train")
    assert code == 0 and json.loads(out)["released"] == "train"
    code, out, _ = ctl(capsys, server, "watch", "--count", "3")
    kinds = [json.loads(line)["kind"] for line in out.splitlines()]
    assert kinds == ["placed", "node_health", "released"]
    # the table output, too
    assert main(["ctl", "--server", server, "status"]) == 0
    assert "allocations" in capsys.readouterr().out


def test_invalid_requests_fail_clearly_and_change_nothing(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        (["--vc", "nope", "--priority", "1", "--pods", "1x1"], "unknown virtual cluster"),
        (["--vc", "vc00", "--priority", "1001", "--pods", "1x1"], "priority"),
        (["--vc", "vc00", "--priority", "-1", "--pods", "1x8", "--pinned", "vc00-PIN"],
         "pinned"),
        (["--vc", "vc00", "--priority", "1", "--pods", "1x9"], "does not fit"),
    ]
    for words, message in cases:
        code, _, err = ctl(capsys, server, "submit", "bad", *words)
        assert code == 1 and "INVALID_ARGUMENT" in err and message in err, err
    code, out, _ = ctl(capsys, server, "status")
    assert json.loads(out) == []
    code, _, err = ctl(capsys, server, "status", "nobody")
    assert code == 1 and "NOT_FOUND" in err
    with pytest.raises(SystemExit):
        main(["ctl", "--server", server, "submit", "x", "--vc", "vc00", "--pods", "2y8"])
