"""``sdpaxos endpoint status|health`` and the key-value verbs ``get / put / del / cas / watch``
against a real local cluster (issue 21 point 2): what they print, their exit codes, and where
they find the cluster (``--endpoints``, ``--config``, ``$SDPAXOS_ENDPOINTS``/``$SDPAXOS_CONFIG``,
options before and after the action)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.cli import main
from consensus.runtime.client_options import CONFIG_ENV, ENDPOINTS_ENV
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.exit_codes import OK, REFUSED, UNAVAILABLE, USAGE
from consensus.runtime.local_cluster import free_base_port

#: seconds a test waits for a watcher's line
LINE_TIMEOUT_S = 10.0


def _up(directory: Path) -> Path:
    assert main(["cluster", "init", "--dir", str(directory), "--no-wan",
                 "--base-port", str(free_base_port())]) == OK
    assert main(["cluster", "up", "--dir", str(directory)]) == OK
    return directory / "cluster.toml"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("verbs")
    config = _up(directory)
    try:
        yield config
    finally:
        main(["cluster", "down", "--dir", str(directory)])


def _endpoints(config: Path) -> list[str]:
    return [f"{s.client_address[0]}:{s.client_address[1]}"
            for s in load_cluster_config(config).replicas]


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


def test_endpoint_status_reports_every_replica_with_options_before_or_after_the_action(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["endpoint", "--config", str(cluster), "status", "--json"]) == OK
    rows = _json(capsys)
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert [r["role"] for r in rows] == ["sequencer", "follower", "follower"]
    assert all(r["reachable"] and r["wal_bytes"] > 0 and r["version"] for r in rows)
    assert main(["endpoint", "status", "--config", str(cluster), "--json"]) == OK
    assert [r["id"] for r in _json(capsys)] == [0, 1, 2]


def test_endpoint_cluster_learns_every_member_from_one_endpoint(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = _endpoints(cluster)[1]
    assert main(["endpoint", "status", "--endpoints", one, "--json"]) == OK
    assert [r["id"] for r in _json(capsys)] == [1]
    assert main(["endpoint", "--cluster", "status", "--endpoints", one, "--json"]) == OK
    assert [r["endpoint"] for r in _json(capsys)] == _endpoints(cluster)
    assert main(["endpoint", "health", "--cluster", "--endpoints", one]) == OK
    table = capsys.readouterr().out
    assert "3 of 3 endpoint(s) healthy" in table and "UNHEALTHY" not in table


def test_an_unreachable_endpoint_is_shown_and_exits_unavailable(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = _endpoints(cluster)[0]
    dead = f"127.0.0.1:{free_base_port()}"
    args = ["--endpoints", f"{live},{dead}", "--timeout", "2", "--json"]
    assert main(["endpoint", "health", *args]) == UNAVAILABLE
    rows = _json(capsys)
    assert [(r["endpoint"], r["healthy"]) for r in rows] == [(live, True), (dead, False)]
    assert rows[1]["reasons"][0].startswith("unreachable")
    assert main(["endpoint", "status", *args]) == UNAVAILABLE
    assert [r["reachable"] for r in _json(capsys)] == [True, False]


def test_a_stopped_member_is_shown_unreachable_by_cluster_health(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pids = json.loads((cluster.parent / "pids.json").read_text())
    os.kill(pids["2"], signal.SIGSTOP)  # its port still accepts; it answers nothing
    try:
        assert main(["endpoint", "health", "--cluster", "--endpoints", _endpoints(cluster)[0],
                     "--timeout", "1", "--json"]) == UNAVAILABLE
    finally:
        os.kill(pids["2"], signal.SIGCONT)
    rows = _json(capsys)
    assert [r["id"] for r in rows[:2]] == [0, 1] and rows[2]["id"] is None
    assert [r["healthy"] for r in rows] == [True, True, False]
    assert rows[2]["endpoint"] == _endpoints(cluster)[2]
    assert rows[2]["reasons"][0].startswith("unreachable")


def test_kv_verbs_exit_codes_through_the_environment(
    cluster: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENDPOINTS_ENV, ",".join(_endpoints(cluster)))
    assert main(["get", "env-k"]) == REFUSED
    assert "not found" in capsys.readouterr().err
    assert main(["put", "env-k", "v1"]) == OK
    assert capsys.readouterr().out.strip() == "OK"
    assert main(["get", "env-k"]) == OK
    assert capsys.readouterr().out.strip() == "v1"
    assert main(["cas", "env-k", "v2", "--expect", "v0", "--json"]) == REFUSED
    assert _json(capsys) | {"position": 0} == {"key": "env-k", "swapped": False,
                                                "before": "v1", "position": 0}
    assert main(["cas", "env-k", "v2", "--expect", "v1"]) == OK
    assert main(["cas", "env-k", "v3", "--absent"]) == REFUSED
    assert capsys.readouterr().out.splitlines() == ["OK", "conflict: env-k holds 'v2'"]
    assert main(["get", "env-k", "--stale"]) == OK  # the local state: v2, or v1 if behind
    assert capsys.readouterr().out.strip() in ("v1", "v2")
    assert main(["get", "env-k", "--json"]) == OK
    assert _json(capsys) == {"key": "env-k", "value": "v2"}
    assert main(["del", "env-k"]) == OK
    assert main(["del", "env-k"]) == REFUSED
    assert main(["cas", "env-k", "v4", "--absent"]) == OK
    # a command-line option beats the environment: --config instead of the endpoints
    monkeypatch.setenv(ENDPOINTS_ENV, f"127.0.0.1:{free_base_port()}")
    capsys.readouterr()
    assert main(["get", "env-k", "--config", str(cluster)]) == OK
    assert capsys.readouterr().out.strip() == "v4"
    monkeypatch.delenv(ENDPOINTS_ENV)
    monkeypatch.setenv(CONFIG_ENV, str(cluster))
    assert main(["get", "env-k"]) == OK


def test_kv_verbs_usage_and_unavailable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENDPOINTS_ENV, raising=False)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert main(["get", "k"]) == USAGE
    assert "no endpoints" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["get", "k", "--endpoints", "localhost"])  # no port: usage, not a default port
    assert exited.value.code == USAGE
    assert "HOST:PORT" in capsys.readouterr().err
    assert main(["get", "k", "--config", str(tmp_path / "missing.toml")]) == USAGE
    dead = f"127.0.0.1:{free_base_port()}"
    assert main(["put", "k", "v", "--endpoints", dead, "--timeout", "1"]) == UNAVAILABLE
    assert "unavailable" in capsys.readouterr().err


class _Lines:
    """A process's stdout lines, read on a thread (a test waits for each with a deadline)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        assert process.stdout is not None
        stdout = process.stdout
        threading.Thread(target=lambda: [self.lines.put(line) for line in stdout],
                         daemon=True).start()

    def next(self) -> Any:
        return json.loads(self.lines.get(timeout=LINE_TIMEOUT_S))


