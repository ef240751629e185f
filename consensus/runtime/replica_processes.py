"""The replica processes of a local cluster directory: ``sdpaxos cluster up | down | restart``.

What runs is read from the data directories, never from a pid file: a replica process holds
the lock on its data directory (``consensus.runtime.dirlock``) for as long as it lives,
however it was started (``cluster up``, ``serve`` by hand, a test), and the kernel drops the
lock when it dies, even by ``kill -9``. Hence:

* ``running(config)``: replica id -> pid for every locked ``replica-N`` directory under the
  cluster's data directory (the cluster file's replicas, and any other there: a member whose
  entry was deleted from the file that still runs);
* which replicas *should* run is the log's member list (``members_of``: the newest epoch among
  the running replicas' status answers), so ``up`` never starts a removed member while any
  replica runs; with none running, it starts the cluster file's replicas, asks them, and stops
  again those the log no longer counts (a member removed before the cluster was stopped);
* ``up`` starts only what is missing and waits until it serves; when one it started fails it
  stops what it started, never a replica that was running before;
* ``down`` stops every running replica (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``) and returns
  once its directory's lock is free; ``restart`` stops and starts one replica, or each in turn
  (rolling: the next only once the previous serves again, so a majority keeps serving).

``pids.json`` in the cluster directory lists what runs after each command (for scripts that
signal the replicas, e.g. SIGHUP after a certificate revocation); nothing here reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from consensus.errors import SDPaxosError
from consensus.runtime.cluster_config import ClusterConfig
from consensus.runtime.dirlock import UNKNOWN_HOLDER, lock_holder
from consensus.runtime.exit_codes import OK, REFUSED, REMOVED, USAGE
from consensus.runtime.new_cluster import CONFIG_NAME

__all__ = [
    "PIDS_NAME",
    "STOP_TIMEOUT_S",
    "Started",
    "Statuses",
    "down",
    "members_of",
    "replica_dirs",
    "restart",
    "running",
    "start",
    "statuses",
    "stop",
    "up",
    "wait_serving",
    "write_pids",
]

#: what ran after the last command, for scripts (``write_pids``)
PIDS_NAME: Final = "pids.json"
#: seconds a replica has to stop after SIGTERM (it snapshots first) before SIGKILL
STOP_TIMEOUT_S: Final = 10.0
#: how often a wait polls a lock or a replica
_POLL_S: Final = 0.05
#: a replica's data directory under the cluster's ``data_dir`` (``ClusterConfig.replica_dir``)
_REPLICA_DIR: Final = re.compile(r"replica-(\d+)")
#: the client id of the tools' status and readiness requests (they open no session)
_TOOL_CLIENT_ID: Final = 1 << 40

#: replica id -> its status answer (``consensus.runtime.status``)
Statuses = dict[int, dict[str, Any]]


def replica_dirs(config: ClusterConfig) -> dict[int, Path]:
    """Replica id -> data directory: the cluster file's replicas and every other
    ``replica-N`` directory under its ``data_dir``."""
    found = {spec.id: config.replica_dir(spec.id) for spec in config.replicas}
    with contextlib.suppress(OSError):
        for entry in config.data_dir.iterdir():
            match = _REPLICA_DIR.fullmatch(entry.name)
            if match is not None and entry.is_dir():
                found.setdefault(int(match.group(1)), entry)
    return dict(sorted(found.items()))


def running(config: ClusterConfig) -> dict[int, int]:
    """Replica id -> pid of every replica process serving one of the cluster's data
    directories (``UNKNOWN_HOLDER`` for one that has not written its pid yet)."""
    found = {}
    for replica, directory in replica_dirs(config).items():
        holder = lock_holder(directory)
        if holder is not None:
            found[replica] = holder
    return found


@dataclass(frozen=True, slots=True)
class Started:
    """A replica process this command started."""

    replica: int
    process: subprocess.Popen[bytes]


def start(config_path: Path, replica: int, log_dir: Path, extra: Sequence[str]) -> Started:
    """``sdpaxos serve`` of ``replica`` in the background, in a session of its own (a Ctrl-C
    of the tool does not reach it), appending to ``log_dir/replica-<id>.log``."""
    with open(log_dir / f"replica-{replica}.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.cli", "serve", "--config", str(config_path.resolve()),
             "--id", str(replica), *extra],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    return Started(replica, process)


def stop(config: ClusterConfig, replicas: Mapping[int, int],
         timeout_s: float = STOP_TIMEOUT_S) -> list[int]:
    """Stop the replica processes ``replicas`` (id -> pid, as ``running`` gives them): SIGTERM,
    then SIGKILL for one still holding its directory after ``timeout_s``; returns once each
    released its directory and exited. Returns the ids killed with SIGKILL. A pid that is
    gone, or no longer holds the directory, is left alone."""
    directories = replica_dirs(config)
    for pid in replicas.values():
        if pid != UNKNOWN_HOLDER:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    killed = []
    for replica, pid in replicas.items():
        directory = directories[replica]

        def stopped(pid: int = pid, directory: Path = directory) -> bool:
            # the lock goes as the process leaves serve, just before it exits
            return lock_holder(directory) is None and (pid == UNKNOWN_HOLDER or _gone(pid))

        while time.monotonic() < deadline and not stopped():
            time.sleep(_POLL_S)
        if lock_holder(directory) == pid != UNKNOWN_HOLDER:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.append(replica)
        killed_by = time.monotonic() + timeout_s  # (a SIGKILL'd process goes at once)
        while not stopped() and time.monotonic() < killed_by:
            time.sleep(_POLL_S)
    return killed


def _gone(pid: int) -> bool:
    """``pid`` has exited (collected if it was our child: one this process started)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # exited, waiting for a parent other than us to collect it
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (OSError, IndexError):
        return True


