"""Safe local processes: one replica process per data directory, ``cluster init`` never
rewrites a cluster's file unasked and leaves nothing when it fails, ``cluster up | down |
restart`` act on what runs for the directory (its data directories' locks, not a pid file):
one replica restarted after ``kill -9``, one started by hand stopped, a removed member never
started, and ``cluster down`` signals only processes that are its replicas (issue 34)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.cli import main
from consensus.errors import ConfigError, DataDirInUse
from consensus.protocol.membership import EPOCH_SHIFT
from consensus.runtime.cluster_config import load_cluster_config
from consensus.runtime.dirlock import DataDirLock, lock_holder
from consensus.runtime.local_cluster import free_base_port
from consensus.runtime.replica_processes import running


def test_a_data_directory_is_held_by_one_process_at_a_time(tmp_path: Path) -> None:
    with DataDirLock(tmp_path / "replica-0"):
        with pytest.raises(DataDirInUse) as info:
            DataDirLock(tmp_path / "replica-0")
        assert info.value.holder == os.getpid()
        assert f"in use by process {os.getpid()}" in str(info.value)
    with DataDirLock(tmp_path / "replica-0"):  # released: free again
        pass


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; "
            "from consensus.runtime.dirlock import DataDirLock; "
            f"DataDirLock(Path({str(tmp_path)!r})); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(DataDirInUse) as info:
            DataDirLock(tmp_path)
        assert info.value.holder == holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    DataDirLock(tmp_path).release()


def test_init_refuses_an_existing_cluster_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path / "c")
    assert main(["cluster", "init", "--dir", directory, "--no-wan"]) == 0
    before = (tmp_path / "c" / "cluster.toml").read_text()
    assert main(["cluster", "init", "--dir", directory, "--replicas", "5"]) == 1
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "c" / "cluster.toml").read_text() == before
    assert main(["cluster", "init", "--dir", directory, "--replicas", "5", "--force"]) == 0
    assert (tmp_path / "c" / "cluster.toml").read_text().count("[[replica]]") == 5


def test_lock_holder_names_the_live_holder_only(tmp_path: Path) -> None:
    directory = tmp_path / "replica-0"
    assert lock_holder(directory) is None  # no lock file yet
    with DataDirLock(directory):
        assert lock_holder(directory) == os.getpid()
    assert lock_holder(directory) is None  # the file stays, the lock is gone


def test_down_leaves_alone_a_process_that_is_not_its_replica(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a pid file naming a pid that now belongs to someone else (a replica that died and its
    # pid was reused): "stopped 3 replicas" used to signal whatever held those pids
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert main(["cluster", "init", "--dir", str(tmp_path), "--no-wan"]) == 0
        (tmp_path / "pids.json").write_text(json.dumps({"0": stranger.pid}))
        assert main(["cluster", "down", "--dir", str(tmp_path)]) == 0
        assert "no replica running" in capsys.readouterr().out
        assert stranger.poll() is None  # still running
    finally:
        stranger.kill()
        stranger.wait()


def _init_and_up(directory: Path) -> str:
    assert main(["cluster", "init", "--dir", str(directory), "--no-wan",
                 "--base-port", str(free_base_port())]) == 0
    assert main(["cluster", "up", "--dir", str(directory)]) == 0
    return str(directory)


def _pids(directory: Path) -> dict[int, int]:
    """Replica id -> pid of what serves the cluster's data directories now."""
    return running(load_cluster_config(directory / "cluster.toml"))


def _serve_by_hand(directory: Path, replica: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.cli", "serve", "--config", str(directory / "cluster.toml"),
         "--id", str(replica)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_up_twice_is_a_no_op_and_a_second_serve_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path)
    base = free_base_port()
    assert main(["cluster", "init", "--dir", directory, "--no-wan",
                 "--base-port", str(base)]) == 0
    assert main(["cluster", "up", "--dir", directory]) == 0
    try:
        pids = json.loads((tmp_path / "pids.json").read_text())
        assert {int(r): p for r, p in pids.items()} == _pids(tmp_path)
        capsys.readouterr()
        assert main(["cluster", "up", "--dir", directory]) == 0
        assert "nothing to start" in capsys.readouterr().out
        assert json.loads((tmp_path / "pids.json").read_text()) == pids  # the same processes
        second = subprocess.run(
            [sys.executable, "-m", "bench.cli", "serve", "--config",
             str(tmp_path / "cluster.toml"), "--id", "1"],
            capture_output=True, text=True, timeout=60,
        )
        assert second.returncode == 1
        assert f"in use by process {pids['1']}" in second.stderr
    finally:
        assert main(["cluster", "down", "--dir", directory]) == 0
    assert "stopped 3 replicas" in capsys.readouterr().out
    assert all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in pids.values())
    assert _pids(tmp_path) == {} and not (tmp_path / "pids.json").exists()


