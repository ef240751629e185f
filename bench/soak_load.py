"""The life ``sdpaxos bench soak`` puts its clusters through: what clients do, and what they
were told.

* ``Schedulers``: a few scheduler sessions (``AllocationStore.connect``) submitting gangs of
  the demo's shapes (``cluster_state.workload``) at a paced rate, each held for a while and
  released. One priority for all, so no acknowledged allocation is taken by preemption: each
  must stay in the store until its scheduler released it. A session is renewed every few
  minutes (a scheduler restarting) at the members that run then. Every acknowledged
  placement and release goes into ``AckedAllocations``; submit and release latencies into
  ``latencies``.
* ``Watchers``: watchers following the store (``AllocationStore.watch``: the process's
  watchers share one pushed stream per replica), each feeding its own ``GpuLedger``, the
  independent witness that no GPU is given twice. A watcher whose stream ended resumes from
  the last revision it took, at the members that run then; one told ``EventsCompacted``
  re-lists the allocations and watches from the listing's revision.
* ``KVClients``: closed-loop key-value clients (put, linearizable get, compare-and-set on a
  few keys, paced), recorded as ``bench.nemesis.Record`` for ``sdpaxos lincheck``.
* ``OneShotWriter``: the command line's one-shot writes — ``sdpaxos put`` (recorded for
  lincheck too) and, every few, ``sdpaxos ctl submit`` / ``release`` of a small gang —
  run as subprocesses (``mode="subprocess"``, the real thing: a process start each) or
  in-process (``mode="in-process"``: the verb's one-shot session — a fresh client id, one
  request that closes the session — without the process start).

Outcomes follow the client's contract: ok; ``fail`` (a definite failure: it never happened);
``info`` (indefinite: it may have). A command-line verb's exit status says which: 0 ok, 1
refused (definite), anything else (3 unavailable: possibly sent) indefinite.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgpack

from bench.nemesis import Record
from bench.soak_cluster import run_tool
from cluster_state.client import AllocationStore
from cluster_state.errors import ClusterStateError, EventsCompacted, InvalidRequest
from cluster_state.events import ChangeEvent
from cluster_state.ledger import GpuLedger
from cluster_state.ops import GroupSpec, Member, Placed, Waiting
from cluster_state.workload import SHAPES
from consensus.errors import DefiniteFailure, SDPaxosError
from consensus.runtime.client import Client, new_client_id
from consensus.statemachine import kv_cas, kv_get, kv_put

__all__ = [
    "KEYS",
    "AckedAllocations",
    "KVClients",
    "Latency",
    "OneShotWriter",
    "Schedulers",
    "Watchers",
    "now_us",
]

#: the one priority every gang has (no preemption: see the module)
PRIORITY = 100
#: a request unanswered this long goes to the next replica
REQUEST_TIMEOUT_S = 3.0
#: the key-value keys: few, so operations on a key overlap and the check has teeth
KEYS = tuple(f"k{i}" for i in range(5))
#: the key-value clients' mix: (operation, weight)
KV_WEIGHTS = (("put", 3), ("get", 4), ("cas", 3))
#: pause after a failed operation (doubled per failure in a row, up to the most)
BACKOFF_S, BACKOFF_MAX_S = 0.1, 2.0
#: a renewed session's predecessor is closed this long after (its requests finished)
RETIRED_SESSION_GRACE_S = 30.0
#: a watcher whose stream failed tries again after this pause
WATCH_RETRY_S = 0.5
#: one-shot ``ctl`` gangs: every this many one-shot writes is a ctl submit or release
CTL_EVERY = 4
#: a one-shot tool's time limit, and each of its requests'
ONE_SHOT_LIMIT_S = 60.0
ONE_SHOT_TIMEOUT_S = 2.0

Outcome = Literal["ok", "fail", "info"]
#: (completed at, seconds from the load's start; what; its latency in seconds)
Latency = tuple[float, str, float]


def now_us() -> int:
    return time.monotonic_ns() // 1000


class AckedAllocations:
    """Every allocation a client was told is placed, and what became of it as far as clients
    were told: released (acknowledged), or uncertain (a submit or release whose outcome was
    indefinite). What must be in the store at the end: ``expected``."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.released: set[str] = set()
        self.uncertain: set[str] = set()

    def placed(self, name: str, token: int) -> None:
        self.tokens[name] = token

    def expected(self) -> dict[str, int]:
        """Acknowledged allocations not released (nor maybe released) since: name -> token."""
        return {name: token for name, token in self.tokens.items()
                if name not in self.released and name not in self.uncertain}

    def missing(self, groups: Sequence[dict[str, Any]]) -> list[str]:
        """The expected allocations ``groups`` (a listing) does not hold, placed, with their
        fencing token; one line each."""
        by_name = {g["name"]: g for g in groups}
        problems = []
        for name, token in sorted(self.expected().items()):
            group = by_name.get(name)
            if group is None:
                problems.append(f"{name} (token {token}) is gone")
            elif group.get("token") != token or group.get("state") != "placed":
                problems.append(f"{name}: token {group.get('token')} state "
                                f"{group.get('state')}, acknowledged token {token}")
        return problems


