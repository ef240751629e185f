"""``sdpaxos bench soak`` (issue 38 point 8): a whole two-minute run on real processes, whose
every correctness check must pass (its timing targets are reported, not judged: the machine
is shared), and each check's teeth: evidence that must fail it, built from the real store,
ledger and checker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
from bench_procs import ROOT, assert_nothing_left

from bench.nemesis import Record
from bench.soak import gpu_config_text
from bench.soak_checks import Evidence, judge, owners_of
from bench.soak_load import KEYS, AckedAllocations
from bench.soak_samples import (
    Windows,
    directory_bytes,
    growth,
    interval_stall,
    interval_stalls,
    latency_ratio,
    process_fds,
    process_rss,
    scrape,
    stalls,
)
from cluster_state import ops
from cluster_state.config import parse_config
from cluster_state.events import ChangeEvent
from cluster_state.ledger import GpuLedger
from cluster_state.ops import Member
from cluster_state.store import ClusterStore
from consensus.messages import Command

#: every operator action the run takes in turn
KINDS = {"kill", "backup", "config", "replace"}


@pytest.mark.timeout(900)
def test_a_two_minute_soak_passes_every_check(tmp_path: Path) -> None:
    workdir, out, plot = tmp_path / "work", tmp_path / "soak.json", tmp_path / "soak.png"
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "bench", "soak", "--duration", "120",
         "--every", "20", "--workdir", str(workdir), "--json", str(out), "--plot", str(plot)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    stdout, stderr = process.communicate(timeout=880)
    report: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    failed = [c for c in report.get("checks", []) if not c["ok"]]
    assert process.returncode == 0 and not failed, (
        f"exit {process.returncode}; failed checks {failed}\n{stderr.decode()[-4000:]}")
    assert_nothing_left(workdir, process.pid)
    assert {c["name"] for c in report["checks"]} >= {
        "kv history linearizable (lincheck)", "store digests equal", "no GPU given twice",
        "every acknowledged allocation present"}
    # every kind of operator action ran (and, the checks say, completed)
    assert {a["kind"] for a in report["actions"]} == KINDS, report["actions"]
    replaced = [a for a in report["actions"] if a["kind"] == "replace"]
    assert all(a["new"] != a["old"] for a in replaced)
    # sampled over time: every member's memory, files and stall, a sample every 5 s
    assert len(report["samples"]) >= 120 // 5
    last = report["samples"][-1]["replicas"]
    assert {s["cluster"] for s in last} == {"gpu", "kv"} and len(last) == 6
    assert all(s["rss_bytes"] and s["open_files"] for s in last)
    scraped = {(s["cluster"], s["replica"]) for sample in report["samples"]
               for s in sample["replicas"] if s["loop_stall_s"] is not None}
    assert {(s["cluster"], s["replica"]) for s in last} <= scraped
    assert all(s["loop_stall_buckets"]["+Inf"] > 0 for s in last)  # the stall histogram too
    assert any(s["wal_bytes"] > 0 for s in last)
    # the load really ran: gangs placed and released, one-shot writes, kv operations
    assert report["schedulers"]["placed"] > 20 and report["schedulers"]["released"] > 0
    assert report["one_shot"]["put"] > 10 and report["one_shot"]["ok"] > 0
    assert report["kv"]["history_checked"]["final_reads"] == len(KEYS)
    # the targets are reported (values only: not judged on a shared machine)
    names = {t["name"] for t in report["targets"]}
    assert "scheduler p99, last window / first" in names
    assert "gpu: resident memory (bytes) growth" in names and "kv: open files growth" in names
    assert "gpu: longest loop stall between two samples after start-up (at most)" in names
    assert all(s["sessions"] is not None for s in report["sessions_at_end"].values())
    # the history re-checks with sdpaxos lincheck; the table and the figure were made
    history = workdir / "history.jsonl"
    lincheck = subprocess.run([sys.executable, "-m", "bench.cli", "lincheck", str(history)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300,
                              check=False)
    assert lincheck.returncode == 0, lincheck.stdout + lincheck.stderr
    assert "every acknowledged allocation present" in stdout.decode()
    assert plot.stat().st_size > 10_000


# ----------------------------------------------------------------------- the windows


def test_growth_compares_the_end_of_the_warm_up_with_the_end() -> None:
    windows = Windows(600.0)  # window 100 s: warm 50-100 s, end 550-600 s
    flat = [(t, 100.0) for t in range(0, 601, 10)]
    assert growth(flat, windows) == 0.0
    # the warm-up itself does not count: growing in the first 50 s and flat after
    warming = [(t, 50.0 + t if t < 50 else 100.0) for t in range(0, 601, 10)]
    assert growth(warming, windows) == 0.0
    # +20 % by the end
    creeping = [(t, 100.0 if t <= 100 else 120.0) for t in range(0, 601, 10)]
    assert growth(creeping, windows) == pytest.approx(0.2)
    # one odd sample at the end (a replica restarting) does not decide it: medians
    spike = [(t, 300.0 if t == 590 else 100.0) for t in range(0, 601, 10)]
    assert growth(spike, windows) == 0.0
    assert growth([(0, 1.0)], windows) is None  # nothing at the end


def test_latency_ratio_is_the_last_windows_p99_over_the_firsts() -> None:
    windows = Windows(60.0)  # window 10 s
    pairs = [(t * 0.1, 0.010) for t in range(0, 100)] + [(t * 0.1, 0.030)
                                                          for t in range(500, 600)]
    assert latency_ratio(pairs, windows) == pytest.approx(3.0)
    assert latency_ratio([(1.0, 0.01)], windows) is None


def test_stalls_after_start_up_leave_the_start_up_out() -> None:
    def sample(t: float, pid: int, stall: float) -> dict[str, Any]:
        return {"t": t, "replicas": [{"cluster": "gpu", "pid": pid, "loop_stall_s": stall}]}

    quiet = [sample(0, 1, 0.4), sample(5, 1, 0.4), sample(10, 2, 0.3)]
    assert stalls(quiet, "gpu") == (0.4, 0.0)
    stalled = [*quiet, sample(15, 2, 0.6)]  # pid 2 stalled 0.6 s after its first sample
    assert stalls(stalled, "gpu") == (0.6, 0.6)
    assert stalls(stalled, "kv") == (None, None)


def test_interval_stalls_see_a_later_stall_shorter_than_the_start_up() -> None:
    """From the histogram's buckets: a 0.08 s stall after a 1.5 s start-up, which the running
    maximum (``stalls``) cannot see."""
    def buckets(under_005: float, under_01: float, under_25: float) -> dict[str, float]:
        return {"0.05": under_005, "0.1": under_01, "2.5": under_25, "+Inf": under_25}

    def sample(t: float, pid: int, counts: dict[str, float]) -> dict[str, Any]:
        return {"t": t, "replicas": [{"cluster": "gpu", "pid": pid, "loop_stall_s": 1.5,
                                      "loop_stall_buckets": counts}]}

    assert interval_stall(buckets(10, 10, 11), buckets(60, 60, 61)) == 0.05
    assert interval_stall(buckets(10, 10, 11), buckets(60, 61, 62)) == 0.1
    assert interval_stall(buckets(10, 10, 11), buckets(10, 10, 11)) is None
    assert interval_stall({"0.05": 1, "+Inf": 1}, {"0.05": 1, "+Inf": 2}) == float("inf")
    started = [sample(0, 1, buckets(10, 10, 11)),  # the 1.5 s start-up: before this sample
               sample(5, 1, buckets(60, 60, 61))]
    assert interval_stalls(started, "gpu") == 0.05
    later = [*started, sample(10, 1, buckets(100, 101, 102)),
             sample(15, 2, buckets(5, 5, 6))]  # a restart: its start-up is left out again
    assert interval_stalls(later, "gpu") == 0.1
    assert stalls(later, "gpu")[1] == 0.0  # (the running maximum never moved: 1.5 s)
    assert interval_stalls(later, "kv") is None


def test_the_samplers_read_a_real_process_and_directory(tmp_path: Path) -> None:
    assert (process_rss(os.getpid()) or 0) > 1 << 20
    assert (process_fds(os.getpid()) or 0) >= 3
    assert process_rss(1 << 30) is None and process_fds(1 << 30) is None
    (tmp_path / "wal").mkdir()
    (tmp_path / "wal" / "wal-0001.log").write_bytes(b"x" * 100)
    (tmp_path / "wal-0002.log").write_bytes(b"x" * 20)
    (tmp_path / "other.log").write_bytes(b"x" * 7)
    assert directory_bytes(tmp_path, "wal-*.log") == 120
    assert directory_bytes(tmp_path / "missing", "wal-*.log") == 0
    assert scrape(("127.0.0.1", 1)) == {}  # nothing listens: no metrics, no error


# ----------------------------------------------------------------------- the checks' teeth


def _store_with_gangs(count: int) -> tuple[ClusterStore, AckedAllocations, GpuLedger]:
    """A real store with ``count`` placed gangs, acknowledged, and a ledger of its events."""
    store = ClusterStore(parse_config(gpu_config_text(16, 2, spare=0)))
    acked = AckedAllocations()
    for n in range(count):
        op = ops.submit(f"g{n}", f"vc{n % 2:02d}", 100, (Member(1, 4),))
        result = ops.decode_result(store.apply(n, Command(client_id=7, seq=n, op=op, keys=())))
        assert isinstance(result, ops.Placed)
        acked.placed(f"g{n}", result.token)
    ledger = GpuLedger()
    for event in store.events_since(-1):
        ledger.apply(event)
    return store, acked, ledger


def _listing(store: ClusterStore) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = msgpack.unpackb(store.query(ops.list_groups("")))[2]
    return groups


def _kv_history() -> tuple[list[Record], dict[int, Any]]:
    """Two writes and a read that saw the second; every member holds it at the end."""
    records = [Record(1, "write", "k0", "a", 10, "ok", None, 20),
               Record(2, "write", "k0", "b", 30, "ok", None, 40),
               Record(3, "read", "k0", None, 50, "ok", "b", 60)]
    data = {key: ("b" if key == "k0" else None) for key in KEYS}
    return records, {r: {"executed": 9, "data": dict(data)} for r in range(3)}


def _evidence(**changes: Any) -> Evidence:
    store, acked, ledger = _store_with_gangs(4)
    records, states = _kv_history()
    evidence = Evidence(
        records=records, kv_states=states, final_call_us=100, final_ret_us=110,
        gpu_digests={0: "9:abc", 1: "9:abc", 2: "9:abc"}, gpu_members=3,
        listing=_listing(store), acked=acked, ledgers=[ledger], watched_to_end=True,
        config_plan={"changed": False}, edits=1,
        actions=[{"kind": "kill", "ok": True}], crashes=[], placed=4)
    for name, value in changes.items():
        setattr(evidence, name, value)
    return evidence


def _failed(evidence: Evidence) -> list[str]:
    return [c["name"] for c in judge(evidence, check_timeout_s=10).checks if not c["ok"]]


def test_every_check_passes_on_what_a_correct_run_leaves() -> None:
    assert _failed(_evidence()) == []


def test_a_lost_acknowledged_allocation_fails_the_check() -> None:
    evidence = _evidence()
    lost = [g for g in evidence.listing if g["name"] != "g2"]
    failed = _failed(_evidence(listing=lost))
    assert "every acknowledged allocation present" in failed
    # ... and a token that changed, and a group released though its release was not
    # acknowledged, too; a release acknowledged or uncertain excuses it
    moved = [dict(g, token=g["token"] + 1) if g["name"] == "g1" else g
             for g in evidence.listing]
    assert "every acknowledged allocation present" in _failed(_evidence(listing=moved))
    excused = _evidence(listing=lost)
    excused.acked.released.add("g2")
    assert "every acknowledged allocation present" not in _failed(excused)


def test_a_gpu_given_twice_fails_the_check() -> None:
    evidence = _evidence()
    holder = evidence.listing[0]
    twice = [*evidence.listing, {**holder, "name": "intruder"}]
    assert "no GPU given twice" in _failed(_evidence(listing=twice))
    ledger = GpuLedger()  # the watchers' witness: a placement on a held GPU
    for event in _events_twice(holder):
        ledger.apply(event)
    assert ledger.violations and "no GPU given twice" in _failed(_evidence(ledgers=[ledger]))


def _events_twice(group: dict[str, Any]) -> list[ChangeEvent]:
    data = (group.get("chain", ""), group["pods"], group["token"])
    return [ChangeEvent(1, "placed", group["name"], data), ChangeEvent(2, "placed", "x", data)]


def test_a_watcher_that_missed_events_fails_the_check() -> None:
    assert "watchers took every event" in _failed(_evidence(ledgers=[GpuLedger()]))
    assert "watchers took every event" in _failed(_evidence(watched_to_end=False))
    evidence = _evidence()
    assert owners_of(evidence.listing) == evidence.ledgers[0].owner


def test_a_stale_read_fails_lincheck_and_diverged_replicas_fail_their_checks() -> None:
    records, states = _kv_history()
    stale = [*records, Record(4, "read", "k0", None, 70, "ok", "a", 80)]  # after b was read
    assert _failed(_evidence(records=stale)) == ["kv history linearizable (lincheck)"]
    diverged = {**states, 2: {"executed": 9, "data": {**states[2]["data"], "k0": "a"}}}
    assert "kv replicas agree" in _failed(_evidence(kv_states=diverged))
    assert _failed(_evidence(gpu_digests={0: "9:abc", 1: "9:abd", 2: "9:abc"})) == [
        "store digests equal"]
    assert _failed(_evidence(gpu_digests={0: "9:abc", 1: "9:abc"})) == ["store digests equal"]


def test_operational_failures_fail_their_checks() -> None:
    assert _failed(_evidence(config_plan={"changed": True})) == [
        "the store runs the last configuration applied"]
    assert _failed(_evidence(actions=[{"kind": "replace", "ok": False, "error": "x"}])) == [
        "operator actions completed"]
    assert _failed(_evidence(crashes=["gpu replica 1 exited by itself (status 1)"])) == [
        "no replica exited by itself"]
    assert _failed(_evidence(placed=0)) == ["the load made progress"]


def test_the_configuration_edits_keep_every_group() -> None:
    """The soak's edits (the spare rack given to one VC, split between two, and back) drop,
    move or trim no group of a busy store: its dry run says so, as the soak asks the cluster's
    before each."""
    store, _, _ = _store_with_gangs(6)
    for n, spare in enumerate((1, 2, 1)):
        text = gpu_config_text(16, 2, spare=spare)
        plan = store.plan_reconfiguration(text)
        assert plan["changed"] is True
        assert {entry["outcome"] for entry in plan["groups"].values()} == {"kept"}
        result = store.apply(100 + n, Command(client_id=8, seq=n, op=ops.reconfigure(text),
                                              keys=()))
        assert ops.decode_result(result).changed  # type: ignore[union-attr]
    assert len(_listing(store)) == 6