def test_one_replica_killed_is_restarted_alone_by_up_and_by_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _init_and_up(tmp_path)
    try:
        first = _pids(tmp_path)
        os.kill(first[1], signal.SIGKILL)
        _wait_until(lambda: 1 not in _pids(tmp_path))
        capsys.readouterr()
        assert main(["cluster", "up", "--dir", directory]) == 0  # was: "already up", exit 1
        out = capsys.readouterr().out
        assert "1 replica started and serving (replica 1," in out
        second = _pids(tmp_path)
        assert second[0] == first[0] and second[2] == first[2] and second[1] != first[1]
        assert main(["cluster", "restart", "--dir", directory, "--id", "1"]) == 0
        third = _pids(tmp_path)
        assert third[0] == first[0] and third[2] == first[2] and third[1] != second[1]
        assert f"stopped (pid {second[1]})" in capsys.readouterr().out
    finally:
        assert main(["cluster", "down", "--dir", directory]) == 0
    assert _pids(tmp_path) == {}


def test_down_stops_a_replica_started_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path)
    assert main(["cluster", "init", "--dir", directory, "--no-wan",
                 "--base-port", str(free_base_port())]) == 0
    by_hand = _serve_by_hand(tmp_path, 1)  # no pids.json names it
    try:
        _wait_until(lambda: _pids(tmp_path) == {1: by_hand.pid})
        assert main(["cluster", "down", "--dir", directory]) == 0
        assert f"stopped 1 replica (replica 1, pids {by_hand.pid})" in capsys.readouterr().out
        assert by_hand.wait(timeout=10) == 0  # a clean stop (SIGTERM), not a kill
        assert _pids(tmp_path) == {}
    finally:
        by_hand.kill()
        by_hand.wait()


def test_up_never_starts_a_removed_member(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _init_and_up(tmp_path)
    try:
        config = str(tmp_path / "cluster.toml")
        assert main(["member", "remove", "--config", config, "0"]) == 0
        capsys.readouterr()
        _wait_until(lambda: main(["endpoint", "status", "--config", config, "--json"]) == 0
                    and all(row["view"] >> EPOCH_SHIFT == 1
                            for row in json.loads(capsys.readouterr().out)))
        # issue 34: "refused: refused: 9 is not a member"; views printed as 1099511627776
        assert main(["member", "remove", "--config", config, "9"]) == 1
        assert capsys.readouterr().err == "sdpaxos member remove: refused: 9 is not a member\n"
        assert main(["endpoint", "status", "--config", config]) == 0
        table = capsys.readouterr().out
        assert re.search(r"\s1\.\d+\s", table) and str(1 << EPOCH_SHIFT) not in table, table
        _wait_until(lambda: 0 not in _pids(tmp_path))  # a removed replica exits by itself
        before = _pids(tmp_path)
        os.kill(before[1], signal.SIGKILL)
        _wait_until(lambda: 1 not in _pids(tmp_path))
        capsys.readouterr()
        # partly running: only the missing member starts, never the removed one
        assert main(["cluster", "up", "--dir", directory]) == 0
        out = capsys.readouterr().out
        assert "1 replica started and serving (replica 1," in out and "replica 2 already" in out
        assert set(_pids(tmp_path)) == {1, 2}
        assert main(["cluster", "up", "--dir", directory, "--id", "0"]) == 1
        assert "replica 0 is not a member" in capsys.readouterr().err
        assert main(["cluster", "down", "--dir", directory]) == 0
        # nothing running: the file's replicas start; the removed one (it exits 4, REMOVED,
        # and is then counted as not started) is no failure
        assert main(["cluster", "up", "--dir", directory]) == 0
        out = capsys.readouterr().out
        assert "replica 0 is no longer a member" in out and "(replicas 1, 2," in out
        assert set(_pids(tmp_path)) == {1, 2}
    finally:
        assert main(["cluster", "down", "--dir", directory]) == 0
    assert _pids(tmp_path) == {}


def test_a_failed_init_leaves_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "deep" / "c"
    assert main(["cluster", "init", "--dir", str(target), "--base-port", "70000"]) == 2
    err = capsys.readouterr().err
    assert "ports are 1..65535" in err and "70000..70302" in err
    assert list(tmp_path.iterdir()) == []
    assert main(["cluster", "init", "--dir", str(target), "--gpu-config",
                 str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    # a failure while writing (after everything was checked): nothing stays either

    def broken(path: Path, **_: object) -> str:
        raise ConfigError("the CA could not be made")

    monkeypatch.setattr("consensus.runtime.cli.make_certificates", broken)
    assert main(["cluster", "init", "--dir", str(target), "--tls", "--gpu-store"]) == 2
    assert "nothing was written" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    # the retry is not refused for anything a failed attempt wrote
    assert main(["cluster", "init", "--dir", str(target), "--tls", "--gpu-store"]) == 0
    assert {p.name for p in target.iterdir()} == {"cluster.toml", "gpu.yaml", "tls", "data"}


def test_init_into_a_directory_never_overwrites_what_is_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "gpu.yaml").write_text("mine\n")
    assert main(["cluster", "init", "--dir", str(tmp_path), "--gpu-store"]) == 2
    assert "already holds gpu.yaml" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.yaml"]
    assert (tmp_path / "gpu.yaml").read_text() == "mine\n"
    assert main(["cluster", "init", "--dir", str(tmp_path)]) == 0  # nothing in the way


def _wait_until(condition: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