class _Sessions:
    """A scheduler's store session, renewed every ``lifetime_s`` at the then members (a
    scheduler restarting); a renewed session is closed once its requests had time to end."""

    def __init__(self, addresses: Callable[[], list[tuple[str, int]]], home: int,
                 lifetime_s: float) -> None:
        self._addresses, self._home, self._lifetime = addresses, home, lifetime_s
        self._store: AllocationStore | None = None
        self._opened = 0.0
        self._retired: list[tuple[float, AllocationStore]] = []
        self.renewed = 0

    def current(self) -> AllocationStore:
        if self._store is None or time.monotonic() - self._opened > self._lifetime:
            self.renew()
        assert self._store is not None
        return self._store

    def renew(self) -> None:
        now = time.monotonic()
        if self._store is not None:
            self._retired.append((now, self._store))
            self.renewed += 1
        addresses = self._addresses()
        self._store = AllocationStore.connect(addresses, home=self._home % len(addresses),
                                              timeout_s=REQUEST_TIMEOUT_S,
                                              attempts=len(addresses))
        self._opened = now

    async def close_retired(self, everything: bool = False) -> None:
        keep = []
        for retired_at, store in self._retired:
            if everything or time.monotonic() - retired_at > RETIRED_SESSION_GRACE_S:
                await store.close()
            else:
                keep.append((retired_at, store))
        self._retired = keep

    async def close(self) -> None:
        await self.close_retired(everything=True)
        if self._store is not None:
            await self._store.close()


