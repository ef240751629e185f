"""``sdpaxos bench throughput``: a smoke run (not a timed test: no performance asserted), and
teardown of every process it started when interrupted."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from bench_procs import (
    ROOT,
    BenchRunner,
    assert_nothing_left,
    bench_command,
    processes_mentioning,
)

LATENCY_FIELDS = {"count", "p50_ms", "mean_ms", "p95_ms", "p99_ms", "max_ms"}


@pytest.mark.timeout(120)
def test_quick_run_reports_every_protocol_with_and_without_a_straggler(
    run_bench: BenchRunner,
) -> None:
    report = run_bench(
        "throughput", "--quick", "--protocols", "sdpaxos,multipaxos", "--reads", "20",
        "--straggler", "0.5", "--clients", "4", "--outstanding", "8",
    )  # fmt: skip
    assert report["bench"] == "throughput"
    assert report["cpu_limit"]["mechanism"] in ("cgroup-v2", "cgroup-v1", "none")
    results = report["results"]
    # the configuration without a straggler first, then the straggler at replica 0
    assert [(r["protocol"], r["straggler"] and r["straggler"]["site"]) for r in results] == [
        ("sdpaxos", None), ("multipaxos", None), ("sdpaxos", "CA"), ("multipaxos", "CA")]
    for result in results:
        assert result["replicas"] == 3 and result["size"] == 16 and result["reads_pct"] == 20
        assert result["throughput_per_s"] > 0
        assert set(result["write_latency_ms"]) == LATENCY_FIELDS
        assert result["write_latency_ms"]["count"] > 0
        assert result["read_latency_ms"]["count"] > 0
        (trial,) = result["rounds"]
        assert trial["write_throughput_per_s"] > 0 and trial["read_throughput_per_s"] > 0
        assert {"replica-0", "replica-1", "replica-2", "loadgen-0"} <= set(trial["cpu"])
    for without, slowed in zip(results[:2], results[2:], strict=True):
        assert without["loss_pct"] is None
        expected = 100 * (1 - slowed["throughput_per_s"] / without["throughput_per_s"])
        assert slowed["loss_pct"] == pytest.approx(expected, abs=0.06)
    assert "sdpaxos" in report["_stdout"] and "multipaxos" in report["_stdout"]


@pytest.mark.timeout(120)
def test_runs_unlimited_with_a_clear_message_when_cgroups_are_unavailable(
    run_bench: BenchRunner,
) -> None:
    report = run_bench(
        "throughput", "--quick", "--protocols", "mencius", "--clients", "2",
        "--outstanding", "4", env={"SDPAXOS_BENCH_CGROUP": "off"},
    )  # fmt: skip
    assert report["cpu_limit"]["mechanism"] == "none"
    assert report["cpu_limit"]["per_replica_cpus"] is None
    assert "CPU limits unavailable" in report["_stdout"]
    assert report["results"][0]["throughput_per_s"] > 0


def interrupt_bench(
    workdir: Path, command: list[str], started: Callable[[list[str]], bool], sig: signal.Signals
) -> str:
    """Run a bench, send ``sig`` once ``started(its processes' command lines)`` holds, check it
    exits 130 and left nothing running; its standard error."""
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 40
        while not started([cmd for _, cmd in processes_mentioning(str(workdir))]):
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "the bench never started"
            time.sleep(0.1)
        process.send_signal(sig)
        assert process.wait(30) == 130
        assert process.stderr is not None
        errors = process.stderr.read().decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert_nothing_left(workdir, process.pid)
    return errors


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_bench_stops_every_process_it_started(
    tmp_path: Path, sig: signal.Signals
) -> None:
    workdir = tmp_path / "work"

    def load_running(commands: list[str]) -> bool:
        # the load generators start last: replicas and clients are all running then
        if not any("bench.loadgen" in cmd for cmd in commands):
            return False
        assert len(commands) >= 4  # 3 replicas + load generators
        return True

    command = bench_command("throughput", workdir, "--protocols", "sdpaxos", "--duration", "60")
    interrupt_bench(workdir, command, load_running, sig)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_runtime_bench_stops_its_replicas(
    tmp_path: Path, sig: signal.Signals
) -> None:
    # `bench runtime` drives its load from its own event loop, not from load generators
    workdir = tmp_path / "work"
    command = bench_command("runtime", workdir, "--mode", "peak", "--duration", "60")
    errors = interrupt_bench(workdir, command, lambda commands: len(commands) >= 3, sig)
    assert "Traceback" not in errors