def write_pids(directory: Path, config: ClusterConfig) -> dict[int, int]:
    """Write ``pids.json`` (what runs now; removed when nothing does) and return it."""
    now = running(config)
    path = directory / PIDS_NAME
    if now:
        path.write_text(json.dumps({str(replica): pid for replica, pid in now.items()}))
    else:
        path.unlink(missing_ok=True)
    return now


async def statuses(
    addresses: Mapping[int, tuple[str, int]], tls: ssl.SSLContext | None, timeout_s: float,
    processes: Iterable[Started] = (),
) -> Statuses:
    """The status of every replica of ``addresses`` that answers within ``timeout_s``
    (asked again until then); it stops asking one of ``processes`` that exited."""
    from consensus.runtime.client import Client

    deadline = time.monotonic() + timeout_s
    exited = {s.replica for s in processes if s.process.poll() is not None}
    answers: Statuses = {}

    async def ask(replica: int, address: tuple[str, int]) -> None:
        while time.monotonic() < deadline and replica not in exited:
            try:
                async with Client(_TOOL_CLIENT_ID, [address], timeout_s=1.0, attempts=1,
                                  tls=tls) as client, asyncio.timeout(1.0):
                    answers[replica] = await client.status()
                return
            except (SDPaxosError, OSError, TimeoutError):
                exited.update(s.replica for s in processes if s.process.poll() is not None)
                await asyncio.sleep(0.2)

    await asyncio.gather(*(ask(replica, address) for replica, address in addresses.items()))
    return answers


def members_of(answers: Statuses, config: ClusterConfig) -> set[int] | None:
    """The member ids of the newest membership among ``answers`` (highest epoch, then
    applied position: ``consensus.runtime.client.newest_status``); the cluster file's
    replicas for a protocol without membership changes; None when nothing (sensible)
    answered."""
    from consensus.errors import DecodeError
    from consensus.runtime.client import newest_status
    from consensus.runtime.members import members_of_status

    newest = newest_status(answers.values())
    if newest is None:
        return None
    try:
        members = members_of_status(newest)
    except DecodeError:  # a replica never crashes the tool
        return None
    if members is None:
        return {spec.id for spec in config.replicas}
    return {member.id for member in members}


async def wait_serving(
    addresses: Mapping[int, tuple[str, int]], timeout_s: float, processes: Iterable[Started],
    tls: ssl.SSLContext | None,
) -> bool:
    """Every replica of ``addresses`` answers a linearizable read within ``timeout_s``; False
    at once when one of ``processes`` exits."""
    from consensus.runtime.client import Client
    from consensus.statemachine import kv_get

    started = list(processes)
    deadline = time.monotonic() + timeout_s
    for address in addresses.values():
        while True:
            if any(s.process.poll() is not None for s in started):
                return False
            if time.monotonic() >= deadline:
                return False
            try:
                async with Client(_TOOL_CLIENT_ID, [address], timeout_s=1.0, attempts=1,
                                  tls=tls) as client:
                    await client.read(kv_get("__probe__"), ("__probe__",))
                break
            except (SDPaxosError, OSError, TimeoutError):
                await asyncio.sleep(0.2)
    return True


