"""The whole life of a cluster with real processes, driven through the command line the way an
operator drives it (issue 34, point 7), the tools' output checked after every step:

    init -> up -> load -> member add -> promote -> remove -> replace a wiped replica ->
    kill -9 one -> restart only it -> backup -> snapshot status -> restore (the same
    configuration; then one that would drop a group) -> TLS client errors

After each membership step ``endpoint status --cluster`` lists exactly the live members, ``ctl``
works through the newest member's gRPC address, and a store connected with the cluster's first
addresses (by now mostly removed replicas) follows the members (``Client.sync``); the removed
replica logs its removal, exits with ``REMOVED`` and is refused a second start; after the
restore every acknowledged allocation is there.

Steps that need commands another branch builds (``cluster restart --id``, ``snapshot status``,
restore that seeds the backup's own configuration and refuses to drop a group, TLS refusals
named on the client side) probe for them on the command line: where one is missing the step is
recorded as ``missing: ...`` (or done by hand, ``serve`` for ``cluster restart``) and the rest
goes on; once it exists the step runs and is checked. Every step's wall time goes to the table
this test prints (``-s``) and to ``lifecycle.json`` in its directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench.cli import main
from cluster_state.client import AllocationStore
from cluster_state.ctl import _Replicas
from cluster_state.ops import GroupSpec, Member, Placed
from consensus.runtime.client import Client, new_client_id
from consensus.runtime.client_options import parse_endpoint
from consensus.runtime.exit_codes import OK, REFUSED, REMOVED, UNAVAILABLE, USAGE
from consensus.runtime.local_cluster import free_base_port

#: how long a step may take to show its effect (a learner catching up, an epoch closing, a
#: replica starting on a loaded machine)
SETTLE_S = 60.0
#: the gangs loaded at first, and after the replace (each 1 pod x 8 GPUs, round the VCs)
FIRST_LOAD = 8
SECOND_LOAD = 4
#: the generated GPU cluster's virtual clusters (``cluster init --gpu-store``)
VCS = ("vc00", "vc01", "vc02", "vc03")


def has_verb(*words: str) -> bool:
    """Whether ``sdpaxos WORDS... --help`` is a command of this build."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main([*words, "--help"])
        except SystemExit as exc:
            return exc.code == 0
    return True


def has_option(option: str, *words: str) -> bool:
    out = io.StringIO()
    with (contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()),
          contextlib.suppress(SystemExit)):
        main([*words, "--help"])
    return option in out.getvalue()


@dataclass
class Step:
    name: str
    seconds: float = 0.0
    #: "done", "done by hand: ..." or "missing: ..."
    outcome: str = "done"


