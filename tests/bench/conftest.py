"""The ``run_bench`` fixture: a whole ``sdpaxos bench`` run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from bench_procs import ROOT, BenchRunner, assert_nothing_left, bench_command


@pytest.fixture
def run_bench(tmp_path: Path) -> BenchRunner:
    """``run_bench("throughput", "--quick", ...)`` -> the JSON report, after checking the
    bench exited 0, printed its table, wrote its plot and left no process or cgroup behind."""

    def run(name: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        workdir = tmp_path / "work"
        out = tmp_path / "report.json"
        plot = tmp_path / "figure.png"
        process = subprocess.Popen(
            bench_command(name, workdir, "--json", str(out), "--plot", str(plot), *args),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr.decode()[-4000:]
        assert_nothing_left(workdir, process.pid)
        assert plot.exists() and plot.stat().st_size > 1000
        assert stdout.strip(), "no results table"
        report: dict[str, Any] = json.loads(out.read_text())
        report["_stdout"] = stdout.decode()
        return report

    return run