# ---------------------------------------------------------------------------- the verbs


@dataclass(frozen=True, slots=True)
class _Cluster:
    """A cluster directory as ``up`` and ``restart`` find it."""

    config: ClusterConfig
    #: the tools' TLS context (None: a plaintext cluster)
    tls: ssl.SSLContext | None
    #: replica id -> client address, of the cluster file's replicas
    addresses: dict[int, tuple[str, int]]
    #: what runs now (``running``)
    running: dict[int, int]
    #: the log's members, as a running replica tells (``members_of``; None: none told)
    members: set[int] | None


def _find(directory: Path, only: int | None, verb: str, timeout_s: float) -> _Cluster | int:
    """The cluster of ``directory``: what runs and the log's members; an exit code (said
    why) when its file does not load or has no replica ``only``."""
    from consensus.errors import ConfigError
    from consensus.runtime.cluster_config import load_cluster_config

    try:
        config = load_cluster_config(directory / CONFIG_NAME)
        tls = config.tls.tool() if config.tls is not None else None
    except ConfigError as exc:
        print(f"sdpaxos cluster {verb}: {exc}", file=sys.stderr)
        return USAGE
    addresses = {spec.id: spec.client_address for spec in config.replicas}
    if only is not None and only not in addresses:
        print(f"sdpaxos cluster {verb}: the cluster file has no replica {only} "
              f"(replicas {_ids(addresses)})", file=sys.stderr)
        return USAGE
    now = running(config)
    answers = asyncio.run(statuses({r: addresses[r] for r in now if r in addresses}, tls,
                                   timeout_s))
    return _Cluster(config, tls, addresses, now, members_of(answers, config))


def _ids(replicas: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(replicas))


def _replicas(replicas: Iterable[int]) -> str:
    """"replica 1" or "replicas 0, 2"."""
    ids = sorted(replicas)
    return f"replica{'s' if len(ids) != 1 else ''} {_ids(ids)}"


def up(directory: Path, only: int | None, timeout_s: float, extra: Sequence[str]) -> int:
    """``sdpaxos cluster up [--id N]`` (see the module); 0 once everything started serves,
    1 if something failed (what this command started is stopped again), 2 for a bad cluster
    file or ``--id``."""
    found = _find(directory, only, "up", timeout_s)
    if isinstance(found, int):
        return found
    config, tls, addresses, before, members = (found.config, found.tls, found.addresses,
                                               found.running, found.members)
    if members is not None:
        for replica in sorted(members - addresses.keys()):
            print(f"cluster up: member {replica} has no [[replica]] entry in "
                  f"{directory / CONFIG_NAME}: add it (sdpaxos member list shows its "
                  "addresses) to start it here")
        for replica in sorted(before.keys() - members):
            print(f"cluster up: replica {replica} runs (pid {before[replica]}) but is no "
                  f"longer a member: stop it with sdpaxos cluster down --dir {directory} "
                  f"--id {replica}")
        if only is not None and only not in members:
            print(f"sdpaxos cluster up: replica {only} is not a member of the cluster (the "
                  f"log's members are {_ids(members)}): not started", file=sys.stderr)
            return REFUSED
    wanted = [only] if only is not None else sorted(
        addresses.keys() if members is None else members & addresses.keys())
    missing = [r for r in wanted if r not in before]
    if not missing:
        write_pids(directory, config)
        print(f"cluster up: {_replicas(wanted)} already running (pids "
              f"{_ids(before[r] for r in wanted)}); nothing to start")
        return OK
    started = [start(directory / CONFIG_NAME, r, directory, extra) for r in missing]
    if members is None:  # nothing ran: the log's members, from what started
        answers = asyncio.run(statuses({s.replica: addresses[s.replica] for s in started},
                                       tls, timeout_s, started))
        members = members_of(answers, config)
        # a removed member exits by itself (REMOVED) or, an older build's, is stopped again
        removed = [s for s in started if s.process.poll() == REMOVED
                   or (members is not None and s.replica not in members)]
        if removed:
            stop(config, {s.replica: s.process.pid for s in removed
                          if s.process.poll() is None})
            for s in removed:
                print(f"cluster up: replica {s.replica} is no longer a member of the cluster "
                      "(its log says so): not started")
            started = [s for s in started if s not in removed]
    serving = asyncio.run(wait_serving({s.replica: addresses[s.replica] for s in started},
                                       timeout_s, started, tls))
    exited = [s for s in started if s.process.poll() is not None]
    if serving and not exited:
        now = write_pids(directory, config)
        print(f"cluster up: {len(started)} replica{'s' if len(started) > 1 else ''} "
              f"started and serving ({_replicas(s.replica for s in started)}, pids "
              f"{_ids(s.process.pid for s in started)})"
              + (f"; {_replicas(before.keys() & set(wanted))} already running"
                 if before.keys() & set(wanted) else ""))
        return OK if now.keys() >= {s.replica for s in started} else REFUSED
    # Serving addresses prove nothing about our processes (another cluster may hold them):
    # a replica that exited is a failure, whoever answers.
    for s in exited:
        print(f"cluster up: replica {s.replica} exited with status {s.process.returncode}; "
              f"see {directory / f'replica-{s.replica}.log'}", file=sys.stderr)
    if not exited:
        print(f"cluster up: {_replicas(s.replica for s in started)} did not serve within "
              f"{timeout_s:g} s; see their logs in {directory}", file=sys.stderr)
    stop(config, {s.replica: s.process.pid for s in started if s.process.poll() is None})
    if before:
        print(f"cluster up: stopped what this command started; {_replicas(before)} "
              "running before still run", file=sys.stderr)
    write_pids(directory, config)
    return REFUSED