def test_watch_prints_each_change_and_ends_at_wait_with_fewer_than_count(
    cluster: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = ["--config", str(cluster)]
    assert main(["put", "w", "a", *config]) == OK
    watcher = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "watch", "w", "--current", "--count", "3",
         "--wait", "4", "--json", *config],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = _Lines(watcher)
        assert lines.next() == {"key": "w", "value": "a", "current": True}
        assert main(["put", "w", "b", *config]) == OK
        assert lines.next() == {"key": "w", "value": "b"}
        assert main(["del", "w", *config]) == OK
        assert lines.next() == {"key": "w", "value": None}
        started = time.monotonic()
        assert watcher.wait(timeout=LINE_TIMEOUT_S) == REFUSED  # 2 of 3 changes: it ends
        assert time.monotonic() - started < LINE_TIMEOUT_S
        assert watcher.stderr is not None and "2 of 3 changes" in watcher.stderr.read()
    finally:
        if watcher.poll() is None:
            os.kill(watcher.pid, signal.SIGKILL)
            watcher.wait()


def test_snapshot_save_through_endpoints_learns_the_cluster_from_a_replica(
    cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from consensus.storage.backup import decode_backup

    backup = tmp_path / "b.bak"
    one = _endpoints(cluster)[2]
    assert main(["snapshot", "save", str(backup), "--endpoints", one]) == OK
    header, _, _ = decode_backup(backup.read_bytes())
    assert (header.cluster_id, header.state_machine, header.replicas) == ("local", "kv", 3)
    assert main(["snapshot", "save", str(backup), "--endpoints", one, "--id", "0"]) == USAGE
    dead = f"127.0.0.1:{free_base_port()}"
    assert main(["snapshot", "save", str(tmp_path / "no.bak"), "--endpoints", dead,
                 "--timeout", "1"]) == UNAVAILABLE
    assert not (tmp_path / "no.bak").exists()


@pytest.mark.parametrize(("key", "fragment"), [
    ("", "a key must be 1..1024 bytes of UTF-8, not 0"),
    ("k" * 1025, "a key must be 1..1024 bytes of UTF-8, not 1025"),
])
def test_an_empty_or_oversize_key_is_a_usage_error(
    key: str, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 34: an empty key was accepted ("OK") and stored
    for verb in (["put", key, "v"], ["get", key], ["del", key], ["cas", key, "v", "--absent"]):
        with pytest.raises(SystemExit) as exited:
            main([*verb, "--endpoints", "127.0.0.1:1"])
        assert exited.value.code == USAGE
        assert fragment in capsys.readouterr().err
    from consensus.statemachine import kv_put

    with pytest.raises(ValueError, match="a key must be"):
        kv_put(key, "v")
