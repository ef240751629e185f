"""Client sessions: exactly-once effects for retried requests, in bounded replicated state.

A client names every request ``(client_id, seq)``; a retry, possibly at another replica,
carries the same pair. ``SessionTable``, part of a state machine's replicated state, applies a
request the first time it reaches the log and answers a later copy with the first result.
Copies of one request can reach the log far apart (a client's retry at another replica while
the first copy waits in a partitioned replica's instance, recovered minutes later), so a
table that forgets a session must still tell "a session it never saw" from "a session it
forgot": that is what a session's *open-by time* is for. The semantics, as etcd documents its
leases:

Sessions
--------
* **A session is a client id and an open-by time** ``T`` (Unix seconds), both chosen by the
  client, ``T`` a little ahead of its clock (``OPEN_WINDOW_S``). Every request of the session
  carries ``T`` in the high bits of its sequence number (``session_seq``): bits 29..62 hold
  ``T``, bit 28 is the ``LAST`` flag, bits 0..27 count the session's requests. The same
  client id with another ``T`` is another session.
* **Opening.** The table opens a session when the first of its requests executes, and only
  if the log time is still before ``T``. A request of a session the table does not hold
  when the log time has reached ``T`` fails with ``SessionExpired``: definite, it is not
  applied, now or later.
* **Exactly once.** While the table holds a session, a request of it runs the first time it
  executes; a copy answers the first result (the last ``SESSION_WINDOW`` results are kept per
  session; an older request answers ``EXPIRED``: it ran, its result is forgotten).
* **Eviction** happens only at *log-time commands* (below), identically on every replica:
  the table evicts every session idle for ``SessionLimits.idle_ttl_s`` of log time, every
  closed session whose ``T`` has passed, then, if a principal of a TLS cluster holds more
  than ``max_per_principal`` sessions, its least recently used ones, and if more than
  ``max_sessions`` are open, the least recently used of all (by last log time used, then
  key: the same whatever order a partial-order core ran one interval's commands in). Between
  two log-time commands the table may exceed a cap by the sessions opened meanwhile (a
  replica proposes one at once, ``time_due``); commands without a principal count toward the
  total only.
* **Never twice.** A session evicted before its ``T`` leaves a tombstone until the log time
  reaches ``T``; after that the open-by rule refuses it. So an evicted session is never
  opened again, and none of its requests is applied a second time: a copy that arrives later
  fails with ``SessionExpired``. What a client learns from ``SessionExpired`` for a request
  it had sent before without an answer is therefore only that it will not run *from now on*;
  the native client reports that as an ``IndefiniteFailure``.
* **Closing.** A request with the ``LAST`` flag closes its session once it ran: a later
  request of it fails with ``SessionExpired``, a copy of one that ran still gets its
  result, and the session is dropped once the log time passes ``T``. A one-shot client (the
  CLI verbs) sends one request, flagged ``LAST``: exactly once, and nothing left behind a
  ``T`` later.
* **Log time** advances only through the log: a replica whose clock is ``time_step_s``
  ahead of the log time, while sessions were active or something is due
  (``SessionTable.time_due``), proposes a log-time command (``log_time_command``) carrying
  its clock; applying it moves the log time towards it, by ``max_step_s`` at most (the first
  one sets it). Nothing in ``apply`` reads a clock. Log time never goes back. A replica clock
  ahead of the others makes idle sessions expire early (keep replicas' clocks in sync, as
  etcd's leases need of their leader's); a client whose clock is behind the log time by more
  than its window learns the log time from ``SessionExpired`` and opens its next session
  from it.
* **Sessions without an open-by time** (``T`` = 0: a sequence number below ``1 << 29``) are
  *pinned*: what every session was before this build — opened by any request, never evicted,
  in no cap. They keep old logs and snapshots, clients of earlier builds and callers that
  number their own requests from 0 exact. Every client of this build opens sessions with
  an open-by time.
* **Settling.** A request ``CANCEL_OP`` under a request's own ``(client_id, seq)`` is a copy
  of it like any other (issue 39): if the request ran, the cancel answers its first result;
  if not, ``CANCELLED`` is recorded as its result, so no later copy is ever applied. The
  result of a request that the authorization check refused as it applied is remembered too
  (``denied_result``), so a later copy is refused as well. Both marks start with
  ``SESSION_MARK``: the driver answers them as failures, never as results.
* **Blind writes** (acknowledged when ready, before they execute) are exact only in a pinned
  session: a request of a session that may be evicted may still fail at execution, so a
  replica answers it after it executed (``blind`` is dropped at the client port).

The table's snapshot state (``to_state``) is versioned (``STATE_FORMAT``); the state of
earlier builds (a list of ``[client, floor, results]``) loads as pinned sessions.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from consensus.messages import Command

__all__ = [
    "CANCELLED",
    "CANCEL_OP",
    "COUNTER_LIMIT",
    "EXPIRED",
    "FORGET_EVICTED",
    "LAST",
    "LOG_TIME_CLIENT",
    "LOG_TIME_MAGIC",
    "LOG_TIME_STAGGERS",
    "OPEN_BY_SHIFT",
    "OPEN_WINDOW_S",
    "SESSION_EXPIRED",
    "SESSION_MARK",
    "SESSION_WINDOW",
    "STATE_FORMAT",
    "SessionLimits",
    "SessionNumbers",
    "SessionTable",
    "denied_reason",
    "denied_result",
    "is_log_time_op",
    "log_time_command",
    "one_shot_seq",
    "open_by_of",
    "session_seq",
]

#: How many recent results a session keeps per client. A pipelining client must not have more
#: outstanding requests than this.
SESSION_WINDOW: Final = 256

#: The result of a request older than everything its session still remembers: it was applied
#: (the client has moved past it), but its result is gone.
EXPIRED: Final[bytes] = msgpack.packb(["expired"])

#: What the table answers a request whose session it does not hold and will not open (evicted,
#: closed, or its open-by time passed): the request is not applied, now or later. A state
#: machine returns this very object; the driver tells the client ``SessionExpired``.
SESSION_EXPIRED: Final[bytes] = msgpack.packb(["session-expired"])

#: The op of a cancel (the module header's "Settling"); ``0xc1`` is never the first byte of
#: msgpack, so no state machine's op looks like it.
CANCEL_OP: Final = b"\xc1sdpaxos-cancel"
#: The first bytes of every result the session table itself gives a request that never
#: executed (never a state machine's: ``0xc1`` is never the first byte of msgpack).
SESSION_MARK: Final = b"\xc1sdpaxos-session:"
#: The result of a request cancelled before it executed: it never took effect, and never will.
CANCELLED: Final = SESSION_MARK + b"cancelled"
_DENIED: Final = SESSION_MARK + b"denied:"


def denied_result(reason: str) -> bytes:
    """What a session remembers of a request the authorization check refused as it applied."""
    return _DENIED + reason.encode()


def denied_reason(result: bytes) -> str | None:
    """The reason of a remembered refusal (``denied_result``), or None."""
    if result.startswith(_DENIED):
        return result[len(_DENIED):].decode(errors="replace")
    return None


#: a sequence number's bits: the session's open-by time above ``OPEN_BY_SHIFT``, then the
#: ``LAST`` flag, then the request counter
OPEN_BY_SHIFT: Final = 29
LAST: Final = 1 << 28
#: requests one session numbers (then the client opens another)
COUNTER_LIMIT: Final = LAST
#: open-by times fit in the sequence number's 34 high bits (Unix seconds until 2514)
OPEN_BY_LIMIT: Final = 1 << (63 - OPEN_BY_SHIFT)

#: how far ahead of its clock a client sets a session's open-by time (seconds): its first
#: request must execute within it, and the clock of its machine may be behind the replicas'
#: by up to about this much
OPEN_WINDOW_S: Final = 120

#: the client id of log-time commands (no client's: the node refuses ops that start with the
#: magic from clients)
LOG_TIME_CLIENT: Final = 0
#: a log-time command's op: this, then the proposer's clock (Unix seconds, 8 bytes big-endian).
#: 0xC1 is never produced by msgpack, so no state machine's op starts like it.
LOG_TIME_MAGIC: Final = b"\xc1sdpaxos-log-time\x00"
_LOG_TIME_OP_LEN: Final = len(LOG_TIME_MAGIC) + 8
#: replicas propose log-time commands one after the other: replica ``i`` once its clock is
#: ``i % LOG_TIME_STAGGERS`` units later than the first one's would be
LOG_TIME_STAGGERS: Final = 4

#: the broken variant of ``SessionTable`` (``unsafe``) the simulator's teeth test runs
FORGET_EVICTED: Final = "sessions_forget_evicted"

#: the version of ``to_state``'s layout (earlier builds wrote a bare list of sessions)
STATE_FORMAT: Final = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionLimits:
    """The bounds of a session table (the same on every replica: they decide evictions).

    Times are in log-time units, seconds for a replica (the simulator's are its own)."""

    #: sessions with an open-by time the table holds at most (the least recently used goes)
    max_sessions: int = 50_000
    #: of them, at most this many per principal of a TLS cluster
    max_per_principal: int = 5_000
    #: a session idle this long is evicted at the next log-time command
    idle_ttl_s: int = 600
    #: how stale the log time may get while sessions are active (``SessionTable.time_due``)
    time_step_s: int = 10
    #: the most one log-time command moves the log time (after the first, which sets it): a
    #: replica whose clock runs far ahead cannot expire every session at once
    max_step_s: int = 60

    def __post_init__(self) -> None:
        if min(self.max_sessions, self.max_per_principal, self.idle_ttl_s,
               self.time_step_s, self.max_step_s) < 1:
            raise ValueError(f"session limits must be positive: {self}")


def open_by_of(seq: int) -> int:
    """The open-by time a sequence number carries (0: a pinned session's)."""
    return seq >> OPEN_BY_SHIFT


def session_seq(open_by: int, counter: int, *, last: bool = False) -> int:
    """The sequence number of request ``counter`` of the session open until ``open_by``."""
    if not 0 <= open_by < OPEN_BY_LIMIT or not 0 <= counter < COUNTER_LIMIT:
        raise ValueError(f"no sequence number for open-by {open_by}, request {counter}")
    return open_by << OPEN_BY_SHIFT | (LAST if last else 0) | counter


def one_shot_seq(window_s: int = OPEN_WINDOW_S) -> int:
    """The sequence number of a one-shot session's only request (it closes the session):
    what a client that sends one update and exits uses, with a fresh client id."""
    return session_seq(int(time.time()) + window_s, 0, last=True)


def log_time_command(seconds: int) -> Command:
    """The command a replica proposes to move the log time to ``seconds``."""
    return Command(client_id=LOG_TIME_CLIENT, seq=seconds,
                   op=LOG_TIME_MAGIC + seconds.to_bytes(8, "big"), keys=())


def is_log_time_op(op: bytes) -> bool:
    """Whether ``op`` is reserved for log-time commands (refused from clients)."""
    return op.startswith(LOG_TIME_MAGIC)


class SessionNumbers:
    """A client's side of a session: its open-by time and its next sequence numbers.

    ``renew`` starts another session under the same client id (a later open-by time): after
    ``SessionExpired`` for a request that never executed, or when the counter runs out."""

    __slots__ = ("_counter", "_window_s", "open_by")

    def __init__(self, window_s: int = OPEN_WINDOW_S) -> None:
        self._window_s = window_s
        self.open_by = 0
        self._counter = 0
        self.renew()

    def renew(self, log_time: int = 0) -> None:
        """A new session: open-by the window after the clock or after ``log_time`` (the
        cluster's, from ``SessionExpired``: this machine's clock may be behind), and later
        than the last one."""
        start = max(int(time.time()), log_time)
        self.open_by = max(start + self._window_s, self.open_by + 1)
        self._counter = 0

    def next(self, *, last: bool = False) -> int:
        """The next request's sequence number (``last``: it closes the session, so the
        next one opens another)."""
        if self._counter >= COUNTER_LIMIT:
            self.renew()
        seq = session_seq(self.open_by, self._counter, last=last)
        self._counter = COUNTER_LIMIT if last else self._counter + 1
        return seq


class _Session:
    __slots__ = ("closed", "floor", "last_active", "open_by", "order", "principal", "results")

    def __init__(self, floor: int = -1, results: dict[int, bytes] | None = None, *,
                 open_by: int = 0, last_active: int = 0, principal: str = "",
                 closed: bool = False) -> None:
        self.floor = floor  # every seq <= floor has executed and its result is forgotten
        self.results: dict[int, bytes] = results or {}  # insertion order = execution order
        #: the keys of ``results`` in insertion order: the oldest found without walking the
        #: dict (whose evicted front ``next(iter(...))`` steps over, every time)
        self.order = deque(self.results)
        self.open_by = open_by
        self.last_active = last_active  # the log time of its last executed request
        self.principal = principal  # "" without one
        self.closed = closed


def _remember(session: _Session, seq: int, result: bytes) -> None:
    results = session.results
    if seq not in results:
        session.order.append(seq)
    results[seq] = result
    if len(results) > SESSION_WINDOW:
        oldest = session.order.popleft()
        del results[oldest]
        # Forget conservatively: a seq at or below the evicted one that is not remembered
        # counts as executed (clients number requests increasingly and keep fewer than
        # SESSION_WINDOW in flight, so it did).
        if oldest > session.floor:
            session.floor = oldest


#: a session's key in the table: its client id and open-by time
_KEY_SHIFT: Final = 63 - OPEN_BY_SHIFT


def _key(client_id: int, open_by: int) -> int:
    return client_id << _KEY_SHIFT | open_by


class SessionTable:
    """Per-session memory of recent results, so a retried request takes effect once, and the
    rules that bound it (the module header). A state machine calls ``admit`` before it runs a
    command (a result there is the command's answer) and ``record`` after; or ``run`` for a
    batch. ``principal``: set by the caller around ``admit``/``record`` to the name of the
    principal the command is applied for (a TLS cluster's), "" otherwise."""

    __slots__ = ("_active", "_closed", "_forget", "_gone", "_gone_at", "_over", "_pinned",
                 "_principals", "_sessions", "limits", "now", "principal")

    def __init__(
        self, limits: SessionLimits | None = None, *, unsafe: frozenset[str] = frozenset()
    ) -> None:
        """``unsafe``: test only, the broken variant ``FORGET_EVICTED`` (an evicted session is
        forgotten: no tombstone, no open-by rule), which the simulator must catch."""
        self.limits = limits if limits is not None else SessionLimits()
        self.principal = ""
        self._forget = FORGET_EVICTED in unsafe
        self._reset()

    def _reset(self) -> None:
        # (every attribute set here is the table's state: ``_STATE_SLOTS``; the others are
        # its settings, which ``take`` leaves alone)
        #: the log time (0 until the first log-time command)
        self.now = 0
        #: sessions with an open-by time, least recently used first (ordered by last_active)
        self._sessions: dict[int, _Session] = {}
        #: pinned sessions (no open-by time), by client id
        self._pinned: dict[int, _Session] = {}
        #: each named principal's session keys, least recently used first
        self._principals: dict[str, dict[int, None]] = {}
        #: closed sessions waiting for their open-by time: a heap of (open_by, key)
        self._closed: list[tuple[int, int]] = []
        #: tombstones: the keys of sessions evicted before their open-by time, and a heap of
        #: (open_by, key) to drop them once it passed
        self._gone: dict[int, int] = {}
        self._gone_at: list[tuple[int, int]] = []
        #: a session request executed since the last log-time command (a hint for
        #: ``time_due``; not replicated state)
        self._active = False
        #: more sessions are open than a cap allows (evicted at the next log-time command)
        self._over = False

    # ------------------------------------------------------------------ applying
    def admit(self, command: Command) -> bytes | None:
        """What ``command`` answers without running: a log-time command's answer (it moved
        the log time), a copy's first result, ``EXPIRED`` or ``SESSION_EXPIRED``; None: run
        it (then ``record`` its result)."""
        if command.client_id == LOG_TIME_CLIENT and command.op.startswith(LOG_TIME_MAGIC):
            return self._advance(command.op)
        answer = self.lookup(command.client_id, command.seq)
        if answer is None and command.op == CANCEL_OP:  # settled: it never runs from now on
            self.record(command.client_id, command.seq, CANCELLED)
            return CANCELLED
        return answer

    def lookup(self, client_id: int, seq: int) -> bytes | None:
        """The answer the table holds for ``(client_id, seq)``: its first result if it
        executed, ``EXPIRED`` if it executed and its result is forgotten,
        ``SESSION_EXPIRED`` if it will never execute; None if it may execute now. Changes
        nothing."""
        open_by = seq >> OPEN_BY_SHIFT
        if not open_by:
            pinned = self._pinned.get(client_id)
            if pinned is None:
                return None
            hit: bytes | None = pinned.results.get(seq)
            if hit is None and seq <= pinned.floor:
                return EXPIRED
            return hit
        key = client_id << _KEY_SHIFT | open_by
        session = self._sessions.get(key)
        if session is None:
            if (open_by <= self.now or key in self._gone) and not self._forget:
                return SESSION_EXPIRED
            return None
        hit = session.results.get(seq)
        if hit is None:
            if seq <= session.floor:
                return EXPIRED
            if session.closed:
                return SESSION_EXPIRED
        return hit

    def record(self, client_id: int, seq: int, result: bytes) -> None:
        """Remember ``result`` as the first result of ``(client_id, seq)``, which just ran
        (opening its session, which may evict others)."""
        open_by = seq >> OPEN_BY_SHIFT
        if not open_by:
            pinned = self._pinned.get(client_id)
            if pinned is None:
                pinned = self._pinned[client_id] = _Session()
            _remember(pinned, seq, result)
            return
        key = client_id << _KEY_SHIFT | open_by
        session = self._sessions.get(key)
        if session is None:
            session = self._open(key, open_by)
        elif session.last_active < self.now:
            self._touch(key, session)
        _remember(session, seq, result)
        self._active = True
        if seq & LAST and not session.closed:
            session.closed = True
            heapq.heappush(self._closed, (open_by, key))

    def run(
        self, commands: Sequence[Command], execute: Callable[[bytes], bytes]
    ) -> list[bytes]:
        """For each command in turn, what ``admit`` answers, else ``execute(op)``,
        recorded: what ``admit``/``record`` around each command give, for less."""
        results: list[bytes] = []
        append = results.append
        pinned, sessions = self._pinned, self._sessions
        for command in commands:
            client_id, seq, op, _keys, _blind = command
            open_by = seq >> OPEN_BY_SHIFT
            if client_id == LOG_TIME_CLIENT:
                pass  # (the log time's own, or a request of client 0: ``admit`` below)
            elif not open_by:
                # a pinned session: the old table's path, kept as short
                session = pinned.get(client_id)
                if session is None:
                    session = pinned[client_id] = _Session()
                result = session.results.get(seq)
                if result is None:
                    if seq <= session.floor:
                        result = EXPIRED
                    else:
                        result = CANCELLED if op == CANCEL_OP else execute(op)
                        _remember(session, seq, result)
                append(result)
                continue
            else:
                # an open session's request: ``lookup`` and ``record`` inline (a session
                # not open yet, and a cancel, take ``admit`` below)
                key = client_id << _KEY_SHIFT | open_by
                session = sessions.get(key)
                if session is not None and op != CANCEL_OP:
                    result = session.results.get(seq)
                    if result is None:
                        if seq <= session.floor:
                            result = EXPIRED
                        elif session.closed:
                            result = SESSION_EXPIRED
                        else:
                            result = execute(op)
                            if session.last_active < self.now:
                                self._touch(key, session)
                            _remember(session, seq, result)
                            self._active = True
                            if seq & LAST:
                                session.closed = True
                                heapq.heappush(self._closed, (open_by, key))
                    append(result)
                    continue
            answer = self.admit(command)
            if answer is None:
                answer = execute(op)
                self.record(client_id, seq, answer)
            append(answer)
        return results

    # ------------------------------------------------------------------ bounds
    def _open(self, key: int, open_by: int) -> _Session:
        principal = self.principal
        session = self._sessions[key] = _Session(open_by=open_by, last_active=self.now,
                                                 principal=principal)
        if len(self._sessions) > self.limits.max_sessions:
            self._over = True
        if principal:
            own = self._principals.setdefault(principal, {})
            own[key] = None
            if len(own) > self.limits.max_per_principal:
                self._over = True
        return session

    def _enforce(self, queue: dict[int, None] | dict[int, _Session], cap: int) -> None:
        """Evict the least recently used sessions of ``queue`` (keys in ``last_active``
        order) down to ``cap``: by (last_active, key), so that the order commands of one
        log-time interval ran in does not matter (a partial-order core runs independent
        ones in different orders on different replicas)."""
        excess = len(queue) - cap
        if excess <= 0:
            return
        sessions = self._sessions
        candidates: list[int] = []
        for key in queue:  # the excess, and the rest of the last one's log time
            if len(candidates) >= excess and (
                    sessions[key].last_active != sessions[candidates[-1]].last_active):
                break
            candidates.append(key)
        candidates.sort(key=lambda key: (sessions[key].last_active, key))
        for key in candidates[:excess]:
            self._evict(key)

    def _touch(self, key: int, session: _Session) -> None:
        """``session`` ran a request at a later log time: to the back of the queues."""
        session.last_active = self.now
        del self._sessions[key]
        self._sessions[key] = session
        if session.principal:
            own = self._principals[session.principal]
            del own[key]
            own[key] = None

    def _evict(self, key: int) -> None:
        session = self._sessions.pop(key)
        if session.principal:
            own = self._principals[session.principal]
            del own[key]
            if not own:
                del self._principals[session.principal]
        if session.open_by > self.now and not self._forget:  # it could still be opened:
            self._gone[key] = session.open_by  # remember it is gone
            heapq.heappush(self._gone_at, (session.open_by, key))

    def _advance(self, op: bytes) -> bytes:
        """A log-time command: the log time moves to its clock if that is later; what is due
        then is evicted."""
        sessions = self._sessions
        if len(op) == _LOG_TIME_OP_LEN:
            clock = int.from_bytes(op[len(LOG_TIME_MAGIC):], "big")
            if not self.now:  # the first: the sessions opened so far were active until now
                self.now = clock
                for session in sessions.values():
                    session.last_active = clock
            elif clock > self.now:
                self.now = min(clock, self.now + self.limits.max_step_s)
        now = self.now
        expiry = now - self.limits.idle_ttl_s
        while sessions:
            key = next(iter(sessions))
            if sessions[key].last_active > expiry:
                break
            self._evict(key)
        closed = self._closed
        while closed and closed[0][0] <= now:
            _, key = heapq.heappop(closed)
            if key in sessions:  # (unless evicted meanwhile)
                self._evict(key)
        gone_at = self._gone_at
        while gone_at and gone_at[0][0] <= now:
            _, key = heapq.heappop(gone_at)
            self._gone.pop(key, None)
        if self._over:  # each principal's own first, then all of them
            for own in list(self._principals.values()):
                self._enforce(own, self.limits.max_per_principal)
            self._enforce(sessions, self.limits.max_sessions)
            self._over = False
        self._active = False
        answer: bytes = msgpack.packb(["log-time", now])
        return answer

    def time_due(self, clock: int) -> bool:
        """Whether a replica whose clock reads ``clock`` (log-time units) should propose a
        log-time command: the log time is ``time_step_s`` behind it, and sessions were active
        since the last one (their idle time is measured in log time) or an eviction is due."""
        if self._over:
            return True
        if clock < self.now + self.limits.time_step_s:
            return False
        if self._active:
            return True
        due = []
        if self._sessions:
            due.append(next(iter(self._sessions.values())).last_active + self.limits.idle_ttl_s)
        if self._closed:
            due.append(self._closed[0][0])
        if self._gone_at:
            due.append(self._gone_at[0][0])
        return bool(due) and min(due) <= clock

    def take(self, other: SessionTable) -> list[object]:
        """Hold what ``other`` holds, in place of this table's contents (a state loaded
        elsewhere, off the replica's loop, adopted by the table its machine's users hold);
        returns the contents replaced."""
        replaced = [getattr(self, name) for name in _STATE_SLOTS]
        for name in _STATE_SLOTS:
            setattr(self, name, getattr(other, name))
        return replaced

    # ------------------------------------------------------------------ inspection
    def __len__(self) -> int:
        """Sessions held (pinned ones included; tombstones are not sessions)."""
        return len(self._sessions) + len(self._pinned)

    def counts(self) -> dict[str, int]:
        """What the table holds: open and closed sessions with an open-by time, pinned
        sessions, tombstones."""
        closed = sum(1 for s in self._sessions.values() if s.closed)
        return {"open": len(self._sessions) - closed, "closed": closed,
                "pinned": len(self._pinned), "tombstones": len(self._gone)}

    # ------------------------------------------------------------------ snapshots
    def to_state(self) -> list[Any]:
        """``[STATE_FORMAT, now, pinned, sessions, tombstones]``: pinned sessions by client
        id, the others least recently used first (their order decides evictions), tombstones
        by (open-by, key). Plain lists of the (immutable) results, canonical."""
        return [
            STATE_FORMAT,
            self.now,
            [[client, s.floor, list(s.results.items())]
             for client, s in sorted(self._pinned.items())],
            [[key >> _KEY_SHIFT, s.open_by, s.floor, list(s.results.items()), s.last_active,
              s.principal, s.closed]
             for key, s in sorted(self._sessions.items(),
                                  key=lambda item: (item[1].last_active, item[0]))],
            sorted([open_by, key] for key, open_by in self._gone.items()),
        ]

    def load_state(self, state: list[Any]) -> None:
        """Replace the table with ``to_state``'s (or an earlier build's) state."""
        self._reset()
        if state and isinstance(state[0], int):
            if state[0] != STATE_FORMAT:
                raise ValueError(f"session table format {state[0]!r}, this build reads "
                                 f"{STATE_FORMAT}")
            _, now, pinned, sessions, gone = state
            self.now = int(now)
            for client, open_by, floor, items, last_active, principal, closed in sessions:
                key = _key(int(client), int(open_by))
                session = self._sessions[key] = _Session(
                    int(floor), {int(seq): bytes(result) for seq, result in items},
                    open_by=int(open_by), last_active=int(last_active),
                    principal=str(principal), closed=bool(closed))
                if session.principal:
                    self._principals.setdefault(session.principal, {})[key] = None
                if session.closed:
                    self._closed.append((session.open_by, key))
            heapq.heapify(self._closed)
            limits = self.limits
            self._over = len(self._sessions) > limits.max_sessions or any(
                len(own) > limits.max_per_principal for own in self._principals.values())
            for open_by, key in gone:
                self._gone[int(key)] = int(open_by)
                self._gone_at.append((int(open_by), int(key)))
            heapq.heapify(self._gone_at)
        else:  # an earlier build's: [[client, floor, results], ...], every session pinned
            pinned = state
        for client, floor, items in pinned:
            self._pinned[int(client)] = _Session(
                int(floor), {int(seq): bytes(result) for seq, result in items})


#: the attributes of a ``SessionTable`` that hold its state (``_reset`` sets them), not its
#: settings (``limits``, the broken variant, the principal being applied for)
_STATE_SLOTS: Final = ("_active", "_closed", "_gone", "_gone_at", "_over", "_pinned",
                       "_principals", "_sessions", "now")

