"""Safe local processes: one replica process per data directory, ``cluster init`` never
rewrites a cluster's file unasked, ``cluster up`` fails when its own replicas do, and
``cluster down`` signals only processes that are its replicas."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import main
from consensus.errors import DataDirInUse
from consensus.runtime.dirlock import DataDirLock
from consensus.runtime.local_cluster import free_base_port


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
        out = capsys.readouterr().out
        assert f"pid {stranger.pid} is not a running replica" in out
        assert "stopped 0 replicas" in out
        assert stranger.poll() is None  # still running
    finally:
        stranger.kill()
        stranger.wait()


def test_up_twice_and_a_second_serve_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path)
    base = free_base_port()
    assert main(["cluster", "init", "--dir", directory, "--no-wan",
                 "--base-port", str(base)]) == 0
    assert main(["cluster", "up", "--dir", directory]) == 0
    try:
        pids = json.loads((tmp_path / "pids.json").read_text())
        capsys.readouterr()
        assert main(["cluster", "up", "--dir", directory]) == 1
        assert "already up" in capsys.readouterr().err
        assert json.loads((tmp_path / "pids.json").read_text()) == pids  # not overwritten
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


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