@dataclass
class Life:
    """One cluster directory, the replicas this test started itself, and what was
    acknowledged."""

    root: Path
    base: int = field(default_factory=free_base_port)
    steps: list[Step] = field(default_factory=list)
    #: replicas started by this test (by id); ``cluster up``'s are in pids.json
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: every acknowledged allocation: group -> its pods (node, devices)
    acked: dict[str, list[tuple[str, tuple[int, ...]]]] = field(default_factory=dict)
    #: other cluster directories brought up (restores, the TLS cluster): stopped at the end
    others: list[Path] = field(default_factory=list)

    @property
    def dir(self) -> Path:
        return self.root / "c"

    @property
    def config(self) -> Path:
        return self.dir / "cluster.toml"

    # ------------------------------------------------------------------ running things
    def sdpaxos(self, *args: str, expect: int | None = OK,
                timeout: float = SETTLE_S) -> subprocess.CompletedProcess[str]:
        """``sdpaxos ARGS`` as a process; its exit code checked against ``expect``."""
        done = subprocess.run([sys.executable, "-m", "bench.cli", *args], capture_output=True,
                              text=True, timeout=timeout,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if expect is not None:
            assert done.returncode == expect, (args, done.returncode, done.stdout, done.stderr)
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.sdpaxos(*args, "--json").stdout)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[Step]:
        step = Step(name)
        started = time.monotonic()
        try:
            yield step
        finally:
            step.seconds = time.monotonic() - started
            self.steps.append(step)

    def missing(self, name: str, why: str) -> None:
        self.steps.append(Step(name, 0.0, f"missing: {why}"))

    def wait(self, done: Callable[[], bool], what: str, timeout_s: float = SETTLE_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, f"{what}\n{self.logs()}"
            time.sleep(0.3)

    def start(self, command: str, replica: int) -> None:
        """Start a replica with the command ``member add`` printed."""
        words = command.split()
        assert words[:2] == ["sdpaxos", "serve"], command
        log = open(self.dir / f"replica-{replica}.log", "ab")  # noqa: SIM115
        self.processes[replica] = subprocess.Popen(
            [sys.executable, "-m", "bench.cli", *words[1:]], stdout=log,
            stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def up_pids(self, directory: Path | None = None) -> dict[int, int]:
        path = (directory or self.dir) / "pids.json"
        if not path.exists():
            return {}
        return {int(k): v for k, v in json.loads(path.read_text()).items()}

    def stop(self) -> None:
        for directory in self.others:
            subprocess.run([sys.executable, "-m", "bench.cli", "cluster", "down", "--dir",
                            str(directory)], capture_output=True, timeout=60)
        for pid in self.up_pids().values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in self.processes.values():
            process.kill()
            process.wait()

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-2500:]}"
                         for log in sorted(self.dir.glob("replica-*.log")))

    # ------------------------------------------------------------------ the cluster file
    def add_entry(self, entry: str) -> None:
        self.config.write_text(self.config.read_text().rstrip("\n") + "\n\n" + entry + "\n")

    def drop_entry(self, replica: int) -> None:
        """Delete a removed member's ``[[replica]]`` entry (allowed: ids may have gaps)."""
        text = self.config.read_text()
        entry = re.compile(rf"\[\[replica\]\]\nid = {replica}\n(?:[a-z_]+ = [^\n]*\n)*\n?")
        assert len(entry.findall(text)) == 1, text
        self.config.write_text(entry.sub("", text))

    # ------------------------------------------------------------------ what the tools say
    def members(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.json("member", "list", "--config", str(self.config))
        return doc

    def voters(self) -> list[int]:
        return sorted(m["id"] for m in self.members()["members"] if m["role"] == "voter")

    def endpoint_ids(self, *extra: str) -> list[int]:
        """The ids ``endpoint status --cluster`` lists, every one reachable."""
        rows = self.json("endpoint", "status", "--cluster", "--config", str(self.config),
                         *extra)
        assert all(row["reachable"] for row in rows), rows
        return sorted(row["id"] for row in rows)

    def member_of(self, replica: int) -> dict[str, Any]:
        (found,) = [m for m in self.members()["members"] if m["id"] == replica]
        return found

    def ctl_sees_every_allocation(self, grpc: str) -> None:
        """``ctl`` through one member's gRPC address lists every acknowledged allocation."""
        groups = self.json("ctl", "--endpoints", grpc, "status")
        assert {g["name"] for g in groups} >= set(self.acked), (groups, self.acked)

    def ready(self, metrics: str) -> bool:
        with urllib.request.urlopen(f"http://{metrics}/readyz", timeout=5) as answer:
            return bool(answer.status == 200)

    async def load(self, seeds: list[str], count: int, first: int) -> None:
        """Submit ``count`` gangs through a store that starts at ``seeds`` (it follows the
        current members), recording each placement acknowledged."""
        async with AllocationStore.connect(seeds, timeout_s=5.0, attempts=6) as store:
            for k in range(first, first + count):
                spec = GroupSpec(name=f"job-{k}", vc=VCS[k % len(VCS)], priority=10,
                                 members=(Member(pods=1, leaves=8),))
                result = await store.submit(spec)
                assert isinstance(result, Placed), result
                self.acked[spec.name] = [(p.node, tuple(p.devices)) for p in result.pods]


async def synced(seeds: list[str]) -> list[str]:
    """Where a native client that starts at ``seeds`` talks after ``Client.sync``."""
    async with Client(new_client_id(), [parse_endpoint(s) for s in seeds]) as client:
        await client.sync()
        return [f"{host}:{port}" for host, port in client.addresses]


def ctl_targets(seeds: list[str]) -> list[str]:
    """Where ``sdpaxos ctl`` calls after it synced from ``seeds`` (gRPC ``ListMembers``)."""
    replicas = _Replicas(seeds, 5.0)
    try:
        replicas.sync()
        return replicas.targets
    finally:
        replicas.close()


def seeds_of(config: Path) -> list[str]:
    """The client addresses the cluster file listed when the cluster was initialized."""
    return re.findall(r'client_address = "([^"]+)"', config.read_text())


def test_the_whole_life_of_a_cluster(tmp_path: Path) -> None:
    life = Life(tmp_path)
    try:
        _live(life)
    finally:
        life.stop()
        _report(life, tmp_path)


def _live(life: Life) -> None:
    config = str(life.config)
    base = life.base

    with life.step("init"):
        life.sdpaxos("cluster", "init", "--dir", str(life.dir), "--gpu-store", "--no-wan",
                     "--base-port", str(base))
        assert "initial_replicas = 3" in life.config.read_text()
    first_seeds = seeds_of(life.config)
    initial_file = life.config.read_text()

    with life.step("up"):
        life.sdpaxos("cluster", "up", "--dir", str(life.dir))
        life.wait(lambda: life.endpoint_ids() == [0, 1, 2], "three members listed")
        # every member published where it runs: the log, not only the file, says so
        life.wait(lambda: all(m["published"] for m in life.members()["members"]),
                  "the first members publish their addresses")

    with life.step("load"):
        asyncio.run(life.load(first_seeds, FIRST_LOAD, 0))
        placed = life.json("ctl", "--config", config, "submit", "by-ctl", "--vc", "vc00",
                           "--pods", "1x8")
        life.acked["by-ctl"] = [(node, tuple(devices)) for _, node, devices in placed["pods"]]
        life.ctl_sees_every_allocation(f"127.0.0.1:{base + 300}")

    with life.step("member add"):
        added = life.json("member", "add", "--config", config, "--site", "IRE")
        assert added["ok"] and added["id"] == 3, added
        # a whole replica: every address, in the layout cluster init used
        for field_name, offset in (("address", 0), ("client_address", 100),
                                   ("metrics_address", 200), ("grpc_address", 300)):
            assert f'{field_name} = "127.0.0.1:{base + offset + 3}"' in added["entry"], added
        assert added["start"] == f"sdpaxos serve --config {life.config.resolve()} --id 3 " \
            "--initial-cluster-state new"
        life.add_entry(added["entry"])
        life.start(added["start"], 3)
        life.wait(lambda: life.member_of(3)["applied"] is not None, "the learner serves")

    with life.step("promote"):
        # promoted by the voter it learns from once caught up (often before this), or by this
        promoted = life.sdpaxos("member", "promote", "--config", config, "3", expect=None)
        assert (promoted.returncode, promoted.stdout.strip()) == (OK, "ok: promoting 3 (the "
                                                                  "epoch closes)") or (
            promoted.returncode == REFUSED and "3 is a voter already" in promoted.stderr), (
            promoted)
        life.wait(lambda: life.voters() == [0, 1, 2, 3], "3 votes")
        assert life.endpoint_ids() == [0, 1, 2, 3]
        new = life.member_of(3)
        assert new["published"] and life.ready(new["metrics_address"])
        life.ctl_sees_every_allocation(new["grpc_address"])

    with life.step("remove"):
        pid = life.up_pids()[0]
        removed = life.json("member", "remove", "--config", config, "0")
        assert removed["answer"] == "ok: removing voter 0 (the epoch closes)", removed
        life.wait(lambda: life.voters() == [1, 2, 3], "0 removed")
        # the removed replica said so and stopped by itself; it never starts again
        life.wait(lambda: not Path(f"/proc/{pid}").exists()
                  or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", "0 exits")
        assert "removed from the cluster at epoch" in (life.dir / "replica-0.log").read_text()
        again = life.sdpaxos("serve", "--config", config, "--id", "0", expect=REMOVED)
        assert "was removed from the cluster" in again.stderr, again.stderr
        # its entry may go; the tools list the members either way
        assert life.endpoint_ids() == [1, 2, 3]
        life.drop_entry(0)
        assert life.endpoint_ids() == [1, 2, 3]
        assert life.endpoint_ids("--endpoints", f"127.0.0.1:{base + 100 + 3}") == [1, 2, 3]

    with life.step("replace a wiped replica"):
        os.kill(life.up_pids()[2], signal.SIGKILL)
        shutil.rmtree(life.dir / "data" / "replica-2")
        refused = life.sdpaxos("serve", "--config", config, "--id", "2", expect=USAGE)
        assert "empty (no IDENTITY)" in refused.stderr
        replaced = life.json("member", "replace", "--config", config, "2", "--site", "OH")
        assert replaced["answer"] == "ok: 4 added as a learner to replace 2", replaced
        life.drop_entry(2)
        life.add_entry(replaced["entry"])
        life.start(replaced["start"], 4)
        life.wait(lambda: life.voters() == [1, 3, 4], "4 replaces 2")
        assert life.endpoint_ids() == [1, 3, 4]
        newest = life.member_of(4)
        assert life.ready(newest["metrics_address"])
        life.ctl_sees_every_allocation(newest["grpc_address"])
        # clients started at the cluster's first addresses (0 and 2 gone) find the members,
        # the epoch's sequencer first, and nothing else
        voters = [m for m in life.members()["members"] if m["role"] == "voter"]
        assert asyncio.run(synced(first_seeds)) == [m["client_address"] for m in voters]
        first_grpc = re.findall(r'grpc_address = "([^"]+)"', initial_file)
        assert ctl_targets(first_grpc) == [m["grpc_address"] for m in voters]
        asyncio.run(life.load(first_seeds, SECOND_LOAD, FIRST_LOAD))
        life.ctl_sees_every_allocation(newest["grpc_address"])

    with life.step("kill -9 one"):
        os.kill(life.up_pids()[1], signal.SIGKILL)
        life.ctl_sees_every_allocation(newest["grpc_address"])  # a majority serves

    with life.step("restart only it") as step:
        if has_verb("cluster", "restart"):
            life.sdpaxos("cluster", "restart", "--dir", str(life.dir), "--id", "1")
        else:
            step.outcome = "done by hand: sdpaxos serve (cluster restart --id is not built)"
            life.start(f"sdpaxos serve --config {life.config.resolve()} --id 1", 1)
        life.wait(lambda: life.sdpaxos("endpoint", "health", "--config", config,
                                       expect=None).returncode == OK, "every member healthy")
        assert life.endpoint_ids() == [1, 3, 4]

    backup = life.root / "backup.snap"
    with life.step("backup"):
        life.sdpaxos("snapshot", "save", str(backup), "--config", config)

    if has_verb("snapshot", "status"):
        with life.step("snapshot status"):
            status = life.sdpaxos("snapshot", "status", str(backup)).stdout
            assert "cluster_state" in status and "sha256" in status.lower(), status
    else:
        life.missing("snapshot status", "sdpaxos snapshot status is not built")

    restored = life.root / "restored"
    with life.step("restore (same configuration)") as step:
        plain = ["snapshot", "restore", str(backup), "--dir", str(restored), "--no-wan",
                 "--base-port", str(free_base_port())]
        if not has_option("--allow-drop", "snapshot", "restore"):
            # this build makes the operator name a configuration (the same one here)
            step.outcome = "done by hand: --gpu-config given (restore does not seed the " \
                "backup's own configuration yet)"
            plain += ["--gpu-config", str(life.dir / "gpu.yaml")]
        life.sdpaxos(*plain)
        life.others.append(restored)
        life.sdpaxos("cluster", "up", "--dir", str(restored))
        groups = life.json("ctl", "--config", str(restored / "cluster.toml"), "status")
        found = {g["name"]: [(p["node"], tuple(p["devices"])) for p in g["pods"]]
                 for g in groups}
        assert found == life.acked, (found, life.acked)  # every acknowledged allocation

    if has_option("--allow-drop", "snapshot", "restore"):
        with life.step("restore (a configuration that would drop a group)"):
            narrow = life.root / "narrow.yaml"
            text = (life.dir / "gpu.yaml").read_text()
            narrow.write_text(_without_vc(text, "vc01"))
            target = life.root / "dropped"
            refused = life.sdpaxos("snapshot", "restore", str(backup), "--dir", str(target),
                                   "--gpu-config", str(narrow), expect=None)
            assert refused.returncode != OK and "job-1" in refused.stdout + refused.stderr
            assert not target.exists() or not any(target.iterdir())  # nothing written
    else:
        life.missing("restore (a configuration that would drop a group)",
                     "restore neither refuses nor takes --allow-drop yet")

    with life.step("TLS client errors") as step:
        secure = life.root / "tls"
        life.sdpaxos("cluster", "init", "--dir", str(secure), "--tls", "--no-wan",
                     "--base-port", str(free_base_port()))
        life.others.append(secure)
        life.sdpaxos("cluster", "up", "--dir", str(secure))
        client = re.findall(r'client_address = "([^"]+)"', (secure / "cluster.toml").read_text())
        plaintext = life.sdpaxos("get", "k", "--endpoints", client[0], "--timeout", "3",
                                 expect=None)
        if plaintext.returncode == UNAVAILABLE:
            step.outcome = ("missing: a plaintext client of a TLS cluster still exits 3 "
                            f"(unavailable): {plaintext.stderr.strip()[:120]}")
        else:
            assert plaintext.returncode not in (OK, REFUSED, UNAVAILABLE), plaintext
            assert "TLS" in plaintext.stderr, plaintext.stderr


def _without_vc(text: str, vc: str) -> str:
    """The generated GPU configuration without one virtual cluster (its groups would go)."""
    lines, skipping = [], False
    for line in text.splitlines():
        if line.strip().startswith(f"{vc}:"):
            skipping, indent = True, len(line) - len(line.lstrip())
            continue
        if skipping and line.strip() and len(line) - len(line.lstrip()) <= indent:
            skipping = False
        if not skipping:
            lines.append(line)
    return "\n".join(lines) + "\n"


def _report(life: Life, directory: Path) -> None:
    rows = [{"step": s.name, "seconds": round(s.seconds, 2), "outcome": s.outcome}
            for s in life.steps]
    (directory / "lifecycle.json").write_text(json.dumps(rows, indent=1))
    print("\nthe life of a cluster (wall seconds per step):")
    for row in rows:
        print(f"  {row['step']:<52} {row['seconds']:>7.2f}  {row['outcome']}")


@pytest.fixture(autouse=True)
def _no_stray_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tools read $SDPAXOS_ENDPOINTS/$SDPAXOS_CONFIG: none from the caller's shell."""
    monkeypatch.delenv("SDPAXOS_ENDPOINTS", raising=False)
    monkeypatch.delenv("SDPAXOS_CONFIG", raising=False)
