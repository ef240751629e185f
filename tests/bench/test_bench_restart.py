"""``sdpaxos bench restart`` at a tiny scale: the report's structure, that every restarted
cluster served again, and that nothing is left running (timings are not asserted)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench_procs import ROOT, assert_nothing_left, bench_command

#: small, so the run takes seconds: one size, one signal
COMMANDS = 2000
TIMEOUT_S = 60


def test_restart_bench_reports_every_replica_serving_again(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    out = tmp_path / "report.json"
    process = subprocess.Popen(
        bench_command("restart", workdir, "--commands", str(COMMANDS), "--signals", "kill",
                      "--timeout", str(TIMEOUT_S), "--clients", "2", "--outstanding", "50",
                      "--json", str(out)),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr.decode()[-4000:]
    assert_nothing_left(workdir, process.pid)
    assert "Full restart" in stdout.decode() and "under load" in stdout.decode()
    report = json.loads(out.read_text())
    assert report["bench"] == "restart" and report["fsync"] is True

    [full] = report["full_restart"]
    assert full["commands"] == COMMANDS and full["signal"] == "kill"
    assert full["acknowledged"] >= COMMANDS
    # the load stayed in the log: no snapshot was taken, and every replica executed it
    assert full["snapshot_files"] == [0, 0, 0]
    assert len(full["snapshot_files_after_stop"]) == 3
    assert len(set(full["executed_slots"])) == 1 and full["executed_slots"][0] > 0
    assert [r["replica"] for r in full["replicas"]] == [0, 1, 2]
    for replica in full["replicas"]:
        assert replica["exited_with"] is None, f"replica {replica} exited"
        assert replica["serving_s"] is not None, f"replica {replica} did not serve again"
        assert replica["listening_s"] <= replica["serving_s"]
    assert full["cluster_serving_s"] is not None

    [under] = report["under_load"]
    assert under["commands"] == COMMANDS
    # a follower was restarted, never the sequencer; the load ran at the two others
    assert under["restarted"] != under["sequencer"]
    assert sorted([under["restarted"], *under["others"]]) == [0, 1, 2]
    assert under["restart_exited_with"] is None
    assert under["restart_serving_s"] is not None
    buckets = under["completed_per_bucket"]
    assert sum(buckets) > 0 and under["baseline_per_s"] > 0
    assert under["longest_gap_ms"] >= 0 and under["max_latency_after_kill_ms"] > 0
