"""Helpers for the process-benchmark tests: run ``sdpaxos bench ...`` as a subprocess with its
work directory under ``tmp_path``, and prove it left nothing running."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.cgroups import CpuLimiter

ROOT = Path(__file__).resolve().parents[2]

BenchRunner = Callable[..., dict[str, Any]]


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    """Live processes whose command line contains ``text`` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append((int(entry.name), cmdline))
    return found


def leftover_cgroups(bench_pid: int) -> list[Path]:
    limiter = CpuLimiter.detect()
    if limiter.base is None:
        return []
    return sorted(limiter.base.glob(f"sdpaxos-bench-{bench_pid}-*"))


def assert_nothing_left(workdir: Path, bench_pid: int) -> None:
    deadline = time.monotonic() + 5
    while processes_mentioning(str(workdir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_mentioning(str(workdir))
    assert left == [], f"still running after the bench ended: {left}"
    assert leftover_cgroups(bench_pid) == []


def bench_command(name: str, workdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "bench.cli", "bench", name, "--workdir", str(workdir), *args]
