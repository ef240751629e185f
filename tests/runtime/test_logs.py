"""The long-running verbs' logs (``consensus.runtime.logs``): JSON lines with ISO-8601 UTC
timestamps, a logged exception's traceback inside its one line, and ``--log-level``, here in
process and on real ``sdpaxos serve`` replicas."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from consensus.runtime.health import HTTP_OK, http_probe
from consensus.runtime.local_cluster import LocalCluster
from consensus.runtime.logs import LOG_LEVELS, configure_logging
from consensus.runtime.node import ReplicaNode

#: how long replicas may take to answer /livez and to log that they serve
SETTLE_S = 20.0


@contextlib.contextmanager
def fresh_root_logger() -> Iterator[None]:
    """A root logger without handlers, as a fresh ``sdpaxos`` process has (configure_logging
    leaves a configured one alone); pytest's handlers and level come back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def parse(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object (a line that is not one fails)."""
    return [json.loads(line) for line in text.splitlines()]


def check_timestamp(entry: dict[str, Any]) -> None:
    stamp = datetime.fromisoformat(entry["ts"])
    assert stamp.utcoffset() == timedelta(0), entry["ts"]  # UTC, said so
    assert abs(datetime.now(UTC) - stamp) < timedelta(minutes=5), entry["ts"]


def test_a_logged_exception_is_one_json_line_with_its_traceback() -> None:
    stream = io.StringIO()
    log = logging.getLogger("sdpaxos.test")
    with fresh_root_logger():
        configure_logging("info", stream)
        try:
            {}["missing"]
        except KeyError:
            log.exception("replica %d: event loop failed", 3)
    (entry,) = parse(stream.getvalue())  # one line, and it is JSON
    assert entry["level"] == "error" and entry["logger"] == "sdpaxos.test"
    assert entry["msg"] == "replica 3: event loop failed"
    assert entry["exc"].startswith("Traceback (most recent call last):")
    assert "{}[\"missing\"]" in entry["exc"] and entry["exc"].endswith("KeyError: 'missing'")
    check_timestamp(entry)


def test_the_level_filters_and_stack_info_stays_inside() -> None:
    stream = io.StringIO()
    log = logging.getLogger("sdpaxos.test")
    with fresh_root_logger():
        configure_logging("warning", stream)
        log.info("not shown")
        log.warning("shown", stack_info=True)
        # configured once: a second call (a verb run in-process again) changes nothing
        configure_logging("debug", io.StringIO())
        log.info("still not shown")
        log.warning("shown again")
    (entry, again) = parse(stream.getvalue())
    assert entry["msg"] == "shown" and entry["level"] == "warning"
    assert entry["stack"].startswith("Stack (most recent call last):")
    with pytest.raises(ValueError, match="log level must be one of"):
        configure_logging("chatty")
    assert LOG_LEVELS[0] == "debug"
    assert again["msg"] == "shown again"


def test_serve_logs_json_lines_at_its_log_level(tmp_path: Path) -> None:
    """Replica 0 at --log-level info says it serves and stops, in JSON lines; replica 1 at
    --log-level error, serving all the same (its /livez answers), says nothing."""
    cluster = LocalCluster(tmp_path, 3)
    levels = {0: "info", 1: "error", 2: "info"}
    for replica, level in levels.items():
        cluster.extra_args = ("--log-level", level)
        cluster.start(replica)
    log_of = {replica: tmp_path / f"replica-{replica}.log" for replica in levels}

    async def serving() -> None:
        deadline = time.monotonic() + SETTLE_S
        for replica in levels:
            address = cluster.config.replica(replica).metrics_address
            assert address is not None
            while (await http_probe(*address, "livez", 1.0))[0] != HTTP_OK:
                assert time.monotonic() < deadline, cluster.logs()
                await asyncio.sleep(0.05)
        while "serving peers" not in log_of[0].read_text():
            assert time.monotonic() < deadline, cluster.logs()
            await asyncio.sleep(0.05)

    try:
        asyncio.run(serving())
    finally:
        cluster.stop_all()
    chatty = parse(log_of[0].read_text())
    assert any(e["msg"].startswith("replica 0 serving peers") for e in chatty), chatty
    assert any(e["msg"] == "replica 0 shutting down" for e in chatty), chatty
    for entry in chatty:
        check_timestamp(entry)
    assert log_of[1].read_text() == "", "an info line at --log-level error"


def test_the_replica_loop_failing_is_logged_with_its_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The node's own ``log.exception`` (its loop died) goes through the JSON formatter as
    one line holding the traceback."""
    from consensus.runtime.cli import cluster_toml
    from consensus.runtime.cluster_config import load_cluster_config
    from consensus.runtime.local_cluster import free_base_port
    from consensus.runtime.logs import JsonFormatter
    from consensus.statemachine import KVStore

    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, free_base_port(), wan=False))
    node = ReplicaNode(load_cluster_config(path), 0, KVStore(), fsync=False)

    def broken_tick(now: int) -> None:
        raise RuntimeError("disk on fire")

    node.core.tick = broken_tick  # type: ignore[method-assign]

    async def run() -> None:
        with pytest.raises(RuntimeError):
            await node.turns.run()  # its first turn ticks the core

    with caplog.at_level(logging.ERROR, logger="sdpaxos.node"):
        asyncio.run(run())
    (record,) = [r for r in caplog.records if r.name == "sdpaxos.node"]
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["msg"] == "replica 0: event loop failed"
    assert "RuntimeError: disk on fire" in entry["exc"] and "broken_tick" in entry["exc"]


def test_lines_native_libraries_write_on_stderr_become_json_records() -> None:
    """Issue 34: gRPC's C core wrote its own lines into the replica's JSON log."""
    code = """
import logging, os, time
from consensus.runtime.logs import configure_logging
from consensus.runtime.native_logs import capture_native_stderr
configure_logging("info")
capture_native_stderr()
os.write(2, b"I1128 19:52:01.518153    2502 ssl_transport_security.cc:2563] Handshake failed\\n")
os.write(2, b"E1128 19:52:01.518200    2502 chttp2_server.cc:12] bind failed\\n")
os.write(2, b"not absl at all\\n")
logging.getLogger("sdpaxos").warning("our own")
time.sleep(0.5)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    assert sorted((r["logger"], r["level"], r["msg"]) for r in records) == sorted([
        ("grpc", "info", "Handshake failed (ssl_transport_security.cc:2563)"),
        ("grpc", "error", "bind failed (chttp2_server.cc:12)"),
        ("stderr", "warning", "not absl at all"),
        ("sdpaxos", "warning", "our own"),  # the thread logs the pipe's lines when it can
    ])


def test_a_replica_that_cannot_bind_its_port_logs_one_json_record(tmp_path: Path) -> None:
    """A port taken by another process: the replica's log stays JSON (a Python traceback
    was printed over it) and it exits 1."""
    import socket

    from consensus.runtime.cli import cluster_toml
    from consensus.runtime.local_cluster import free_base_port

    base = free_base_port()
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_toml(3, base, wan=False))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base))  # replica 0's peer port
        taken.listen()
        done = subprocess.run(
            [sys.executable, "-m", "bench.cli", "serve", "--config", str(path), "--id", "0",
             "--initial-cluster-state", "new"],
            capture_output=True, text=True, timeout=60, env={**os.environ,
                                                             "PYTHONPATH": os.getcwd()})
    assert done.returncode == 1
    records = [json.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    assert any(r["level"] == "error" and "replica 0 stopped" in r["msg"]
               and "address already in use" in r["msg"] for r in records), records