class Schedulers:
    """Scheduler sessions placing and releasing gangs (see the module)."""

    def __init__(self, addresses: Callable[[], list[tuple[str, int]]], vcs: Sequence[str],
                 *, sessions: int, rate: float, hold_s: float, session_s: float, seed: int,
                 clock: Callable[[], float], acked: AckedAllocations) -> None:
        self._sessions = [_Sessions(addresses, k, session_s) for k in range(sessions)]
        self._vcs, self._rate, self._hold = list(vcs), rate, hold_s
        self._rng = random.Random(f"{seed}/schedulers")
        self._clock = clock
        self.acked = acked
        self.latencies: list[Latency] = []
        self.counts = dict.fromkeys(("submitted", "placed", "waiting", "indefinite",
                                     "refused", "released", "release_failed"), 0)
        self.stop = asyncio.Event()
        self._jobs: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Submit at the paced rate until ``stop``; then let the jobs in flight settle."""
        began = time.monotonic()
        for n in itertools.count():
            due = began + n / self._rate
            if n % 100 == 0:
                for sessions in self._sessions:
                    await sessions.close_retired()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), max(0.0, due - time.monotonic()))
            if self.stop.is_set():
                break
            task = asyncio.ensure_future(self._job(n))
            self._jobs.add(task)
            task.add_done_callback(self._jobs.discard)
        if self._jobs:
            await asyncio.gather(*self._jobs)

    async def close(self) -> None:
        for sessions in self._sessions:
            await sessions.close()

    @property
    def renewed(self) -> int:
        return sum(s.renewed for s in self._sessions)

    def _spec(self, name: str) -> GroupSpec:
        shapes = [shape for shape, _ in SHAPES]
        members = self._rng.choices(shapes, weights=[weight for _, weight in SHAPES])[0]
        return GroupSpec(name=name, vc=self._rng.choice(self._vcs), priority=PRIORITY,
                         members=tuple(Member(p, g) for p, g in members))

    async def _timed(self, what: str, call: Any) -> Any:
        began = time.monotonic()
        result = await call
        self.latencies.append((self._clock(), what, time.monotonic() - began))
        return result

    async def _job(self, n: int) -> None:
        sessions = self._sessions[n % len(self._sessions)]
        name = f"job-{n}"
        hold = self._rng.expovariate(1 / self._hold)
        spec = self._spec(name)
        try:
            result = await self._timed("submit", sessions.current().submit(spec))
        except (DefiniteFailure, InvalidRequest):
            self.counts["refused"] += 1
            return
        except (SDPaxosError, ClusterStateError):
            self.counts["indefinite"] += 1  # may be placed: released below, never counted
            self.acked.uncertain.add(name)
            sessions.renew()
            await self._release(sessions, name)
            return
        self.counts["submitted"] += 1
        if isinstance(result, Waiting):
            self.counts["waiting"] += 1
            return
        if isinstance(result, Placed):
            self.counts["placed"] += 1
            self.acked.placed(name, result.token)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), hold)
        if not self.stop.is_set():  # at the end the jobs stay placed, to be checked
            await self._release(sessions, name)

    async def _release(self, sessions: _Sessions, name: str) -> None:
        for _ in range(3):  # a definite failure changed nothing: try again
            try:
                await self._timed("release", sessions.current().release(name))
                self.acked.released.add(name)
                self.counts["released"] += 1
                return
            except DefiniteFailure:
                await asyncio.sleep(BACKOFF_S)
            except InvalidRequest:  # refused (not found: an uncertain submit that did not
                break               # place it); nothing changed
            except (SDPaxosError, ClusterStateError):
                self.acked.uncertain.add(name)  # released or not: not checked
                sessions.renew()
                return
        self.counts["release_failed"] += 1


class Watchers:
    """Watchers following the store, each with its own ``GpuLedger`` (see the module)."""

    def __init__(self, addresses: Callable[[], list[tuple[str, int]]],
                 targets: Callable[[], list[str]], count: int) -> None:
        self._addresses, self._targets = addresses, targets
        self.ledgers = [GpuLedger() for _ in range(count)]
        self.events = [0] * count
        self.resumed = [0] * count  # streams that ended and were watched again
        self.relisted = [0] * count  # EventsCompacted: the allocations listed again
        self.errors: list[str] = []
        self._tasks: list[asyncio.Task[None]] = []
        #: the group whose release ends the run: a watcher is done once it took that
        self.last_group = ""
        self.done = [asyncio.Event() for _ in range(count)]

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._watch(k)) for k in range(len(self.ledgers))]

    def _store(self, k: int) -> AllocationStore:
        addresses = self._addresses()
        return AllocationStore.connect(addresses, home=k % len(addresses),
                                       timeout_s=REQUEST_TIMEOUT_S, attempts=len(addresses),
                                       watch_targets=self._targets())

    async def _watch(self, k: int) -> None:
        since = -1
        while True:
            store = self._store(k)
            try:
                async for event in store.watch(since):
                    self.ledgers[k].apply(event)
                    self.events[k] += 1
                    since = event.revision
                    if event.kind == "released" and event.subject == self.last_group:
                        self.done[k].set()
                return  # closed
            except EventsCompacted:
                self.relisted[k] += 1
                since = await self._relist(k, store)
            except (SDPaxosError, ClusterStateError, OSError) as exc:
                self.resumed[k] += 1
                if len(self.errors) < 20:
                    self.errors.append(f"watcher {k}: {exc!r}")
                await asyncio.sleep(WATCH_RETRY_S)
            finally:
                await store.close()

    async def _relist(self, k: int, store: AllocationStore) -> int:
        """A fresh ledger from the allocations now (the listing's own revision): the old
        one's history is gone, so it is judged from here on."""
        while True:
            try:
                listing = await store.allocations()
                break
            except (SDPaxosError, ClusterStateError):
                await asyncio.sleep(WATCH_RETRY_S)
        ledger = GpuLedger()
        ledger.violations = self.ledgers[k].violations  # what it saw before still counts
        self.ledgers[k] = ledger
        for group in listing:
            if group.get("state") == "placed":
                pods = [[p[0], p[1], list(p[2])] for p in group["pods"]]
                ledger.apply(ChangeEvent(listing.revision, "placed", group["name"],
                                         (group.get("chain", ""), pods, group.get("token"))))
        return listing.revision

    async def finish(self, timeout_s: float) -> bool:
        """Wait until every watcher took the release of ``last_group``, then stop them;
        whether all did within ``timeout_s``."""
        try:
            await asyncio.wait_for(asyncio.gather(*(d.wait() for d in self.done)), timeout_s)
            reached = True
        except TimeoutError:
            reached = False
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return reached


class KVClients:
    """Closed-loop key-value clients, paced (see the module)."""

    def __init__(self, addresses: Callable[[], list[tuple[str, int]]], count: int,
                 pause_s: float, session_s: float, seed: int, records: list[Record]) -> None:
        self._addresses, self._count = addresses, count
        self._pause, self._lifetime = pause_s, session_s
        self._seed = seed
        self.records = records
        self.stop = asyncio.Event()

    async def run(self) -> None:
        await asyncio.gather(*(self._client(k) for k in range(self._count)))

    def _new(self, k: int) -> Client:
        addresses = self._addresses()
        return Client(new_client_id(), addresses, home=k % len(addresses),
                      timeout_s=REQUEST_TIMEOUT_S, attempts=len(addresses))

    async def _client(self, k: int) -> None:
        rng = random.Random(f"{self._seed}/kv/{k}")
        names = [name for name, _ in KV_WEIGHTS]
        weights = [weight for _, weight in KV_WEIGHTS]
        known: dict[str, str | None] = {}  # the last value this client saw per key
        client, opened, backoff = self._new(k), time.monotonic(), BACKOFF_S
        try:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                if time.monotonic() - opened > self._lifetime:  # a restarted client
                    await client.close()
                    client, opened = self._new(k), time.monotonic()
                key, name = rng.choice(KEYS), rng.choices(names, weights)[0]
                record = await self._one(client, key, name, f"{client.client_id}.{n}", known)
                if record.outcome == "info":  # its operation stays open: a new process
                    await client.close()
                    client, opened = self._new(k), time.monotonic()
                if record.outcome == "ok":
                    backoff = BACKOFF_S
                    pause = self._pause * rng.uniform(0.5, 1.5)
                else:
                    pause, backoff = backoff, min(2 * backoff, BACKOFF_MAX_S)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), pause)
        finally:
            await client.close()

    async def _one(self, client: Client, key: str, name: str, value: str,
                   known: dict[str, str | None]) -> Record:
        record = Record(client.client_id, "read", key, None, now_us())
        self.records.append(record)

        async def operation() -> None:
            if name == "put":
                record.f, record.input = "write", value
                await client.execute(kv_put(key, value), [key], blind=True)
                known[key] = value
            elif name == "cas":
                expected = known.get(key)
                record.f, record.input = "cas", (expected, value)
                reply = await client.execute(kv_cas(key, expected, value), [key])
                _, swapped, before = msgpack.unpackb(reply.payload)
                record.output, record.before = bool(swapped), before
                known[key] = value if swapped else before
            else:
                reply = await client.read(kv_get(key), [key])
                record.output = msgpack.unpackb(reply.payload)[1]
                known[key] = record.output

        return await _recorded(record, operation())