def down(directory: Path, only: int | None) -> int:
    """``sdpaxos cluster down [--id N]``: 0 once nothing (or N) runs any more."""
    found = _find(directory, None, "down", 0.0)  # (nothing asked: the members do not matter)
    if isinstance(found, int):
        return found
    config, now = found.config, found.running
    targets = now if only is None else {r: p for r, p in now.items() if r == only}
    if not targets:
        print(f"cluster down: {'no replica' if only is None else f'replica {only} is not'} "
              f"running in {directory}")
        write_pids(directory, config)
        return OK
    killed = stop(config, targets)
    write_pids(directory, config)
    print(f"cluster down: stopped {len(targets)} replica{'s' if len(targets) > 1 else ''} "
          f"({_replicas(targets)}, pids {_ids(targets.values())})"
          + (f"; killed {_ids(killed)} after {STOP_TIMEOUT_S:g} s" if killed else ""))
    return OK


def restart(directory: Path, only: int | None, timeout_s: float, extra: Sequence[str]) -> int:
    """``sdpaxos cluster restart [--id N]``: each replica (or N) stopped and started again,
    one at a time, the next once it serves; 1 as soon as one does not come back."""
    found = _find(directory, only, "restart", timeout_s)
    if isinstance(found, int):
        return found
    config, tls, addresses, now, members = (found.config, found.tls, found.addresses,
                                            found.running, found.members)
    known = set(addresses) if members is None else members & addresses.keys()
    if only is not None and only not in known:
        print(f"sdpaxos cluster restart: replica {only} is not a member of the cluster (the "
              f"log's members are {_ids(known)})", file=sys.stderr)
        return REFUSED
    # the stopped ones first: restarting a running one while another is down may leave
    # no majority
    for replica in [only] if only is not None else sorted(known, key=lambda r: (r in now, r)):
        pid = now.get(replica)
        if pid is not None:
            stop(config, {replica: pid})
        started = start(directory / CONFIG_NAME, replica, directory, extra)
        if not asyncio.run(wait_serving({replica: addresses[replica]}, timeout_s, [started],
                                        tls)):
            code = started.process.poll()
            print(f"sdpaxos cluster restart: replica {replica} "
                  + ("was removed from the cluster (exit 4): not restarted" if code == REMOVED
                     else f"exited with status {code}" if code is not None else
                     f"did not serve within {timeout_s:g} s (it keeps trying)")
                  + f"; see {directory / f'replica-{replica}.log'}", file=sys.stderr)
            write_pids(directory, config)
            return REFUSED
        print(f"cluster restart: replica {replica} "
              + (f"stopped (pid {pid}) and " if pid is not None else "")
              + f"started (pid {started.process.pid}), serving")
    write_pids(directory, config)
    return OK