#: the processes of one-shot writes in the history: one each, numbered from here
ONE_SHOT_BASE = 1 << 42


class OneShotWriter:
    """The command line's one-shot writes, one every ``every_s`` (see the module)."""

    def __init__(self, mode: Literal["subprocess", "in-process"], every_s: float, *,
                 kv_config: Path, kv_addresses: Callable[[], list[tuple[str, int]]],
                 gpu_config: Path, vc: str, seed: int, records: list[Record],
                 acked: AckedAllocations, clock: Callable[[], float]) -> None:
        self.mode, self._every = mode, every_s
        self._kv_config, self._kv_addresses = kv_config, kv_addresses
        self._gpu_config, self._vc = gpu_config, vc
        self._rng = random.Random(f"{seed}/one-shot")
        self.records, self.acked, self._clock = records, acked, clock
        self.latencies: list[Latency] = []
        self.counts = dict.fromkeys(("put", "ctl_submit", "ctl_release", "ok", "fail",
                                     "info"), 0)
        self.stop = asyncio.Event()

    async def run(self) -> None:
        began = time.monotonic()
        pending = ""  # the one-shot gang placed last, to release next
        for n in itertools.count():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(),
                                       max(0.0, began + n * self._every - time.monotonic()))
            if self.stop.is_set():
                return
            if n % CTL_EVERY == CTL_EVERY - 1:
                pending = await (self._ctl_release(pending) if pending
                                 else self._ctl_submit(f"oneshot-{n}"))
            else:
                await self._put(n)

    def _count(self, outcome: Outcome) -> None:
        self.counts[outcome] += 1

    async def _put(self, n: int) -> None:
        key, value = self._rng.choice(KEYS), f"oneshot.{n}"
        record = Record(ONE_SHOT_BASE + n, "write", key, value, now_us())
        self.records.append(record)
        began = time.monotonic()
        if self.mode == "subprocess":
            result = await run_tool(["put", key, value, "--config", str(self._kv_config),
                                     "--timeout", str(ONE_SHOT_TIMEOUT_S)], ONE_SHOT_LIMIT_S)
            outcome = record.outcome = _outcome(result.code)
            if outcome != "ok":
                record.error = result.stderr.strip()[-300:] or f"exit {result.code}"
            record.ret_us = now_us()
        else:  # what ``sdpaxos put`` does, without the process: a one-shot session
            addresses = self._kv_addresses()
            async with Client(new_client_id(), addresses, timeout_s=ONE_SHOT_TIMEOUT_S,
                              attempts=len(addresses)) as client:
                await _recorded(record, client.execute(kv_put(key, value), (key,), last=True))
            outcome = record.outcome or "info"
        self.counts["put"] += 1
        self._count(outcome)
        self.latencies.append((self._clock(), "put", time.monotonic() - began))

    async def _ctl(self, *words: str) -> tuple[Outcome, dict[str, Any]]:
        if self.mode == "in-process":
            return await self._ctl_in_process(*words)
        result = await run_tool(["ctl", "--config", str(self._gpu_config), "--json",
                                 "--timeout", str(REQUEST_TIMEOUT_S), *words], ONE_SHOT_LIMIT_S)
        outcome = _outcome(result.code)
        self._count(outcome)
        doc: dict[str, Any] = {}
        if outcome == "ok":
            with contextlib.suppress(ValueError):
                doc = json.loads(result.stdout)
        return outcome, doc

    async def _ctl_in_process(self, *words: str) -> tuple[Outcome, dict[str, Any]]:
        """The ctl verb's effect over the native port: a one-shot session of its own per call
        (``one_shot_seq``, as ``ctl`` sends over gRPC)."""
        from consensus.runtime.cluster_config import load_cluster_config
        from consensus.sessions import one_shot_seq

        addresses = [s.client_address for s in load_cluster_config(self._gpu_config).replicas]
        verb, name = words[0], words[1]
        async with AllocationStore.connect(addresses, timeout_s=REQUEST_TIMEOUT_S,
                                           attempts=len(addresses)) as store:
            try:
                if verb == "submit":
                    result = await store.submit(GroupSpec(name=name, vc=self._vc,
                                                           priority=PRIORITY,
                                                           members=(Member(1, 1),)),
                                                seq=one_shot_seq())
                    doc = {"token": result.token} if isinstance(result, Placed) else {}
                    outcome: Outcome = "ok" if doc else "fail"
                else:
                    await store.release(name, seq=one_shot_seq())
                    outcome, doc = "ok", {}
            except DefiniteFailure:
                outcome, doc = "fail", {}
            except (SDPaxosError, ClusterStateError, OSError):
                outcome, doc = "info", {}
        self._count(outcome)
        return outcome, doc

    async def _ctl_submit(self, name: str) -> str:
        """Submit a one-GPU gang; its name if placed (to release next), else ""."""
        began = time.monotonic()
        outcome, doc = await self._ctl("submit", name, "--vc", self._vc,
                                       "--priority", str(PRIORITY), "--pods", "1x1")
        self.latencies.append((self._clock(), "ctl submit", time.monotonic() - began))
        self.counts["ctl_submit"] += 1
        if outcome == "ok" and "token" in doc:
            self.acked.placed(name, int(doc["token"]))
            return name
        if outcome == "info":
            self.acked.uncertain.add(name)
            return name  # maybe placed: released next
        return ""

    async def _ctl_release(self, name: str) -> str:
        """Release the gang ``name``; "" (the next one-shot gang may be submitted)."""
        began = time.monotonic()
        outcome, _ = await self._ctl("release", name)
        self.latencies.append((self._clock(), "ctl release", time.monotonic() - began))
        self.counts["ctl_release"] += 1
        if outcome == "ok":
            self.acked.released.add(name)
        elif outcome == "info":
            self.acked.uncertain.add(name)
        return ""  # a definite failure changed nothing: the gang stays, expected at the end


async def _recorded(record: Record, operation: Awaitable[Any]) -> Record:
    """``record`` completed with what running ``operation`` told its client: ok, a definite
    failure (``fail``) or an indefinite one (``info``)."""
    try:
        await operation
        record.outcome = "ok"
    except DefiniteFailure as exc:
        record.outcome, record.error = "fail", str(exc)
    except (SDPaxosError, OSError) as exc:
        record.outcome, record.error = "info", str(exc) or type(exc).__name__
    record.ret_us = now_us()
    return record


def _outcome(code: int | None) -> Outcome:
    """A command-line verb's exit status as an outcome (see the module)."""
    return "ok" if code == 0 else "fail" if code == 1 else "info"
